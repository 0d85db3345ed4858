"""Costs of layers on devices: the CostTable value and the models that fill it (analytic,
profile file, profiled on this machine). `octopipe.load.load_costs` picks one by cost.source."""
