"""Runtime benchmarks: `python -m octopipe.runtime.bench.fidelity` (simulated vs measured) and
`python -m octopipe.runtime.bench.peer` (against torch.distributed.pipelining). Results go to
runs/bench/."""
