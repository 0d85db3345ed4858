"""The runtime's speed and overhead beside the simulator: seconds per iteration, the cost of one
dispatch decision, a message's send-to-arrival time and the ranks' idle share, at 2, 4 and 8
ranks, strict and ready_first dispatch, real and emulated compute.

Each setting is one `python -m octopipe.run mode=execute` (its defaults otherwise: tiny_hybrid,
1F1B; 8 micro-batches at 2 and 4 ranks, 16 at 8) in its own process and result directory under
`--out`; the figures are read back from its summary.json (`rank_time`, see docs/runtime.md).
With `--rounds` above 1 the settings alternate round by round and each figure is the median over
rounds, so the load other work puts on the machine falls on every setting alike.

    python -m octopipe.measure.bench.runtime [--ranks 2 4 8] [--rounds 1] [--quick]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from octopipe.io import write_json

COLUMNS = ("ranks", "dispatch", "compute", "measured_s", "simulated_s", "error", "dispatch_us",
           "transport_us", "idle_share", "waiting_share", "cpu_beyond_compute_s")


def overrides(ranks: int, dispatch: str, compute: str) -> list[str]:
    """mode=execute's overrides for one setting."""
    return ["mode=execute", f"pp={ranks}", f"microbatches={8 if ranks < 8 else 16}",
            f"runtime.dispatch={dispatch}", f"runtime.compute={compute}"]


def row_of(summary: dict, setting: tuple[int, str, str]) -> dict:
    """One setting's figures from its summary.json: the iteration measured and simulated, the
    fidelity error and the first schedule's `rank_time` (waiting share: waiting / span, mean
    over ranks; CPU beyond compute: the largest over ranks)."""
    rt = next(iter(summary["schedules"].values()))["rank_time"]
    ranks = rt["ranks"]
    cpu = [r["cpu_beyond_compute_s"] for r in ranks if r["cpu_beyond_compute_s"] is not None]
    return dict(zip(COLUMNS[:3], setting),
                measured_s=summary["measured_iteration_s"], simulated_s=summary["simulated_iteration_s"],
                error=summary["fidelity_error"], dispatch_us=rt["dispatch_us"],
                transport_us=rt["transport_us"], idle_share=rt["idle_share"],
                waiting_share=float(np.mean([r["waiting_s"] / r["span_s"] for r in ranks])),
                cpu_beyond_compute_s=max(cpu) if cpu else None)


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per setting the median of each figure over rounds (None where a round has none)."""
    out = []
    for same in zip(*rounds):
        row = {k: same[0][k] for k in COLUMNS[:3]}
        for k in COLUMNS[3:]:
            vals = [r[k] for r in same if r[k] is not None]
            row[k] = float(np.median(vals)) if vals else None
        out.append(row)
    return out


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table (seconds to 4 places, shares and errors as percentages)."""
    def cell(k: str, v) -> str:
        if v is None:
            return "-"
        if k in ("error", "idle_share", "waiting_share"):
            return f"{100 * v:.1f}%"
        if k.endswith("_us"):
            return f"{v:.0f}"
        return f"{v:.4f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(k, r[k]) for k in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def run_setting(setting: tuple[int, str, str], out: Path, timeout_s: float) -> dict:
    """One mode=execute launch in its own process and directory; its row."""
    where = out / "_".join(map(str, setting))
    cmd = [sys.executable, "-m", "octopipe.run", *overrides(*setting), f"hydra.run.dir={where}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"bench.runtime: {' '.join(cmd[2:])} failed (exit {proc.returncode}): {tail}")
    return row_of(json.loads((where / "summary.json").read_text()), setting)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--dispatch", nargs="+", default=["strict", "ready_first"], choices=["strict", "ready_first"])
    ap.add_argument("--compute", nargs="+", default=["real", "emulated"], choices=["real", "emulated"])
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds; figures are medians over them")
    ap.add_argument("--quick", action="store_true", help="2 ranks, emulated, ready_first only")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one launch may take at most")
    ap.add_argument("--out", default="runs/bench/runtime")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    grid = [(2, "ready_first", "emulated")] if args.quick else \
        list(itertools.product(args.ranks, args.dispatch, args.compute))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds = []
    for k in range(args.rounds):
        rows = []
        for setting in grid:
            print(f"round {k + 1}/{args.rounds}: {' '.join(overrides(*setting)[1:])}", flush=True)
            rows.append(run_setting(setting, out / f"round{k}", args.timeout))
        rounds.append(rows)
    rows = median_rows(rounds)
    table = markdown(rows)
    print(table)
    doc = {"cores": os.cpu_count(), "load_average": os.getloadavg(), "rounds": args.rounds,
           "rows": rows, "per_round": rounds}
    write_json(out / "results.json", doc)
    (out / "results.md").write_text(table + "\n")
    return doc


if __name__ == "__main__":
    main()
