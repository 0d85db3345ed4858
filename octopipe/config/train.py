"""`train`: mode=train, a real training run on the runtime (octopipe/train)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.fields import setting


@dataclass(frozen=True)
class TrainConfig:
    """conf/train/*.yaml. The model is the model group's: a preset, or `model=module
    model.factory=PKG.MOD:FUNC` (a user's blocks); seeded by the top-level `seed`."""

    corpus: str = setting("", "a text file or a directory of them (byte-level tokens); \"\": the "
                              "Python standard library's pydoc_data help topics (no download)")
    max_corpus_mb: float = setting(256.0, "the largest corpus read (megabytes in all), checked before reading",
                                   gt=0)
    tokenizer: Literal["byte", "bpe"] = setting(
        "byte", "byte: UTF-8 bytes (vocabulary 256) | bpe: a byte-level BPE trained on the corpus to "
                "the model's vocabulary (the tokenizers package)")
    steps: int = setting(150, "optimizer steps in all (a resumed run continues up to it)", ge=1)
    lr: float = setting(3e-3, "peak AdamW learning rate", gt=0)
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay of matrices", ge=0)
    warmup_steps: int = setting(10, "linear warm-up steps, then cosine decay to min_lr_ratio", ge=0)
    min_lr_ratio: float = setting(0.1, "the cosine's final rate as a fraction of lr", ge=0, le=1)
    clip_norm: float = setting(1.0, "gradient clipping by the global norm across ranks (0: off)",
                               ge=0)
    precision: Literal["fp32", "bf16"] = setting(
        "fp32", "fp32 | bf16 (forwards under torch.autocast, fp32 master weights and optimizer)")
    pp: int = setting(2, "pipeline ranks of the training run", ge=1)
    dp: int = setting(1, "data-parallel replicas of the pipeline (world = dp x tp x pp processes, Megatron's order: "
                         "tp fastest, then dp, then pp); the step's micro-batches are dp x train.microbatches",
                      ge=1)
    tp: int = setting(1, "tensor-parallel ranks per stage (a preset's attention, MLP, MoE and vocabulary head split "
                         "Megatron-style; a user's blocks cannot be split)", ge=1, le=64)
    zero: int = setting(0, "1: AdamW state sharded over each stage's dp group (gradients reduce-scattered, "
                           "parameters all-gathered after the update); needs dp > 1", ge=0, le=1)
    recompute: Literal["none", "full", "plan"] = setting(
        "none", "none | full: every stage keeps only its input and recomputes its forward inside its backward | "
                "plan: the per-stage levels of train.layout's layout (full or none per stage)")
    layout: str = setting("", "a mode=layout run directory: train its tp, pp, dp, micro-batch size and count and "
                              "recomputation (the preset scaled down to fit this machine)")
    microbatches: int = setting(8, "micro-batches per step (gradient accumulation)", ge=1)
    dispatch: Literal["strict", "ready_first"] = setting(
        "strict", "strict: each rank runs its row in order, so a run (and a resumed run) repeats bit "
                  "for bit | ready_first: the first ready action (the order in which micro-batches' "
                  "gradients add up may change: equal up to rounding)")
    plan: Literal["tuned", "schedule"] = setting(
        "tuned", "tuned: the tuner's plan on the profiled blocks | schedule: schedule=<name> "
                 "on an even partition")
    trial_steps: int = setting(
        4, "train.plan=tuned: before the run, train the tuner's plan and the fastest named schedule it "
           "simulated for this many steps each (after one to warm up; the run's ranks, pinning and "
           "dispatch) and train the one measured faster; 0: the tuner's plan as it is", ge=0)
    model: str = setting(
        "auto", "auto: the model group's if it has at most runtime.max_params parameters, else "
                "the example factory examples/tiny_gpt.py:build | a preset name forces one")
    checkpoint_every: int = setting(0, "save a checkpoint every N steps and at the end (0: never)",
                                    ge=0)
    checkpoint_dir: str = setting("", "where checkpoints go (claimed by this run: never another run's); \"\": "
                                      "<run dir>/checkpoints")
    resume: str = setting("", "a checkpoint directory (.../step_000010) to continue from")
    tensorboard: bool = setting(False, "also write TensorBoard scalars (loss, lr, grad norm, tokens/s, step "
                                       "time, each rank's idle share) under <run dir>/tensorboard")
    check_reference: bool = setting(False, "also train the single-process reference and report "
                                           "the largest relative loss and weight difference")
    tune_s: float = setting(10.0, "wall-clock safety cap of the tuner for the training plan "
                                  "(its budget is tuner.max_evaluations)", gt=0)
    timeout_s: float = setting(1800.0, "the whole training launch; a run predicted to take longer is refused "
                                       "before it starts", gt=0)
    max_profile_s: float = setting(600.0, "refuse a model whose profiling on this machine is estimated longer",
                                   gt=0)
