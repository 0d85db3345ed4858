"""From the typed config to a training job: the blocks, the data, the measured costs, the plan.

`blocks_for` picks the model (a user's factory, `model=module model.factory=...`, or a preset's
layers); `plan_for` profiles the blocks on this machine (`cost=profiled`: F, I, W, stored
activations, parameters, message bytes) and plans them with the tuner (split layers where a
preset's layer kind splits; a user's blocks stay whole) or lays out schedule=<name> on an even
partition. `fingerprints` names the model and the plan a checkpoint belongs to.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from octopipe.asynchronous.runtime import WeightStash
from octopipe.asynchronous.tables import Rule
from octopipe.cluster import Cluster
from octopipe.config.cost import ProfiledCost
from octopipe.config.presets import preset
from octopipe.config.schema import Config
from octopipe.cost.profiled import profile_blocks, profiled_costs
from octopipe.cost.table import CostTable
from octopipe.cost.tied import charge_ties
from octopipe.errors import ConfigError
from octopipe.model.build import build_model
from octopipe.model.hf import vocab_of
from octopipe.model.params import model_params
from octopipe.model.sharing import tied_tensors, unique_parameters
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.plan import Partition, Plan, plan_model
from octopipe.plan_io import load_plan, plan_to_doc
from octopipe.runtime import host_time
from octopipe.runtime.dispatch import plain
from octopipe.runtime.host_time import with_host_time
from octopipe.runtime.job import DataParallel, Job
from octopipe.runtime.machine import local_cluster, measure_loopback
from octopipe.runtime.pinning import rank_cores
from octopipe.runtime.stage import SpecBlocks
from octopipe.schedule.library import build_schedule
from octopipe.train import checkpoint, work
from octopipe.train.checkpoint import fingerprint
from octopipe.train.checkpoint_dir import Claim, claim
from octopipe.train.data import TokenBatches, load_corpus
from octopipe.train.layout_run import read_layout
from octopipe.train.loop import TrainSpec
from octopipe.train.optim import OptimSettings
from octopipe.train.parallel import check_model, train_layout
from octopipe.train.recompute import check_recompute, recompute_stages
from octopipe.train.stream import Stream, StreamBatches, check_async, rule_of, stream_of
from octopipe.train.tied import cross_stage_ties, model_shapes
from octopipe.train.tokenizer import tokenize
from octopipe.train.trial import trial_candidates
from octopipe.tune import TuneOptions, tune
from octopipe.tune.splitting import model_splitter

EXAMPLE_FACTORY = "examples/tiny_gpt.py:build"
HF_FACTORY = "octopipe.model.hf:build"


@dataclass(frozen=True)
class Setup:
    """A training run's inputs: `blocks` (UserBlocks or SpecBlocks of the split model the plan
    runs), `reference_blocks` (the unsplit model), data, plan and optimizer; `note` says why
    the model differs from the one asked for."""

    name: str
    blocks: object
    reference_blocks: object
    batches: TokenBatches
    plan: Plan
    costs: CostTable
    optim: OptimSettings
    note: str = ""
    resumed: dict = field(default_factory=dict)     # the verified metadata of train.resume's checkpoint
    candidates: tuple = ()      # (name, plan, simulated s): the tuner's plan and the fastest named schedule


def _user_blocks(cfg: Config, factory: str, seq_len: int, mbs: int, vocab: int) -> UserBlocks:
    return check_blocks(UserBlocks(factory, seq_len, mbs, vocab), cfg.seed)


def blocks_for(cfg: Config) -> tuple[object, str, str]:
    """(blocks, name, note): the user's factory when `model.factory` is set, else the model
    group's preset (train.model=auto falls back to the example factory above
    runtime.max_params parameters), else the preset `train.model` names."""
    chosen = cfg.model if cfg.train.model == "auto" else preset("model", cfg.train.model)
    if chosen.hf:
        blocks = UserBlocks(HF_FACTORY, chosen.seq_len, chosen.micro_batch_size, vocab_of(chosen.hf),
                            (("config", chosen.hf),))
        return check_blocks(blocks, cfg.seed), f"hf:{chosen.hf}", ""
    if chosen.factory:
        return _user_blocks(cfg, chosen.factory, chosen.seq_len, chosen.micro_batch_size, chosen.vocab), \
            chosen.factory, ""
    model = build_model(chosen)
    if cfg.train.model == "auto" and model_params(model) > cfg.runtime.max_params:
        mod = preset("model", "module")
        note = (f"{model.name} has {model_params(model) / 1e9:.2f}B parameters, above runtime.max_params="
                f"{float(cfg.runtime.max_params):.3g}: training the example factory {EXAMPLE_FACTORY} instead "
                f"(model=module model.factory=... or train.model=<preset> chooses another)")
        return _user_blocks(cfg, EXAMPLE_FACTORY, mod.seq_len, mod.micro_batch_size, mod.vocab), \
            EXAMPLE_FACTORY, note
    return SpecBlocks(model), model.name, ""


def _shape(blocks) -> tuple[int, int, int]:
    if isinstance(blocks, SpecBlocks):
        m = blocks.model
        return m.seq_len, m.micro_batch_size, m.vocab
    return blocks.seq_len, blocks.micro_batch_size, blocks.vocab


def batches_for(cfg: Config, blocks) -> TokenBatches:
    seq, mbs, vocab = _shape(blocks)
    tokens = tokenize(load_corpus(cfg.train.corpus, cfg.train.max_corpus_mb), cfg.train.tokenizer, vocab)
    return TokenBatches(tokens, seq, mbs, cfg.seed)


def optim_for(cfg: Config) -> OptimSettings:
    t = cfg.train
    return OptimSettings(lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                         total_steps=t.steps, min_lr_ratio=t.min_lr_ratio, clip_norm=t.clip_norm)


def profiled_cost(cfg: Config) -> ProfiledCost:
    """The `cost` section if it is `profiled`, else the profiled preset (training plans always
    run on measured costs)."""
    return cfg.cost if isinstance(cfg.cost, ProfiledCost) else preset("cost", "profiled")


def train_cluster(cfg: Config) -> Cluster:
    cache = profiled_cost(cfg).cache_dir
    link = measure_loopback(cache=(Path(cache).parent if cache else Path("runs/cache")) / "loopback_link.json")
    return local_cluster(cfg.train.pp, link)


def costs_for(cfg: Config, blocks, cluster: Cluster) -> CostTable:
    """The blocks' profiled costs, with the runtime's host seconds per action measured here
    (`runtime.host_time`): the tuner weighs many small stages against few large ones on them."""
    cost = profiled_cost(cfg)
    if isinstance(blocks, SpecBlocks):
        return with_host_time(profiled_costs(cost, blocks.model, cluster), blocks, cost, cfg.seed)
    ties = [(t.blocks[0], 4.0 * t.numel, len(t.blocks)) for t in tied_tensors(blocks.raw(cfg.seed)[0])
            if t.parameter]         # fp32 gradients, summed over the holders' ranks
    costs = with_host_time(profile_blocks(blocks, cost, cluster), blocks, cost, cfg.seed)
    return charge_ties(costs, ties, cluster, cfg.train.microbatches)


def plan_for(cfg: Config, blocks, costs: CostTable, cluster: Cluster, name: str) -> tuple[Plan, tuple]:
    """The tuner's plan (train.plan=tuned; a resumed run's: the checkpoint's plan.json),
    schedule=<name> on an even partition, or train.layout's plan; and the candidates of a plan
    trial (`train.trial_steps`), or () where none applies."""
    t = cfg.train
    if t.layout:        # mode=layout's plan, as it chose it (its layers are the scaled model's)
        return read_layout(t.layout).plan, ()
    if rule_of(cfg) is not None:     # asynchronous: its stream table on an even partition
        table = build_schedule(cfg.schedule.name, t.pp, t.microbatches, cfg.chunks)
        return Plan(Partition.uniform(costs.n_layers, table.n_stages), table, name, cluster.name,
                    {"source": "mode=train", "asynchronous": rule_of(cfg).value}), ()
    if t.resume and t.plan == "tuned":
        path = Path(t.resume) / "plan.json"
        if not path.is_file():
            raise ConfigError(f"train.resume={t.resume}: no plan.json there; not a checkpoint of mode=train")
        before = load_plan(path)
        if (before.table.n_devices, before.table.n_microbatches) == (t.pp, t.microbatches):
            return before, ()        # the same shape continues on the same plan, bit for bit
    if t.plan == "schedule":
        table = build_schedule(cfg.schedule.name, t.pp, t.microbatches, cfg.chunks)
        return Plan(Partition.uniform(costs.n_layers, table.n_stages), table, name, cluster.name,
                    {"source": "mode=train"}), ()
    splitter = None
    if isinstance(blocks, SpecBlocks):
        cost = profiled_cost(cfg)
        splitter = model_splitter(blocks.model, lambda m: profiled_costs(cost, m, cluster))
    res = tune(costs, cluster, t.pp, t.microbatches, TuneOptions(
        replace(cfg.tuner, time_budget_s=t.tune_s), cfg.solver, seed=cfg.seed, model=name,
        splitter=splitter))
    return res.plan, () if t.resume else trial_candidates(res, t.trial_steps)     # a resumed run: no trial


def check_resume_tensors(path: str, blocks, seed: int) -> None:
    """Every parameter of the model is in the checkpoint under its name, with its shape (a
    factory edited since the checkpoint, a width changed, another split of the layers): one
    line naming the first that differs."""
    want = model_shapes(blocks, seed)
    try:
        have = checkpoint.tensor_shapes(path)
    except Exception as e:     # torch's reader raises several types for a damaged .metadata
        raise ConfigError(f"train.resume={path}: the checkpoint's .metadata cannot be read "
                          f"({type(e).__name__}); resume from an intact checkpoint") from None
    for name, shape in sorted(want.items()):
        if f"model.{name}" not in have:
            raise ConfigError(f"train.resume={path}: the checkpoint has no parameter {name}; it was written by "
                              f"another model (or another split of its layers)")
        if have[f"model.{name}"] != shape:
            raise ConfigError(f"train.resume={path}: {name} has shape {list(have['model.' + name])} in the "
                              f"checkpoint and {list(shape)} in this model; resume with the model the checkpoint "
                              f"was written with")


def setup(cfg: Config, progress: Callable[[str], None] = lambda _: None) -> Setup:
    """Everything a training run needs, built once (errors before any rank starts)."""
    check_async(cfg, None)
    layout = train_layout(cfg)
    check_recompute(cfg.train.recompute, cfg.train.layout)
    blocks, name, note = blocks_for(cfg)
    check_model(cfg, layout, blocks.model if isinstance(blocks, SpecBlocks) else None,
                blocks if isinstance(blocks, UserBlocks) else None)
    if rule_of(cfg) is not None and cfg.train.plan == "tuned":
        note = " ".join(x for x in (note, f"schedule={cfg.schedule.name} trains asynchronously on an even "
                                          f"partition (train.plan=tuned does not apply)") if x)
    n_blocks = blocks.n_blocks if isinstance(blocks, UserBlocks) else blocks.model.n_layers
    if cfg.train.pp > n_blocks:
        raise ConfigError(f"train.pp={cfg.train.pp} exceeds the {n_blocks} blocks of {name} (a stage holds at "
                          f"least one); set train.pp <= {n_blocks}")
    resumed: dict = {}
    if cfg.train.resume:      # verify the files, refuse another model's checkpoint before profiling
        progress(f"verifying the checkpoint {cfg.train.resume}")
        resumed = checkpoint.read_meta(cfg.train.resume)
        checkpoint.check_meta(cfg.train.resume, resumed, {**resumed, **model_fingerprint(name, blocks, cfg.seed)})
        if not resumed["verified"]:
            note = " ".join(x for x in (note, f"{cfg.train.resume} was written without checksums (an older "
                                              f"OctoPipe): its files are not verified") if x)
    check_async(cfg, resumed.get("step", 0))     # what a stream cannot checkpoint, before profiling
    params = unique_parameters(blocks.raw(cfg.seed)[0]) if isinstance(blocks, UserBlocks) else \
        model_params(blocks.model)
    work.check_memory(name, params)
    batches = batches_for(cfg, blocks)
    cluster = train_cluster(cfg)
    seq, mbs, _ = _shape(blocks)
    cost = profiled_cost(cfg)
    passes = cost.warmup + cost.repeats + host_time.PASSES      # the blocks timed, then the runtime's host time
    work.check_profile(name, work.profile_seconds(params, seq * mbs, passes, work.cpu_flops()),
                       cfg.train.max_profile_s, progress)
    costs = costs_for(cfg, blocks, cluster)
    progress(f"planning {name} on {cfg.train.pp} ranks (at most train.tune_s={cfg.train.tune_s:g} s)")
    plan, candidates = plan_for(cfg, blocks, costs, cluster, name)
    work.check_training(cfg, plan, costs, cluster, progress)
    run_blocks = SpecBlocks(plan_model(blocks.model, plan)) if isinstance(blocks, SpecBlocks) else blocks
    if cfg.train.resume:
        check_resume_tensors(cfg.train.resume, run_blocks, cfg.seed)
    ties = cross_stage_ties(run_blocks, cfg.seed, plan.partition.ranges)
    if rule_of(cfg) is not None and ties:
        raise ConfigError(f"schedule={cfg.schedule.name}: parameter {ties[0][0].name} is shared by stages "
                          f"{list(ties[0][1])}, whose weight versions an asynchronous schedule keeps apart; "
                          f"train it with a synchronous schedule")
    return Setup(name, run_blocks, blocks, batches, plan, costs, optim_for(cfg), note, resumed, candidates)


def params_total(s: Setup, seed: int) -> int:
    """The model's parameter count, a shared parameter once (a user's model: as its factory
    built it; a preset: the profiled blocks')."""
    if isinstance(s.reference_blocks, UserBlocks):
        return unique_parameters(s.reference_blocks.raw(seed)[0])
    return int(s.costs.params.sum())


def model_fingerprint(name: str, blocks, seed: int) -> dict:
    """The model's part of a checkpoint's identity: its blocks, training shape and seed (and a
    readable description, so that a refusal can say which of them differs)."""
    layers = list(blocks.names) if isinstance(blocks, UserBlocks) else repr(blocks.model.layers)
    model = {"name": name, "blocks": layers, "shape": list(_shape(blocks)), "seed": seed}
    desc = {"name": name, "blocks": fingerprint(layers), "shape [seq, micro-batch, vocab]": list(_shape(blocks)),
            "seed": seed}
    return {"model": fingerprint(model), "model_name": name, "model_desc": desc}


def fingerprints(s: Setup, seed: int) -> dict:
    """What a checkpoint must match to resume: the model (its blocks and initial seed) and the
    plan (partition, placement, micro-batches, split layers)."""
    plan = {"partition": [list(r) for r in s.plan.partition.ranges], "placement": list(s.plan.placement),
            "microbatches": s.plan.table.n_microbatches, "pieces": dict(s.plan.pieces),
            "table": [[str(a) for a in s.plan.table.actions(d)] for d in range(s.plan.table.n_devices)]}
    desc = {"name": s.plan.table.name, "partition": plan["partition"], "placement": plan["placement"],
            "microbatches": plan["microbatches"], "pieces": {str(k): v for k, v in s.plan.pieces.items()},
            "table": fingerprint(plan["table"])}
    out = {**model_fingerprint(s.name, s.reference_blocks, seed), "plan": fingerprint(plan),
           "plan_name": s.plan.table.name, "plan_desc": desc}
    b = s.reference_blocks
    if isinstance(b, UserBlocks):       # what `python -m octopipe.train.export` rebuilds the model from
        out["model_ref"] = {"factory": b.factory, "kwargs": [list(kv) for kv in b.kwargs], "seq_len": b.seq_len,
                            "micro_batch_size": b.micro_batch_size, "vocab": b.vocab, "seed": seed}
    return out


def start_step(cfg: Config, s: Setup, meta: dict) -> int:
    """The step a run begins at: 0, or the resumed checkpoint's after its fingerprints match;
    what an asynchronous stream cannot checkpoint is refused either way."""
    start = 0
    if cfg.train.resume:       # a synchronous run may continue on another plan; a stream may not
        start = checkpoint.check_meta(cfg.train.resume, s.resumed, meta, plan=rule_of(cfg) is not None)
        if start >= cfg.train.steps:
            raise ConfigError(f"train.resume={cfg.train.resume}: the checkpoint is at step {start}, "
                              f"train.steps={cfg.train.steps} leaves nothing to run")
    check_async(cfg, start)
    return start


def streams_before(cfg: Config, s: Setup) -> list[Stream]:
    """The asynchronous streams a resumed checkpoint was trained in (its `streams`), oldest first."""
    rule, t = rule_of(cfg), cfg.train
    return [Stream(rule, t.pp, t.microbatches, a, b, t.pp if rule is Rule.TWO_BW else 1)
            for a, b in s.resumed.get("streams", [])]


def checkpoints_for(cfg: Config, start: int, run_dir: Path | None) -> Claim | None:
    """The checkpoint directory this run claims (train.checkpoint_dir, else <run_dir>/checkpoints),
    checked before training; None when the run saves none."""
    t = cfg.train
    if not t.checkpoint_every:
        return None
    if not t.checkpoint_dir and run_dir is None:
        raise ConfigError("train.checkpoint_dir is empty and this run has no run directory; give a directory")
    where = Path(t.checkpoint_dir) if t.checkpoint_dir else Path(run_dir) / "checkpoints"
    return claim(where, str(Path(run_dir or where).resolve()), start, t.resume)


def train_job(cfg: Config, s: Setup, start: int = 0, init_method: str = "",
              checkpoints: Claim | None = None) -> tuple[Job, TrainSpec]:
    """The runtime job that trains `s` (the same `Job` as mode=execute's: real compute on the
    blocks, the training's dispatch and time limit) and the training it runs."""
    t = cfg.train
    if cfg.runtime.tp != 1:
        raise ConfigError(f"runtime.tp={cfg.runtime.tp}: mode=train's tensor parallelism is train.tp; use "
                          "runtime.tp=1")
    layout = train_layout(cfg)
    planned = read_layout(t.layout).recomputed() if t.layout else None
    # the training loop runs the table as planned: no hint, caps or jitter (`plain`), as before
    runtime = replace(plain(cfg.runtime), dispatch=t.dispatch, compute="real", lr=0.0, warmup=0, iterations=1,
                      timeout_s=t.timeout_s, tp=layout.tp)
    meta, stream, weights, batches = fingerprints(s, cfg.seed), None, None, s.batches
    plan = s.plan
    if rule_of(cfg) is not None:
        stream = stream_of(cfg, start)
        sched = stream.schedule()
        plan = Plan(s.plan.partition, sched.table.compact(), s.plan.model, s.plan.cluster, s.plan.meta)
        meta["streams"] = [[x.start, x.steps] for x in (*streams_before(cfg, s), stream)]
        weights = WeightStash(sched, s.optim.lr)
        batches = StreamBatches(s.batches, stream.microbatches, start)
    layers = s.blocks.model if layout.tp > 1 and isinstance(s.blocks, SpecBlocks) else s.blocks
    # a local launch pins its ranks as mode=execute does (runtime.pin); torchrun's ranks stay where
    # torchrun put them
    pinned = None if init_method else rank_cores(runtime, plan.table.n_devices * layout.dp * layout.tp)
    job = Job(plan, layers, runtime, cfg.seed, weights=weights, data=batches, pinned=pinned,
              autocast="bfloat16" if t.precision == "bf16" else "", init_method=init_method,
              timeout_name="train.timeout_s", data_parallel=DataParallel(layout.dp, layout.zero),
              recompute=recompute_stages(t.recompute, plan.table.n_stages, planned, t.layout))
    spec = TrainSpec(s.optim, t.steps, start, t.resume, t.checkpoint_every if checkpoints else 0,
                     str(checkpoints.directory) if checkpoints else "", meta,
                     json.dumps(plan_to_doc(s.plan), indent=1) + "\n", stream)
    return job, spec


def shared_parameters(s: Setup, seed: int) -> list[dict]:
    """Every parameter several blocks hold: its name, blocks and the stages of the plan holding it."""
    if not isinstance(s.blocks, UserBlocks):
        return []
    stage_of = {j: k for k, (lo, hi) in enumerate(s.plan.partition.ranges) for j in range(lo, hi)}
    return [{"name": t.name, "blocks": list(t.blocks), "stages": sorted({stage_of[j] for j in t.blocks})}
            for t in tied_tensors(s.blocks.raw(seed)[0]) if t.parameter]
