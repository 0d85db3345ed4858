"""A Job as the ranks receive it: links resolved, emulated sleeps scaled, nothing launched."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.errors import ScheduleError
from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.emulation import emulation
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute, rank_job
from octopipe.schedule.library import build_schedule
from tests.runtime import tiny


def test_rank_job_resolves_links_and_counts_warmup_and_measured_iterations():
    table = build_schedule("1f1b", 2, 2)
    job = Job(Plan(uniform_partition(6, 2), table), tiny.dense(2), RuntimeConfig(iterations=3, warmup=2), seed=7,
              init_method="tcp://127.0.0.1:1")
    assert job.total_iterations == 5 and list(job.measured) == [2, 3, 4]
    rank = rank_job(job, table, "/tmp")
    assert (rank.wiring.transport, rank.wiring.device, rank.iterations, rank.seed) == ("tagged", "cpu", 5, 7)
    assert rank.wiring.init_method == "tcp://127.0.0.1:1" and rank.wiring.world == 2
    assert rank.model is job.model and rank.compute.cpus == () and rank.compute.durations == {}


def test_emulation_scales_the_mean_stage_forward_and_the_largest_message():
    table = build_schedule("1f1b", 2, 2)
    costs = CostTable.uniform(4, f=2.0, i=3.0, w=1.0, out_bytes=4096)
    config = RuntimeConfig(compute="emulated", emulate_step_s=0.01, max_message_bytes=1024)
    job = Job(Plan(uniform_partition(4, 2), table), None, config, costs=costs)
    emu = emulation(job)
    assert emu.durations[0] == pytest.approx((0.01, 0.015, 0.005))
    assert emu.message_elems == {0: 256, 1: 256}
    assert np.allclose(emu.costs.f, 0.005)
    rank = rank_job(job, table, "/tmp")
    assert rank.model is None and rank.compute.durations == emu.durations


def test_emulated_compute_without_costs_is_rejected_before_any_process_starts():
    table = build_schedule("1f1b", 2, 2)
    job = Job(Plan(uniform_partition(4, 2), table), None, RuntimeConfig(compute="emulated"))
    with pytest.raises(ScheduleError, match="needs the modelled costs"):
        execute(job)
