"""Entry point for ranks launched by torchrun (one process per pipeline rank, any number of
machines): every rank loads the same plan JSON and model preset and runs its row.

    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m octopipe.runtime.torchrun --plan runs/.../plan.json --model tiny_hybrid \\
        --backend nccl --iterations 3 --out runs/torchrun

`--transport auto` picks `ordered` for nccl (NCCL matches messages by posting order) and `tagged`
for gloo; `--device auto` picks cuda for nccl and cpu for gloo (gloo with `--device cuda` stages
messages through the CPU, so several ranks may share a GPU).

torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the plan's table must have
WORLD_SIZE rows. A plan whose meta splits layers (`pieces`) runs the preset with them split.
Each rank writes rank<R>.pt (losses, gradients, timed events) under --out.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from omegaconf import OmegaConf

from octopipe.config.runtime import RuntimeConfig
from octopipe.errors import ScheduleError
from octopipe.io import CONF_DIR
from octopipe.model.build import build_model
from octopipe.plan import plan_model
from octopipe.plan_io import load_plan
from octopipe.runtime.control import TorchrunControl
from octopipe.runtime.job import Job
from octopipe.runtime.launch import resolve
from octopipe.runtime.worker import rank_main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--model", required=True, help="model preset name (conf/model/<name>.yaml)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--transport", default="auto", choices=["auto", "tagged", "ordered"],
                    help="auto: ordered for nccl, tagged for gloo")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto: cuda for nccl, cpu for gloo; gloo with cuda stages messages through the CPU")
    ap.add_argument("--dispatch", default="ready_first", choices=["strict", "ready_first"])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/torchrun")
    args = ap.parse_args(argv)
    config = RuntimeConfig(backend=args.backend, transport=args.transport, device=args.device,
                           dispatch=args.dispatch, iterations=args.iterations, warmup=0, lr=args.lr)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    plan = load_plan(args.plan)
    model = plan_model(build_model(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")), plan)
    job = Job(plan, model, config, seed=args.seed, init_method="env://")
    table = plan.table.compact().compute_only()
    if table.n_devices != world:
        raise ScheduleError(f"the plan has {table.n_devices} ranks but torchrun started {world}; "
                            f"set --nnodes x --nproc-per-node = {table.n_devices}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rank_main(rank, resolve(job, args.out), TorchrunControl())


if __name__ == "__main__":
    main()
