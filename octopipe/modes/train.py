"""`mode=train`: train a model with the plan, on the runtime's ranks, on real text.

The model is a user's factory (`model=module model.factory=PKG.MOD:FUNC`) or a preset's layers
(above runtime.max_params parameters, `train.model=auto` trains the example factory instead);
its blocks are profiled here and planned by the tuner (`train.plan=tuned`, the default) or laid
out as schedule=<name> (`train.plan=schedule`), then trained for `train.steps` AdamW steps of
`train.microbatches` micro-batches on `train.pp` ranks. `train.check_reference` also trains the
single-process reference and reports the largest relative loss and weight difference.

Writes summary.json (initial_loss, final_loss, loss_drop, tokens_per_s, steps, checkpoint,
reference_max_rel_err when checked), loss.csv (step, loss, lr, grad_norm, tokens_per_s),
loss.png, plan.json and schedule.csv.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from octopipe.config.schema import Config
from octopipe.errors import ConfigError
from octopipe.layers.pieces import shard_state_dict
from octopipe.modes.artifacts import plan_artifacts, text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.result import Artifact, Result
from octopipe.progress import weighted_progress
from octopipe.runtime.stage import SpecBlocks
from octopipe.schedule.plan_io import plan_to_doc
from octopipe.train import checkpoint
from octopipe.train.loop import TrainRankJob, TrainRun, launch_training, rank_payload, reference_train
from octopipe.train.setup import Setup, fingerprints, setup


def _start(cfg: Config, meta: dict) -> int:
    """The step a run begins at: 0, or the resumed checkpoint's after its fingerprints match."""
    if not cfg.train.resume:
        return 0
    start = checkpoint.check_meta(cfg.train.resume, checkpoint.read_meta(cfg.train.resume), meta)
    if start >= cfg.train.steps:
        raise ConfigError(f"train.resume={cfg.train.resume}: the checkpoint is at step {start}, "
                          f"train.steps={cfg.train.steps} leaves nothing to run")
    return start


def train_job(cfg: Config, s: Setup, result_dir: str, start: int = 0) -> TrainRankJob:
    t = cfg.train
    rank = rank_payload(s.blocks, s.plan, cfg.runtime, result_dir, s.batches, cfg.seed,
                        "bfloat16" if t.precision == "bf16" else "")
    ckpt = t.checkpoint_dir or "runs/checkpoints"
    return TrainRankJob(rank, s.optim, t.steps, start, t.resume, t.checkpoint_every, ckpt,
                        fingerprints(s, cfg.seed), json.dumps(plan_to_doc(s.plan), indent=1) + "\n")


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(run: TrainRun, ref: TrainRun, s: Setup) -> tuple[float, float]:
    """(largest relative loss difference, largest norm-wise relative weight difference)."""
    losses = max(rel_err(a, b) for a, b in zip(run.losses, ref.losses[-len(run.losses):]))
    want = ref.params
    if isinstance(s.blocks, SpecBlocks) and s.plan.shards:
        want = shard_state_dict(s.blocks.model, want)
    weights = max(float((run.params[k] - v).norm()) / max(float(v.norm()), 1e-12) for k, v in want.items())
    return losses, weights


def _loss_png(path: Path, records: list[dict], title: str) -> None:
    import matplotlib  # plotting only for this artifact
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _csv(records: list[dict]) -> str:
    rows = ["step,loss,lr,grad_norm,tokens_per_s"]
    rows += [f"{r['step']},{r['loss']:.6f},{r['lr']:.6g},{r['grad_norm']:.6g},{r['tokens_per_s']:.1f}"
             for r in records]
    return "\n".join(rows) + "\n"


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    t = cfg.train
    s = setup(cfg, inputs.progress)
    meta = fingerprints(s, cfg.seed)
    start = _start(cfg, meta)
    report: list = []
    if s.note:
        report.append(f"[yellow]{s.note}[/yellow]")
    n_params = int(s.costs.params.sum())
    report.append(f"[bold]OctoPipe train[/]: {s.name} ({s.costs.n_layers} blocks, {n_params:,} parameters) on "
                  f"{t.pp} ranks, plan {s.plan.table.name} (partition {list(s.plan.partition.ranges)}, "
                  f"placement {list(s.plan.placement)}{', split layers ' + str(dict(s.plan.shards)) if s.plan.shards else ''}), "
                  f"{t.microbatches} micro-batches of {s.costs.tokens_per_microbatch} tokens, {t.precision}")
    with tempfile.TemporaryDirectory(prefix="octopipe-train-") as tmp, \
            weighted_progress("train", show=inputs.interactive) as update:
        def on_step(r: dict) -> None:
            update(f"step {r['step']}/{t.steps} loss {r['loss']:.3f} {r['tokens_per_s']:,.0f} tok/s",
                   r["step"] - start, t.steps - start)
        job = train_job(cfg, s, tmp, start)
        result = launch_training(job, t.timeout_s, cfg.runtime.stall_s, on_step)
    recs = result.records
    speeds = [r["tokens_per_s"] for r in recs[1:]] or [r["tokens_per_s"] for r in recs]
    summary = {"status": "ok", "model": s.name, "pp": t.pp, "microbatches": t.microbatches,
               "precision": t.precision, "plan": s.plan.table.name, "start_step": start,
               "steps": t.steps, "initial_loss": result.losses[0], "final_loss": result.losses[-1],
               "loss_drop": 1.0 - result.losses[-1] / result.losses[0],
               "tokens_per_s": float(np.median(speeds)), "checkpoint": result.checkpoint or None,
               "params_total": n_params}
    if t.check_reference:
        inputs.progress("training the single-process reference")
        ref = reference_train(s.reference_blocks, s.batches, t.microbatches, s.optim, t.steps, cfg.seed,
                              torch.bfloat16 if t.precision == "bf16" else None)
        loss_err, weight_err = compare(result, ref, s)
        summary.update(reference_loss_max_rel_err=loss_err, reference_weight_max_rel_err=weight_err,
                       reference_max_rel_err=max(loss_err, weight_err))
        report.append(f"single-process reference: losses within {loss_err:.2e}, final weights within "
                      f"{weight_err:.2e} (relative)")
    report.append(f"loss {summary['initial_loss']:.3f} → {summary['final_loss']:.3f} "
                  f"({summary['loss_drop']:.0%} lower) over steps {start + 1}–{t.steps}; "
                  f"{summary['tokens_per_s']:,.0f} tokens/s"
                  + (f"; checkpoint {result.checkpoint}" if result.checkpoint else ""))
    title = f"{s.name} on {t.pp} ranks ({s.plan.table.name}), {t.precision}"
    artifacts = (*plan_artifacts(s.plan), text_artifact("loss.csv", _csv(recs)),
                 Artifact("loss.png", lambda path: _loss_png(path, recs, title)))
    return Result(summary, tuple(report), artifacts)
