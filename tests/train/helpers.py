"""Tiny training setups shared by the tests: a user module, a hybrid of every text layer kind,
their data, and one-call pipeline and reference runs."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from octopipe.config.runtime import RuntimeConfig
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.plan import Partition, Plan
from octopipe.runtime.job import Job
from octopipe.schedule.library import build_schedule
from octopipe.train.data import TokenBatches, load_corpus
from octopipe.train.loop import TrainRun, TrainSpec, launch_training, reference_train
from octopipe.train.optim import OptimSettings
from octopipe.train.summary import compare

ROOT = Path(__file__).resolve().parent.parent.parent
OPTIM = OptimSettings(lr=1e-2, warmup_steps=3, total_steps=20, clip_norm=1.0)


def gpt(seq: int = 16, mbs: int = 2) -> UserBlocks:
    """examples/tiny_gpt.py at width 32, depth 2: 4 blocks."""
    return check_blocks(UserBlocks(f"{ROOT}/examples/tiny_gpt.py:build", seq, mbs, 256,
                                   (("width", 32), ("depth", 2), ("heads", 2))))


def batches(seq: int, mbs: int, vocab: int = 256) -> TokenBatches:
    tokens = load_corpus("")
    return TokenBatches(tokens if vocab >= 256 else (tokens % vocab).astype(np.uint8), seq, mbs, seed=0)


def named_plan(name: str, n_blocks: int, pp: int = 2, m: int = 4) -> Plan:
    table = build_schedule(name, pp, m)
    return Plan(Partition.uniform(n_blocks, table.n_stages), table)


def train(blocks, plan: Plan, data, steps: int = 20, optim: OptimSettings = OPTIM, **job) -> TrainRun:
    """`steps` steps of `plan` on 2 local ranks (job: TrainSpec fields, e.g. checkpoints, and
    `autocast`, `dispatch`) through the runtime's one route."""
    with tempfile.TemporaryDirectory() as d:
        run_job = Job(plan, blocks, RuntimeConfig(dispatch=job.pop("dispatch", "strict"), timeout_s=240, stall_s=120),
                      data=data, autocast=job.pop("autocast", ""))
        return launch_training(run_job, TrainSpec(optim, steps, **job), d)


class ReversedMicrobatches:
    """The same batches with each step's micro-batches in reverse order: the same mean gradient,
    summed in another order."""

    def __init__(self, data, n: int) -> None:
        self.data, self.n = data, n

    def batch(self, step: int, mb: int) -> dict:
        return self.data.batch(step, self.n - 1 - mb)


def weight_floor(blocks, data, ref: TrainRun, optim: OptimSettings = OPTIM, steps: int = 20) -> float:
    """The reference's own final-weight spread when each step's micro-batches are summed in
    reverse order: the rounding a pipeline's other summation order may show (AdamW magnifies it
    in parameters whose true gradient is zero, such as an attention key's bias)."""
    again = reference_train(blocks, ReversedMicrobatches(data, 4), 4, optim, steps)
    return compare(again, ref, blocks, {})[1]
