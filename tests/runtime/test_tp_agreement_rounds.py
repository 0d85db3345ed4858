"""RRFP's agreement when a rank holds a stage without TP collectives beside one with them: the
collective-free stage's messages keep flowing while a round is in flight (the `feeding` path),
and nothing but the tasks with collectives is agreed."""
from __future__ import annotations

from octopipe.cluster import Link
from octopipe.config.cost import AnalyticCost
from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.analytic import analytic_costs
from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind as K
from octopipe.plan import Plan
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.machine import local_cluster
from octopipe.schedule.action import Action
from octopipe.sim.agreement import agreement_stages, needs_agreement
from octopipe.sim.hints import KIND_CODE
from tests.runtime.random_tables import random_table


def test_a_collective_free_stage_runs_during_rounds_and_is_never_agreed():
    model = build_model(preset("model", "tiny_vlm"))
    assert model.layers[0].kind is K.PATCH_EMBED
    n = model.n_layers
    partition = ((0, 1), (1, n // 2), (n // 2, n - 2), (n - 2, n))     # stage 0: the patch embedding alone
    stages = agreement_stages(model, partition, 2)
    assert stages[0] == (False, False, False) and all(f for f, _, _ in stages[1:])
    link = Link("loopback", 5e8, 1e-4)
    costs = analytic_costs(AnalyticCost(tp=2), model, local_cluster(2, link))
    for seed in range(2):
        table = random_table(n_devices=2, n_stages=4, n_microbatches=3, seed=seed, split_prob=0.5)
        config = RuntimeConfig(compute="emulated", dispatch="ready_first", hint="bfw", tp=2, iterations=1,
                               warmup=0, emulate_step_s=0.004, jitter_cv=0.5, transfer_delay=0.5,
                               timeout_s=120.0, stall_s=30.0, max_inflight=None)     # RRFP: no cap
        res = execute(Job(Plan(partition, table), model, config, seed=seed, costs=costs,
                          cluster=local_cluster(2, link)))
        agreed = [[e["action"] for e in sorted((e for e in ev if "action" in e), key=lambda e: e["start"])
                   if needs_agreement(KIND_CODE[Action.parse(e["action"]).kind],
                                      *stages[Action.parse(e["action"]).stage])]
                  for ev in res.events]
        assert agreed[0] == agreed[1] and agreed[2] == agreed[3]
        assert [e["agree_tasks"] for ev in res.events for e in ev if "agree_tasks" in e] == [len(a) for a in agreed]
        assert not any(Action.parse(a).stage == 0 for a in agreed[0] + agreed[2])
