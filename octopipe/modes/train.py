"""`mode=train`: train a model with the plan, on the runtime's ranks, on real text.

The model is a user's factory (`model=module model.factory=PKG.MOD:FUNC`) or a preset's layers
(above runtime.max_params parameters, `train.model=auto` trains the example factory instead);
its blocks are profiled here and planned by the tuner (`train.plan=tuned`, the default) or laid
out as schedule=<name> (`train.plan=schedule`; a short measured trial settles between the
tuner's plan and the fastest named schedule: `train.trial_steps`), then trained for `train.steps` AdamW steps of
`train.microbatches` micro-batches on `train.pp` ranks. `train.check_reference` also trains the
single-process reference and reports the largest relative loss and weight difference.

Writes summary.json (initial_loss, final_loss, loss_drop, tokens_per_s, steps, checkpoint,
reference_max_rel_err when checked), loss.csv (step, loss, lr, grad_norm, tokens_per_s),
loss.png, plan.json and schedule.csv.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from octopipe.modes.artifacts import plan_artifacts, text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result
from octopipe.progress import weighted_progress
from octopipe.train.checkpoint_dir import Claim
from octopipe.train.layout_run import apply_layout, layout_summary
from octopipe.train.loop import TrainRun, launch_training, reference_train
from octopipe.train.parallel import train_layout
from octopipe.train.setup import (
    Setup,
    checkpoints_for,
    fingerprints,
    params_total,
    setup,
    shared_parameters,
    start_step,
    streams_before,
    train_cluster,
    train_job,
)
from octopipe.train.stream import replay_training
from octopipe.train.summary import (
    compare,
    figures,
    loss_csv,
    loss_png,
    memory_figures,
    rel_err,
    step_prediction,
)
from octopipe.train.tensorboard import ScalarLog
from octopipe.train.trial import TrialOutcome, run_trial


def _notes(s: Setup, meta: dict, start: int, claim: Claim | None, ties: list[dict]) -> list:
    """The report's first lines: why the model differs from the one asked for, unfinished saves
    removed, a resume onto another plan, the shared parameters."""
    report: list = []
    if s.note:
        report.append(f"[yellow]{s.note}[/yellow]")
    if claim is not None and claim.removed:
        report.append(f"[yellow]removed unfinished checkpoint saves in {claim.directory}: "
                      f"{', '.join(claim.removed)}[/yellow]")
    if s.resumed and s.resumed.get("plan") != meta["plan"]:
        was = s.resumed.get("plan_desc", {})
        report.append(f"resuming step {start} of a checkpoint trained on another plan "
                      f"({was.get('name', '?')}, partition {was.get('partition', '?')}): its weights and AdamW "
                      f"state are loaded by name onto this run's plan")
    if ties:
        report.append("shared parameters (one parameter; a copy per stage holding it, gradients summed): "
                      + "; ".join(f"{x['name']} (blocks {x['blocks']}, stages {x['stages']})" for x in ties))
    return report


def _stream_record(st, report: list) -> dict:
    """summary.json's record of an asynchronous stream, and its report line."""
    held = list(st.schedule().versions_held())
    report.append(f"asynchronous ({st.rule.value}): steps {st.start + 1}–{st.steps} as one stream of "
                  f"{st.length} micro-batches, no flush; AdamW on a stage after every "
                  f"{'window of ' + str(st.window) + ' backwards' if st.window > 1 else 'backward'} "
                  f"(clipped by the stage's own norm); weight versions held per stage {held}")
    return {"rule": st.rule.value, "window": st.window, "stream_microbatches": st.length,
            "updates_per_stage": st.length // st.window, "flushes": 0, "versions_held": held}


def _trial(cfg, s: Setup, progress) -> tuple[Setup, TrialOutcome | None]:
    """The plan trial (`train.trial_steps`) where the setup found candidates: the run's Setup on the winner."""
    if not s.candidates:
        return s, None
    _, spec = train_job(cfg, s)
    outcome = run_trial(s.candidates, lambda plan: train_job(cfg, replace(s, plan=plan))[0], spec,
                        cfg.train.trial_steps, progress)
    return replace(s, plan=s.candidates[outcome.chosen][1]), outcome


def run(inputs: Inputs) -> Result:
    cfg, chosen, scaled = apply_layout(inputs.config)
    t = cfg.train
    s, trial = _trial(cfg, setup(cfg, inputs.progress), inputs.progress)
    meta = fingerprints(s, cfg.seed)
    start = start_step(cfg, s, meta)
    claim = checkpoints_for(cfg, start, inputs.run_dir)
    ties = shared_parameters(s, cfg.seed)
    report = _notes(s, meta, start, claim, ties)
    if trial is not None:
        report.append(trial.line())
    if chosen is not None:
        report.insert(0, f"layout {chosen.source}: tp {chosen.tp} x pp {chosen.pp} x dp {chosen.dp}, micro-batch "
                         f"{chosen.micro_batch_size} x {chosen.microbatches}, recompute {list(chosen.recompute)}"
                         + (f"; {chosen.model} scaled to fit this machine: {scaled}" if scaled else ""))
    n_params = params_total(s, cfg.seed)
    pp, m = s.plan.table.n_devices, s.plan.table.n_microbatches     # what runs, whatever was asked
    layout = replace(train_layout(cfg), pp=pp)
    report.append(f"[bold]OctoPipe train[/]: {s.name} ({s.costs.n_layers} blocks, {n_params:,} parameters) on "
                  f"{layout.world} ranks ({layout.describe()}), plan {s.plan.table.name} "
                  f"(partition {list(s.plan.partition.ranges)}, placement "
                  f"{list(s.plan.placement)}{', split layers ' + str(dict(s.plan.pieces)) if s.plan.pieces else ''}), "
                  f"{m} micro-batches of {s.costs.tokens_per_microbatch} tokens"
                  f"{' per replica' if layout.dp > 1 else ''}, {t.precision}")
    board = ScalarLog((inputs.run_dir or Path(tempfile.gettempdir())) / "tensorboard") if t.tensorboard else None
    with tempfile.TemporaryDirectory(prefix="octopipe-train-") as tmp, \
            weighted_progress("train", show=inputs.interactive) as update:
        every = max(1, (t.steps - start) // 10)

        def on_step(r: dict) -> None:
            if board is not None:
                board.step(r)
            line = f"step {r['step']}/{t.steps} loss {r['loss']:.3f} {r['tokens_per_s']:,.0f} tok/s"
            update(line, r["step"] - start, t.steps - start)
            if not inputs.interactive and (r["step"] - start) % every == 0:
                inputs.progress(line)
        job, spec = train_job(cfg, s, start, checkpoints=claim)
        try:
            result = launch_training(job, spec, tmp, on_step)
        finally:
            if board is not None:
                board.close()
    recs = result.records
    if ties:
        summary_ties = {"shared_parameters": ties, "shared_copies_equal": result.tied_equal}
    else:
        summary_ties = {}
    summary = {"status": "ok", "model": s.name, "pp": pp, "dp": layout.dp, "tp": layout.tp, "zero": int(layout.zero),
               "world": layout.world, "microbatches": m, "global_microbatches": m * layout.dp,
               "precision": t.precision, "plan": s.plan.table.name, "params_total": n_params,
               **figures(result, t.steps, start), **summary_ties}
    if trial is not None:
        summary["plan_trial"] = trial.record()
    if spec.stream is not None:
        summary["asynchronous"] = _stream_record(spec.stream, report)
    summary["model_flops_per_s"] = 6.0 * n_params * summary["tokens_per_s"]    # 6 N per token
    if chosen is not None:
        summary["layout"] = layout_summary(chosen, scaled)
    if spec.stream is None:
        cluster = train_cluster(cfg)
        summary.update(step_prediction(s, layout, result, cluster, t.dispatch, job.pinned))
        summary.update(memory_figures(s, layout, result, cluster))
        waits = [e["dp_wait_s"] for ev in result.events for e in ev if "dp_wait_s" in e]
        if waits:       # the last step's wait for the gradient sync after the row: what it did not overlap
            summary["dp_sync_exposed_s"] = max(waits)
        report.append(f"pipeline iteration: {summary['measured_iteration_s']:.3f} s measured (median; the step "
                      f"with AdamW {summary['measured_step_s']:.3f} s), {summary['predicted_iteration_s']:.3f} s "
                      f"simulated ({layout.world} ranks sharing {summary['cores']} cores; "
                      f"{'pinned to cores ' + str(list(job.pinned)) if job.pinned else 'not pinned'})")
    if t.check_reference and spec.stream is not None:
        inputs.progress("replaying the asynchronous streams in one process")
        ref = replay_training(s.blocks, s.plan.partition.ranges, [*streams_before(cfg, s), spec.stream], s.batches,
                              s.optim, cfg.seed)
        loss_err, weight_err = compare(result, TrainRun(ref.losses, ref.params, "", []), s.blocks, s.plan.pieces)
        mb_err = max(rel_err(result.microbatch_losses[k], v) for k, v in ref.microbatch_losses.items())
        summary.update(reference="single-process replay of the asynchronous version assignment",
                       reference_loss_max_rel_err=loss_err, reference_weight_max_rel_err=weight_err,
                       reference_microbatch_loss_max_rel_err=mb_err,
                       reference_max_rel_err=max(loss_err, weight_err, mb_err))
        report.append(f"reference: the single-process replay of {s.plan.table.name}'s version assignment (same "
                      f"data order, seeds, AdamW per update): step losses within {loss_err:.2e}, micro-batch "
                      f"losses within {mb_err:.2e}, final weights within {weight_err:.2e} (relative)")
    elif t.check_reference:
        inputs.progress("training the single-process reference")
        ref = reference_train(s.reference_blocks, s.batches, m * layout.dp, s.optim, t.steps, cfg.seed,
                              torch.bfloat16 if t.precision == "bf16" else None)
        loss_err, weight_err = compare(result, ref, s.blocks, s.plan.pieces)
        summary.update(reference="single-process synchronous run", reference_loss_max_rel_err=loss_err,
                       reference_weight_max_rel_err=weight_err,
                       reference_max_rel_err=max(loss_err, weight_err))
        report.append(f"single-process reference: losses within {loss_err:.2e}, final weights within "
                      f"{weight_err:.2e} (relative)")
    report.append(f"loss {summary['initial_loss']:.3f} → {summary['final_loss']:.3f} "
                  f"({summary['loss_drop']:.0%} lower) over steps {start + 1}–{t.steps}; "
                  f"{summary['tokens_per_s']:,.0f} tokens/s"
                  + (f"; checkpoint {result.checkpoint}" if result.checkpoint else ""))
    title = f"{s.name} on {layout.world} ranks ({layout.describe()}, {s.plan.table.name}), {t.precision}"
    artifacts = (*plan_artifacts(s.plan), text_artifact("loss.csv", loss_csv(recs)),
                 Artifact("loss.png", lambda path: loss_png(path, recs, title)))
    return Result(summary, tuple(report), artifacts)
