"""A training run's figures and files: summary.json's keys, loss.csv, loss.png, and the
comparison with the single-process reference."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from octopipe.layers.pieces import pieces_state_dict
from octopipe.report.figures import pyplot, save
from octopipe.runtime.memory import memory_comparison
from octopipe.runtime.stage import SpecBlocks
from octopipe.sim.simulator import simulate
from octopipe.train.loop import TrainRun
from octopipe.train.work import predicted_step


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(run: TrainRun, ref: TrainRun, blocks, pieces) -> tuple[float, float]:
    """(largest relative loss difference over the steps `run` ran, largest norm-wise relative
    difference of the final weights); a split plan's pieces are compared with the slices of
    the reference's whole layers (`blocks`: the split model's)."""
    losses = max(rel_err(a, b) for a, b in zip(run.losses, ref.losses[-len(run.losses):]))
    want = ref.params
    if isinstance(blocks, SpecBlocks) and pieces:
        want = pieces_state_dict(blocks.model, want)
    weights = max(float((run.params[k] - v).norm()) / max(float(v.norm()), 1e-12) for k, v in want.items())
    return losses, weights


def figures(run: TrainRun, steps: int, start: int) -> dict:
    """summary.json's training figures: losses, tokens/s (median over the steps after the first),
    steps, checkpoint."""
    recs = run.records
    speeds = [r["tokens_per_s"] for r in recs[1:]] or [r["tokens_per_s"] for r in recs] or [0.0]
    return {"start_step": start, "steps": steps, "initial_loss": run.losses[0], "final_loss": run.losses[-1],
            "loss_drop": 1.0 - run.losses[-1] / run.losses[0], "tokens_per_s": float(np.median(speeds)),
            "checkpoint": run.checkpoint or None}


def step_prediction(s, layout, run: TrainRun, cluster, dispatch: str, pinned: tuple[int, ...] | None) -> dict:
    """The simulator's iteration time for the run (`work.predicted_step`) beside the measured one
    (median over the steps after the first of the pipeline iteration, first rank in to last rank
    out; a step adds the optimizer and the health checks to it); `pinned`: each rank's core."""
    recs = run.records
    steps = [r["step_s"] for r in recs[1:]] or [r["step_s"] for r in recs]
    walls = [r["iteration_s"] for r in recs[1:] if "iteration_s" in r] or \
        [r["iteration_s"] for r in recs if "iteration_s" in r]
    iteration = float(np.median(walls)) if walls else float("nan")
    cores = os.cpu_count() or 1
    predicted = predicted_step(s.plan, s.costs, cluster, layout, dispatch, cores)
    return {"measured_step_s": float(np.median(steps)) if steps else float("nan"),
            "measured_iteration_s": iteration, "predicted_iteration_s": predicted,
            "prediction_rel_err": abs(predicted - iteration) / iteration if iteration > 0 else None,
            "cores": cores, "pinned": list(pinned) if pinned else None}


def memory_figures(s, layout, run: TrainRun, cluster) -> dict:
    """Each rank's measured bytes (the last step's peak of saved activations, plus its parameters,
    gradients and AdamW state) beside the simulator's peak for its pipeline rank (the plan on the
    profiled costs: activations from each F to its backward, 16 bytes per parameter)."""
    if not run.memory or not all(run.memory):
        return {}
    sim = simulate(s.plan, s.costs, cluster)
    stride = layout.dp * layout.tp
    measured = [m["saved_peak_bytes"] + m["state_bytes"] for m in run.memory]
    simulated = [float(sim.peak_memory[r // stride]) for r in range(len(measured))]
    return {**memory_comparison(measured, simulated),
            "saved_activation_peak_bytes": [m["saved_peak_bytes"] for m in run.memory]}


def loss_csv(records: list[dict]) -> str:
    rows = ["step,loss,lr,grad_norm,step_s,tokens_per_s"]
    rows += [f"{r['step']},{r['loss']!r},{r['lr']:.6g},{r['grad_norm']:.6g},{r['step_s']:.4f},"
             f"{r['tokens_per_s']:.1f}" for r in records]
    return "\n".join(rows) + "\n"


def loss_png(path: Path, records: list[dict], title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    save(fig, path, dpi=110)
