"""`experiment`: the experiment presets (conf/experiment/*.yaml). A common part (name, driver,
keep_going) and one dataclass per experiment with fields of its own, chosen by `name`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.fields import REQUIRED, setting


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """What every experiment has (`suite` and `suite_large` have nothing more: they are
    multiruns of mode=plan)."""

    name: str = setting(REQUIRED, "the experiment's name")
    driver: str | None = setting(None, "module whose run(inputs) -> Result runs the experiment; "
                                       "null: the mode's own")
    keep_going: bool = setting(False, "record a case that does not fit as infeasible instead of "
                                      "failing")


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """One node of identical devices (experiment=octopipe_authors, comm=node)."""

    name: str = setting(REQUIRED, "cluster name")
    device: str = setting(REQUIRED, "device kind name")
    peak_tflops: float = setting(REQUIRED, "dense BF16 peak per device", gt=0)
    memory_gb: float = setting(REQUIRED, "memory per device", gt=0)
    memory_bandwidth_tbps: float = setting(REQUIRED, "memory bandwidth per device", gt=0)
    link: str = setting(REQUIRED, "link name")
    link_bandwidth_gbps: float = setting(REQUIRED, "per direction", gt=0)
    link_latency_us: float = setting(REQUIRED, "per transfer", ge=0)


@dataclass(frozen=True, kw_only=True)
class AuthorsReference:
    """The OctoPipe authors' figures on one case (their simulator and tuner, PipelineSimulator),
    which the experiment reproduces (comm free)."""

    profile: str = setting(REQUIRED, "profile name")
    devices: int = setting(REQUIRED, "pipeline devices", ge=1)
    microbatches: int = setting(REQUIRED, "micro-batches", ge=1)
    lower_bound_ms: float = setting(REQUIRED, "lower bound", gt=0)
    s1f1b_ms: float = setting(REQUIRED, "1F1B iteration time", gt=0)
    interleaved_ms: float = setting(REQUIRED, "interleaved 1F1B iteration time", gt=0)
    zbh_ms: float = setting(REQUIRED, "ZB-H iteration time", gt=0)
    octopipe_ms: float = setting(REQUIRED, "the authors' OctoPipe plan's iteration time", gt=0)


@dataclass(frozen=True, kw_only=True)
class OctoPipeAuthorsExperiment(ExperimentConfig):
    """experiment=octopipe_authors: head-to-head on the OctoPipe authors' profiles."""

    profiles: tuple[str, ...] = setting(REQUIRED, "shipped profiles (cost.preset names)")
    devices: tuple[int, ...] = setting(REQUIRED, "pipeline device counts", ge=1, min_items=1)
    microbatches: tuple[int, ...] = setting(REQUIRED, "micro-batch counts", ge=1, min_items=1)
    comm: tuple[Literal["free", "node"], ...] = setting(
        REQUIRED, "free: transfers cost nothing (the authors' tool) | node: the node's link")
    interleaved_chunks: int = setting(2, "chunks per device of the interleaved baseline", ge=1)
    baselines: tuple[str, ...] = setting(REQUIRED, "baseline schedules")
    tuner: bool = setting(True, "ask octopipe.tune.tune for the OctoPipe plan")
    split_layers: bool = setting(True, "let the tuner piece MLP/MoE/head rows (cut into pieces, "
                                       "each an even share of the measured row)")
    node: NodeSpec = setting(REQUIRED, "the device node of comm=node")
    authors_reference: AuthorsReference = setting(REQUIRED, "the figures to reproduce")


@dataclass(frozen=True, kw_only=True)
class TabularBaseline:
    """The study's device and network (mid compute, mid network)."""

    peak_tflops: float = setting(REQUIRED, "peak per device", gt=0)
    memory_bandwidth_tbps: float = setting(REQUIRED, "memory bandwidth per device", gt=0)
    memory_gb: float = setting(REQUIRED, "memory per device", gt=0)
    network_gbps: float = setting(REQUIRED, "per direction", gt=0)
    network_latency_us: float = setting(REQUIRED, "per transfer", ge=0)


@dataclass(frozen=True, kw_only=True)
class Steps:
    """Scale of each level: compute peak and HBM x step; network bandwidth x step, latency / step."""

    slow: float = setting(REQUIRED, "slow level", gt=0)
    mid: float = setting(REQUIRED, "mid level", gt=0)
    fast: float = setting(REQUIRED, "fast level", gt=0)


@dataclass(frozen=True, kw_only=True)
class TabularExperiment(ExperimentConfig):
    """experiment=tabular: the tabular-abstraction study on OctoPipe's three levels."""

    stages: tuple[int, ...] = setting(REQUIRED, "stage counts", ge=1, min_items=1)
    microbatches: tuple[int, ...] = setting(REQUIRED, "micro-batch counts", ge=1, min_items=1)
    global_batch: int = setting(REQUIRED, "sequences per iteration, fixed", ge=1)
    schedules: tuple[str, ...] = setting(REQUIRED, "schedules of the grid", min_items=1)
    hanayo_at: tuple[int, ...] = setting(REQUIRED, "(stages, micro-batches) of Hanayo", ge=1, min_items=2)
    hanayo_chunks: tuple[int, ...] = setting(REQUIRED, "chunks per device: 2 = one wave, 4 = two",
                                             ge=1)
    baseline: TabularBaseline = setting(REQUIRED, "the device and network of the study")
    steps: Steps = setting(REQUIRED, "the 3x3 grid's levels")


@dataclass(frozen=True, kw_only=True)
class HandLayout:
    """A widely used hand layout of one case, simulated the same way as the search's."""

    tp: int = setting(REQUIRED, "tensor-parallel degree", ge=1)
    pp: int = setting(REQUIRED, "pipeline-parallel degree", ge=1)
    dp: int = setting(REQUIRED, "data-parallel degree", ge=1)
    micro_batch_size: int = setting(1, "sequences per micro-batch", ge=1)
    schedule: str = setting("1f1b", "named schedule (even stages)")
    chunks: int | None = setting(None, "stages per device (interleaved); null: the schedule's own",
                                 ge=1)
    recompute: Literal["none", "selective", "full"] = setting("none", "recomputation, every stage")
    source: str = setting("", "where the layout comes from")


@dataclass(frozen=True, kw_only=True)
class LayoutCase:
    """One model on one cluster (experiment=layouts)."""

    model: str = setting(REQUIRED, "model preset")
    cluster: str = setting(REQUIRED, "cluster preset")
    gpus: int | None = setting(None, "GPUs of the cluster to use; null: all", ge=1)
    global_batch: int = setting(REQUIRED, "sequences per iteration", ge=1)
    hand: HandLayout = setting(REQUIRED, "the hand layout to compare with")
    exhaustive: bool = setting(False, "also tune every feasible layout (the oracle)")


@dataclass(frozen=True, kw_only=True)
class LayoutsExperiment(ExperimentConfig):
    """experiment=layouts: mode=layout's choice against hand layouts and exhaustive search."""

    cases: tuple[LayoutCase, ...] = setting(REQUIRED, "the cases", min_items=1)


@dataclass(frozen=True, kw_only=True)
class PipeDreamExperiment(ExperimentConfig):
    """experiment=pipedream: PD, RPD, LocalSGD and synchronous 1F1B at equal time budgets
    (Ilin & Richtárik 2026)."""

    objectives: tuple[str, ...] = setting(REQUIRED, "quadratic | logistic | char_lm", min_items=1)
    stages: tuple[int, ...] = setting(REQUIRED, "stage counts S of the numpy objectives", ge=2)
    lm_stages: tuple[int, ...] = setting(REQUIRED, "stage counts S of char_lm (a layer per stage)",
                                         ge=2)
    microbatches: int = setting(REQUIRED, "the stream M: PD's budget is M micro-batches' ticks", ge=2)
    lm_microbatches: int = setting(REQUIRED, "M for char_lm", ge=2)
    lr_grid: tuple[float, ...] = setting(REQUIRED, "step sizes tried, in units of 1/L", gt=0)
    lm_lr_grid: tuple[float, ...] = setting(REQUIRED, "char_lm's step sizes (absolute)", gt=0)
    local_steps: tuple[int, ...] = setting(REQUIRED, "LocalSGD's H (local steps per round)", ge=1)
    replicas: int | None = setting(None, "LocalSGD's replicas; null: S", ge=1)
    delay_stages: tuple[int, ...] = setting(REQUIRED, "S of the delay-law check", ge=2)
    delay_per_stage: int = setting(10, "the delay-law stream has this many micro-batches per stage",
                                   ge=10)
    eval_points: int = setting(20, "objective evaluations along each clock", ge=2)
    runtime: bool = setting(True, "also run PD on the torch.distributed runtime: exactness "
                                  "against its replay and throughput against flushed 1F1B")
    runtime_model: str = setting("tiny_hybrid", "model preset the runtime trains")
    runtime_stages: int = setting(2, "runtime ranks (one stage each)", ge=2)
    runtime_microbatches: int = setting(16, "the runtime's stream of micro-batches", ge=2)
    runtime_lr: float = setting(0.05, "the runtime's SGD step size", gt=0)
    runtime_repeats: int = setting(3, "timed runs of each of PD and flushed 1F1B", ge=1)
    runtime_emulate_step_s: float = setting(0.04, "emulated comparison: the mean stage F lasts this "
                                                  "(long beside the machine's scheduling noise)", gt=0)
    runtime_emulated_repeats: int = setting(3, "emulated comparison: alternating launches of each", ge=1)
    runtime_emulated_per_launch: int = setting(2, "emulated comparison: timed runs per launch", ge=1)
    paper_logistic_stages: tuple[int, ...] = setting(
        (4, 8, 16), "PD against LocalSGD (R = S, H = 5) on the paper's own logistic set-up at its fixed "
                    "tick budget (asynchronous/regime.py); () skips it", ge=2)
    quick: bool = setting(False, "a small run for tests: S=4, short streams, two step sizes, "
                                 "no runtime part")


@dataclass(frozen=True, kw_only=True)
class AblationExperiment(ExperimentConfig):
    """experiment=ablation: every non-empty subset of tuner.levers on heterogeneous models."""

    models: tuple[str, ...] = setting(REQUIRED, "model presets (analytic costs on the run's "
                                                "cluster)")
    profiles: tuple[str, ...] = setting(REQUIRED, "published profiles (cost=file presets), on "
                                                  "the run's cluster with its links")
    devices: int = setting(REQUIRED, "pipeline devices", ge=1)
    microbatches: int = setting(REQUIRED, "micro-batches", ge=1)
    max_evaluations: int = setting(REQUIRED, "tuner.max_evaluations of each subset's search",
                                   ge=1)


@dataclass(frozen=True, kw_only=True)
class RrfpExperiment(ExperimentConfig):
    """experiment=rrfp: strict versus ready-first dispatch under variability (RRFP, §3 of
    Ilin & Richtárik 2026), simulated and run."""

    language: str = setting("tiny_hybrid", "the language workload (model preset)")
    multimodal: str = setting("tiny_vlm", "the multimodal workload (model preset)")
    language_seq_len_cv: float = setting(0.0, "language: sequence length variability", ge=0, le=3)
    multimodal_seq_len_cv: float = setting(0.25, "multimodal: text length variability (lognormal CV; "
                                                 "the RRFP paper (arXiv 2605.18750) names input-length "
                                                 "variance without a distribution)", ge=0, le=3)
    multimodal_images_max: int = setting(4, "multimodal: images per sample drawn from 1..this; they drive "
                                            "the ViT layers and the image tokens' share of the language "
                                            "layers (octopipe.sim.variability.image_share)", ge=1)
    split_share: float = setting(0.5, "both workloads: heavy layers (head, MLP) cut into pieces by the "
                                      "planner's split_layers rule (octopipe.tune.splitting): of whole layers "
                                      "and pieces capped at 1, 1/2, 1/4 of this share of a mean stage, the "
                                      "fewest pieces whose balanced partition's largest stage is within 1% "
                                      "of the lowest", gt=0)
    jitter_cvs: tuple[float, ...] = setting((0.0, 0.1, 0.3, 0.5), "compute jitter levels", ge=0, le=3)
    straggler_cv: float = setting(0.1, "the straggler case's jitter", ge=0, le=3)
    straggler_prob: float = setting(0.05, "the straggler case: probability per action", ge=0, le=1)
    straggler_factor: float = setting(3.0, "the straggler case: slow-down", ge=1)
    hints: tuple[Literal["table", "bf", "bfw"], ...] = setting(("table", "bf", "bfw"),
                                                               "ready-first hints")
    emulated_ranks: int = setting(8, "ranks of the emulated runs (0: none)", ge=0)
    emulated_microbatches: int = setting(16, "micro-batches of the emulated runs", ge=1)
    emulate_step_s: float = setting(0.005, "emulated: mean stage F seconds", gt=0)
    real_ranks: int = setting(2, "ranks of the real-compute runs (0: none)", ge=0, le=4)
    real_microbatches: int = setting(8, "micro-batches of the real-compute runs", ge=1)
    iterations: int = setting(3, "measured iterations per run (paired across policies)", ge=1)
    warmup: int = setting(1, "iterations before them", ge=0)
    monte_carlo: int = setting(20, "simulated seeds per point", ge=1)
    max_inflight: int | None = setting(
        None, "ready-first runs: cap on micro-batches live per rank (null: none, RRFP's "
              "message-driven buffers; the simulator also reports each rank capped at its own "
              "row's need)", ge=1)
    real_jitter_cvs: tuple[float, ...] = setting((0.0, 0.5), "real compute: jitter levels (no "
                                                             "straggler case)", ge=0, le=3)
    real_hints: tuple[Literal["table", "bf", "bfw"], ...] = setting(("bf", "bfw"),
                                                                    "real compute: hints")
    real_rounds: int = setting(3, "real compute: rounds of launches; table/bf: an A/B launch each (strict and "
                                  "ready-first alternating by iteration), pairs pooled; bfw: strict and bfw "
                                  "launched alternately (reversed every other round), the median over the "
                                  "rounds with half the interquartile range as spread", ge=1)
    tp: int = setting(2, "emulated runs with this many TP ranks per pipeline rank (emulated_ranks "
                         "/ tp pipeline ranks; 1: none)", ge=1, le=8)
    tp_jitter_cvs: tuple[float, ...] = setting((0.0, 0.5), "the TP runs' jitter levels", ge=0, le=3)
    tp_hints: tuple[Literal["table", "bf", "bfw"], ...] = setting(("bfw",), "the TP runs' hints")
    tp_emulate_step_s: float = setting(
        0.02, "emulated TP runs: mean stage F seconds (an agreement round among 8 processes on a few CPU "
               "cores is a large share of a short task, on RRFP's GPUs well under 1%: the longer step brings "
               "it back to a few percent; measured in docs/runtime.md)", gt=0)
    tp_microbatches: int = setting(8, "micro-batches of the emulated TP runs (fewer than emulated_microbatches: "
                                      "their longer step)", ge=1)
    tp_check: bool = setting(True, "tp = 2: every layer kind of both workloads against the whole "
                                   "layer, and the cost of one agreement (2 gloo ranks)")
    quick: bool = setting(False, "a small grid for tests: CV 0 and 0.5, the bfw hint, at most 4 "
                                 "emulated ranks, 4 micro-batches, one iteration, 3 seeds, at most 2 "
                                 "real rounds")


@dataclass(frozen=True, kw_only=True)
class RobustExperiment(ExperimentConfig):
    """experiment=robust: the nominal plan against the robust plan (tuner.objective=mean) under
    variability, evaluated on held-out seeds in the simulator and on the emulated runtime."""

    multimodal: str = setting("qwen2_vl_7b", "the multimodal workload, simulated (model preset)")
    hybrid: str = setting("nemotron_h_8b", "the hybrid workload, simulated (model preset)")
    multimodal_emulated: str = setting("tiny_vlm", "the multimodal workload on the emulated runtime")
    hybrid_emulated: str = setting("tiny_hybrid", "the hybrid workload on the emulated runtime")
    pp: int = setting(8, "pipeline ranks (simulated and emulated)", ge=2, le=16)
    microbatches: int = setting(16, "micro-batches per iteration", ge=1)
    jitter_cvs: tuple[float, ...] = setting((0.0, 0.1, 0.3, 0.5), "compute jitter levels", ge=0, le=3)
    straggler_cv: float = setting(0.1, "the straggler case's jitter", ge=0, le=3)
    straggler_prob: float = setting(0.05, "the straggler case: probability per action", ge=0, le=1)
    straggler_factor: float = setting(3.0, "the straggler case: slow-down", ge=1)
    multimodal_seq_len_cv: float = setting(0.25, "multimodal: text length variability", ge=0, le=3)
    multimodal_images_max: int = setting(4, "multimodal: images per sample drawn from 1..this", ge=1)
    split_share: float = setting(0.5, "heavy layers cut into pieces up front (as experiment=rrfp)", gt=0)
    dispatch: Literal["strict", "ready_first"] = setting("ready_first", "the dispatch both plans run with")
    samples: int = setting(32, "the robust tuner's Monte Carlo samples per finalist", ge=2)
    heldout: int = setting(64, "held-out simulated draws per plan (seeds other than the tuner's)", ge=2)
    heldout_seed: int = setting(12345, "the first held-out seed", ge=0)
    max_evaluations: int = setting(4000, "the tuner's search budget for both plans", ge=1)
    emulated_iterations: int = setting(6, "measured iterations per emulated launch (0: no emulation)", ge=0)
    emulated_warmup: int = setting(1, "emulated: iterations before them", ge=0)
    emulate_step_s: float = setting(0.05, "emulated: mean per-rank F seconds of a micro-batch (long enough "
                                    "that a rank's per-action overhead on shared cores stays small)", gt=0)


EXPERIMENTS: dict[str, type[ExperimentConfig]] = {
    "octopipe_authors": OctoPipeAuthorsExperiment, "tabular": TabularExperiment,
    "layouts": LayoutsExperiment, "pipedream": PipeDreamExperiment, "ablation": AblationExperiment,
    "rrfp": RrfpExperiment, "robust": RobustExperiment,
    "suite": ExperimentConfig, "suite_large": ExperimentConfig}
