"""torchrun entry: `torchrun --nproc-per-node=N -m octopipe.train [key=value ...]`.

The overrides are mode=train's (`model=module model.factory=...`, `train.steps=...`,
train.dp x train.tp x train.pp must equal the number of processes); `hydra.run.dir=DIR` chooses where
summary.json, loss.csv, loss.png and plan.json go (default runs/torchrun/<date>_<time>). Rank 0
profiles and plans, every rank receives the same setup, then each runs its row of the plan.
Several machines: add torchrun's --nnodes, --rdzv-backend=c10d, --rdzv-endpoint=HOST:PORT and
--rdzv-id flags, with hydra.run.dir on a file system every machine shares (each rank writes its
results there, as checkpoints do); on GPUs pass runtime.backend=nccl (one GPU per rank) or
runtime.device=cuda with gloo.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
from hydra import compose, initialize_config_dir

from octopipe.config import load, register
from octopipe.errors import ConfigError, OctoPipeError
from octopipe.io import CONF_DIR, write_json, write_text
from octopipe.plan_io import plan_to_doc
from octopipe.runtime.control import TorchrunControl
from octopipe.runtime.launch import resolve
from octopipe.schedule.library import SCHEDULE_PRESETS
from octopipe.train.layout_run import apply_layout
from octopipe.train.loop import TrainRankJob, follow, gather, train_rank
from octopipe.train.setup import checkpoints_for, fingerprints, setup, start_step, train_job
from octopipe.train.summary import figures, loss_csv, loss_png


def _config(argv: list[str]):
    register(SCHEDULE_PRESETS)
    overrides = [a for a in argv if "=" in a and not a.startswith("hydra.")]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return apply_layout(load(compose("config", overrides=["mode=train", *overrides])))[0]


def _prepare(cfg, rank: int, out: Path):
    """Rank 0's setup, first step and claimed checkpoint directory (or the error it met), shared
    with every rank."""
    box: list = [None]
    if rank == 0:
        try:
            s = setup(cfg, lambda line: print(f"octopipe train: {line}", flush=True))
            start = start_step(cfg, s, fingerprints(s, cfg.seed))
            box = [(s, start, checkpoints_for(cfg, start, out))]
        except OctoPipeError as e:
            box = [e]
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(next((a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")),
                    f"runs/torchrun/{time.strftime('%Y-%m-%d_%H-%M-%S')}"))
    rank, world = int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", 0))
    try:
        if rank < 0:
            raise ConfigError("python -m octopipe.train is torchrun's entry; run it under torchrun, "
                              "or use python -m octopipe.run mode=train")
        cfg = _config(argv)
        t = cfg.train
        if t.dp * t.tp * t.pp != world:
            raise ConfigError(f"train.dp={t.dp} x train.tp={t.tp} x train.pp={t.pp} = {t.dp * t.tp * t.pp} processes "
                              f"but torchrun started {world}; set --nproc-per-node x --nnodes to their product")
        # the local limit does not bound torchrun's world, which may span machines
        cfg = replace(cfg, runtime=replace(cfg.runtime, max_ranks=max(world, cfg.runtime.max_ranks)))
        dist.init_process_group(cfg.runtime.backend, init_method="env://")
        s, start, claim = _prepare(cfg, rank, out)
        ranks = out / "ranks"
        ranks.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            (ranks / "progress.jsonl").unlink(missing_ok=True)
        dist.barrier()
        stop = threading.Event()
        every = max(1, (cfg.train.steps - start) // 10)
        log = threading.Thread(target=follow, daemon=True, args=(ranks / "progress.jsonl", lambda r: print(
            f"step {r['step']}/{cfg.train.steps} loss {r['loss']:.3f} {r['tokens_per_s']:,.0f} tok/s",
            flush=True) if (r["step"] - start) % every == 0 else None, stop))
        if rank == 0:
            log.start()
        job, spec = train_job(cfg, s, start, "env://", claim)
        train_rank(rank, TrainRankJob(resolve(job, str(ranks)), spec), TorchrunControl())
        stop.set()
        if rank == 0:
            log.join()
        if rank == 0:
            run = gather(ranks, world, spec.checkpoint_every)
            summary = {"status": "ok", "mode": "train", "launcher": "torchrun", "model": s.name,
                       "pp": t.pp, "dp": t.dp, "tp": t.tp, "zero": t.zero, "world": world,
                       "plan": s.plan.table.name, **figures(run, cfg.train.steps, start)}
            write_json(out / "summary.json", summary)
            write_text(out / "loss.csv", loss_csv(run.records))
            write_text(out / "plan.json", json.dumps(plan_to_doc(s.plan), indent=1) + "\n")
            loss_png(out / "loss.png", run.records, f"{s.name} on {world} torchrun ranks")
            print(f"loss {run.losses[0]:.3f} -> {run.losses[-1]:.3f} over steps {start + 1}-"
                  f"{cfg.train.steps}; {summary['tokens_per_s']:,.0f} tokens/s; results: {out}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
    except OctoPipeError as e:
        print(f"octopipe: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
