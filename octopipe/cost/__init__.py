"""Costs of layers on devices: the CostTable value and the models that fill it (analytic,
profile file, profiled on this machine). `octopipe.cost.sources.cost_table` picks one by cost.source."""
