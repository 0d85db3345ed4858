"""Per-stage recomputation: mixed cost tables and the choice under memory."""
from dataclasses import replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from octopipe.cluster import DeviceKind
from octopipe.config.cost import AnalyticCost
from octopipe.config.layout import LayoutConfig
from octopipe.layout import Grid, Layout, LayoutEvaluator
from octopipe.model.build import build_model
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule

ROOT = Path(__file__).resolve().parents[2]


def evaluator(**kw):
    m = build_model(OmegaConf.load(ROOT / "conf" / "model" / "tiny_hybrid.yaml"))
    g = Grid.of(OmegaConf.load(ROOT / "conf" / "cluster" / "h100_1x8.yaml"), 4)
    return m, LayoutEvaluator(m, g, AnalyticCost(), LayoutConfig(global_batch=8, **kw))


def test_mixed_table_takes_each_stage_from_its_level():
    m, ev = evaluator()
    L = Layout(1, 2, 2, 2, 2)
    table = build_schedule("1f1b", 2, 2)
    plan = Plan(Partition.uniform(m.n_layers, 2), table)
    none, full = ev.costs(L, "none"), ev.costs(L, "full")
    mixed = ev.mixed(L, plan, ("none", "full"))
    (a, b), (c, d) = plan.partition
    assert np.array_equal(mixed.i[a:b], none.i[a:b]) and np.array_equal(mixed.i[c:d], full.i[c:d])
    assert np.array_equal(mixed.act_bytes[c:d], full.act_bytes[c:d])
    # full recomputation reruns the forward inside I, before the backward, and keeps less
    assert np.all(full.i[c:d] > none.i[c:d]) and full.act_bytes[c:d].sum() < none.act_bytes[c:d].sum()


def test_relax_lowers_recomputation_where_memory_allows():
    m, ev = evaluator()
    L = Layout(1, 2, 2, 2, 2)
    plan = Plan(Partition.uniform(m.n_layers, 2), build_schedule("1f1b", 2, 2))
    assert ev.relax(L, plan, ("full", "full")) == ("none", "none")       # 80 GB: nothing binds
    fast = ev.finish(L, plan, ("none", "none"), "hand", "1f1b")
    slow = ev.finish(L, plan, ("full", "full"), "hand", "1f1b")
    assert fast.iteration_s < slow.iteration_s and fast.peak_memory_bytes > slow.peak_memory_bytes
    assert slow.recompute_value() == "full" and ev.finish(L, plan, ("none", "full"), "hand",
                                                          "1f1b").recompute_value() == ["none", "full"]


def test_relax_keeps_recomputation_on_the_stage_that_needs_it():
    m, ev = evaluator()
    L = Layout(1, 2, 2, 2, 2)
    plan = Plan(Partition.uniform(m.n_layers, 2), build_schedule("1f1b", 2, 2))
    none = ev.finish(L, plan, ("none", "none"), "hand", "1f1b").sim.peak_memory
    full = ev.finish(L, plan, ("full", "full"), "hand", "1f1b").sim.peak_memory
    cap = (none[0] + none[1]) / 2
    assert none[1] < cap < none[0] and full[0] < cap       # premise: stage 0 holds 2 micro-batches
    g = ev.grid
    small = DeviceKind("small", g.gpus.kinds[0].peak_flops, cap, g.gpus.kinds[0].memory_bandwidth)
    _, tight = evaluator()
    tight.grid = replace(g, gpus=replace(g.gpus, kinds=(small,)))
    assert tight.relax(L, plan, ("full", "full")) == ("full", "none")
