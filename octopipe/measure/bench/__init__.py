"""Measurement benchmarks: `python -m octopipe.measure.bench.fidelity` (simulated vs measured),
`python -m octopipe.measure.bench.peer` (against torch.distributed.pipelining) and, on a CUDA
machine, `python -m octopipe.measure.bench.gpu`. Results go to runs/bench/."""
