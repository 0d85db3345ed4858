"""Benchmark: actions simulated per second, and the same lowered schedule in torch's simulator.

`python -m octopipe.sim.bench [--quick] [--out runs/bench]` times

1. growing 1F1B tables (8 → 64 devices, 16 → 1024 micro-batches) on a CostTable and a Cluster
   (durations, transfers with contention, memory), counting the table's lowered actions
   (compute + SEND + RECV) per second of engine time, compile + bind time (median of cold builds)
   reported apart with its own log-log slope;
2. torch.distributed.pipelining's `_simulate_comms_compute` and OctoPipe's strict engine on the
   same lowered interleaved schedule (16 devices, 2 chunks, 64 micro-batches), and their ratio.

Results go to `<out>/bench.json`.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.schedule.generators import interleaved, one_f_one_b
from octopipe.schedule.lower import lower
from octopipe.sim.simulator import Simulator, compile_cached


def _cluster(n: int) -> Cluster:
    link = Link("nvlink", 450e9, 2e-6)
    return Cluster("bench", (DeviceKind("h100", 989e12, 80 * 2**30, 3.35e12),), (0,) * n,
                   tuple(r // 8 for r in range(n)), link, Link("ib", 50e9, 5e-6))


def _cost(n_stages: int) -> CostTable:
    cost = CostTable.uniform(n_stages, f=1e-3, i=1e-3, w=1e-3, act_bytes=2**28, static_bytes=2**30,
                             out_bytes=2**25, kinds=("h100",))
    return cost


def _best_of(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls (the best would flatter small, cache-resident tables)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def n_lowered_actions(sim: Simulator) -> int:
    return sim.program.n_compute + 2 * sim.program.n_transfers


def scaling(devices: list[int], microbatches: list[int], repeat: int) -> list[dict]:
    rows = []
    for p in devices:
        for m in microbatches:
            if m < p:
                continue
            table, cost, cluster = one_f_one_b(p, m), _cost(p), _cluster(p)

            def build() -> Simulator:
                compile_cached.cache_clear()
                return Simulator(table, cost, cluster)
            compile_s = _best_of(build, repeat)
            sim = build()
            run_s = _best_of(lambda: sim.run(), repeat)
            n = n_lowered_actions(sim)
            rows.append({"devices": p, "microbatches": m, "actions": n, "compile_s": compile_s,
                         "run_s": run_s, "actions_per_s": n / run_s, "us_per_action": 1e6 * run_s / n})
            print(f"  1f1b p={p:3d} m={m:5d}: {n:8d} actions  run {run_s * 1e3:9.2f} ms  "
                  f"{n / run_s:12,.0f} actions/s  {1e6 * run_s / n:5.2f} us/action  "
                  f"(compile {compile_s * 1e3:.0f} ms)")
    return rows


def versus_torch(p: int, chunks: int, m: int, repeat: int) -> dict:
    from torch.distributed.pipelining.schedules import _Action, _simulate_comms_compute  # heavy: only here
    table = lower(interleaved(p, m, chunks))
    order = {d: [_Action.from_str(str(a)) for a in table.actions(d)] for d in range(p)}
    n_stages = table.n_stages
    placement = table.placement
    torch_s = _best_of(lambda: _simulate_comms_compute({d: list(r) for d, r in order.items()},
                                                       lambda s: placement[s], n_stages), repeat)
    cost, cluster = _cost(n_stages), _cluster(p)
    sim = Simulator(table, cost, cluster)
    ours_s = _best_of(lambda: sim.run(), repeat)
    def cold() -> None:
        compile_cached.cache_clear()
        Simulator(table, cost, cluster).run()
    cold_s = _best_of(cold, repeat)
    n = sum(len(table.actions(d)) for d in range(p))
    assert n == n_lowered_actions(sim)
    out = {"devices": p, "chunks": chunks, "microbatches": m, "actions": n,
           "torch_s": torch_s, "octopipe_s": ours_s, "torch_actions_per_s": n / torch_s,
           "octopipe_actions_per_s": n / ours_s, "speedup": torch_s / ours_s,
           "octopipe_with_compile_s": cold_s, "speedup_with_compile": torch_s / cold_s}
    print(f"  interleaved p={p} chunks={chunks} m={m}: {n} actions; torch _simulate_comms_compute "
          f"{torch_s * 1e3:.1f} ms ({n / torch_s:,.0f}/s), OctoPipe {ours_s * 1e3:.1f} ms "
          f"({n / ours_s:,.0f}/s): {torch_s / ours_s:.1f}x; counting the one-time compile of the "
          f"table, OctoPipe {cold_s * 1e3:.1f} ms: {torch_s / cold_s:.1f}x")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    devices = [8, 16] if args.quick else [8, 16, 32, 64]
    mbs = [16, 64] if args.quick else [16, 64, 256, 1024]
    print("OctoPipe simulator throughput (strict, eager, durations + transfers + memory):")
    rows = scaling(devices, mbs, args.repeat)
    big = [r for r in rows if r["actions"] >= 10000] or rows
    slope = float(np.polyfit(np.log([r["actions"] for r in big]), np.log([r["run_s"] for r in big]), 1)[0])
    print(f"  log-log slope of run time vs actions (tables >= 10k actions): {slope:.2f} (1.0 = linear; "
          "the engine does a constant number of heap operations per action, the rest is caches)")
    c_slope = float(np.polyfit(np.log([r["actions"] for r in big]), np.log([r["compile_s"] for r in big]), 1)[0])
    print(f"  log-log slope of compile + bind time vs actions: {c_slope:.2f}")
    print("Side by side with torch on the same lowered schedule:")
    vs = versus_torch(16, 2, 16 if args.quick else 64, args.repeat)
    doc = {"scaling": rows, "loglog_slope": slope, "compile_loglog_slope": c_slope, "versus_torch": vs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {out / 'bench.json'}")
    return doc


if __name__ == "__main__":
    main()
