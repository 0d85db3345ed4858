"""Measurement around the runtime: what the simulator is fed and how well it predicts.

`machine` (the local machine as a cluster: the loopback link measured by ping-pong), `insitu`
(costs calibrated by a launch of the runtime itself; ranks sharing a CPU's cores are modelled in
`octopipe.sim.core_sharing`),
`fidelity` (measured against simulated), `memory` (each layer's bytes as the runtime keeps them;
measured against simulated memory per rank), and the benchmarks under `bench/`
(`python -m octopipe.measure.bench.<fidelity|peer|gpu>`). Every launch here is a `runtime.Job`.
"""
