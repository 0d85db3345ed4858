"""tuner.levers: every subset runs, a lever left out keeps S-1F1B's value, caller plans make the
full search never worse than a subset, and a bad lever set is one line, exit 2."""
import itertools

import pytest

from octopipe.config.tuner import LEVERS, TunerConfig
from octopipe.errors import ConfigError
from octopipe.plan import Partition
from octopipe.tune import TuneOptions, tune
from octopipe.tune.splitting import row_splitter
from tests.reliability.cli import run_in_process

from .helpers import free_cluster
from .test_tuner import hetero_costs

CFG = {"max_iters": 12, "patience": 4, "ilp": False, "max_evaluations": 150, "finalists": 2}


def test_every_subset_runs_and_frozen_levers_stay_at_s1f1b():
    costs, cl = hetero_costs(), free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    splitter = row_splitter(costs, [True] * costs.n_layers)
    results = {}
    for r in range(1, len(LEVERS) + 1):
        for sub in itertools.combinations(LEVERS, r):
            res = tune(costs, cl, 4, 8, TuneOptions({**CFG, "levers": list(sub)}, splitter=splitter))
            plan = res.plan
            if "split_layers" not in sub:
                assert not plan.pieces, sub
            if not plan.pieces:
                if "partition" not in sub:
                    assert plan.partition == Partition.uniform(costs.n_layers, 4), sub
                if "placement" not in sub:
                    assert tuple(plan.placement) == (0, 1, 2, 3), sub
            if "schedule" not in sub:
                assert not plan.table.splits_backward and "row_moves" not in plan.meta, sub
            results[sub] = res
    subset_plans = [r.plan for s, r in results.items() if s != tuple(LEVERS)]
    full = tune(costs, cl, 4, 8, TuneOptions(CFG, splitter=splitter, plans=subset_plans))
    assert full.makespan_s <= min(r.makespan_s for r in results.values()) * (1 + 1e-12)


@pytest.mark.parametrize("levers", [(), ("partition", "gears")])
def test_bad_lever_sets_are_config_errors(levers):
    with pytest.raises(ConfigError, match="tuner.levers"):
        TunerConfig(levers=levers)


def test_cli_unknown_lever_is_one_line_exit_2(tmp_path, capsys):
    code, err = run_in_process(["model=tiny_hybrid", "pp=2", "tuner.levers=[partition,gears]",
                                f"hydra.run.dir={tmp_path}"], capsys)
    assert code == 2
    assert len(err) == 1 and "tuner.levers" in err[0], err


def _plan_cli(tmp_path, capsys, *argv):
    import json
    out = tmp_path / "run"
    code, err = run_in_process(["model=qwen3_30b_a3b", "pp=8", "microbatches=32", "cluster=h100_1x8", *argv,
                                f"hydra.run.dir={out}"], capsys)
    return code, err, (json.loads((out / "summary.json").read_text()) if code == 0 else None)


def test_the_full_search_finds_what_a_lever_subset_finds(tmp_path, capsys, monkeypatch):
    """qwen3_30b_a3b on 8 H100 x 32 micro-batches: only a search from S-1F1B fits memory; the full
    search once refused ("no candidate fits memory") while levers=[partition,schedule] found one."""
    from tests.reliability.cli import ROOT
    monkeypatch.chdir(ROOT)
    code, err, full = _plan_cli(tmp_path / "full", capsys)
    assert code == 0, err
    code, err, sub = _plan_cli(tmp_path / "sub", capsys, "tuner.levers=[partition,schedule]")
    assert code == 0, err
    assert full["makespan_s"] <= sub["makespan_s"] * (1 + 1e-9)


def test_without_the_schedule_lever_the_table_is_s1f1bs_own(tmp_path, capsys, monkeypatch):
    from octopipe.plan_io import load_plan
    from octopipe.schedule.library import build_schedule
    from tests.reliability.cli import ROOT
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    code, err = run_in_process(["model=llama3_8b", "pp=8", "microbatches=32", "tuner.levers=[partition]",
                                f"hydra.run.dir={out}"], capsys)
    assert code == 0, err
    plan, ref = load_plan(out / "plan.json"), build_schedule("1f1b", 8, 32)
    assert tuple(plan.placement) == tuple(range(8)) and plan.table.rows == ref.rows
    # where no partition fits memory in that order, the refusal says so and names the lever
    code, err, _ = _plan_cli(tmp_path / "q", capsys, "tuner.levers=[partition]")
    assert code == 2 and len(err) == 1 and "S-1F1B's order" in err[0] and "add schedule to tuner.levers" in err[0]


@pytest.mark.slow
def test_cutting_layers_never_makes_the_default_plan_slower(tmp_path, capsys, monkeypatch):
    """llama3_8b on 8 H100 x 32 micro-batches: the default plan (layers cut into pieces) once took
    3.658 s where tuner.split_layers=off took 3.613 s; a whole-layer search now runs beside it."""
    from tests.reliability.cli import ROOT
    monkeypatch.chdir(ROOT)
    runs = {}
    for key, extra in (("default", []), ("off", ["tuner.split_layers=off"])):
        out = tmp_path / key
        code, err = run_in_process(["model=llama3_8b", "pp=8", "microbatches=32", *extra,
                                    f"hydra.run.dir={out}"], capsys)
        assert code == 0, err
        import json
        runs[key] = json.loads((out / "summary.json").read_text())["makespan_s"]
    assert runs["default"] <= runs["off"] * (1 + 1e-9)


def _random_instance(seed: int):
    """A small random instance: 5-9 layers (one much heavier), 2-3 devices, memory from half to
    twice what the stages' activations need on average."""
    import numpy as np

    from octopipe.cost.table import CostTable
    rng = np.random.default_rng(seed)
    n, D, M = int(rng.integers(5, 10)), int(rng.integers(2, 4)), int(rng.choice([4, 6, 8]))
    f = rng.uniform(0.5, 3.0, n)
    f[rng.integers(n)] *= rng.uniform(2, 5)
    costs = CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f, f * rng.uniform(0.8, 1.2, n),
                      f * rng.uniform(0.6, 1.1, n), rng.uniform(1, 4, n) * 1e9, rng.uniform(0, 3, n) * 1e9,
                      np.full(n, 1e6), np.ones(n))
    mem = float(rng.uniform(0.5, 2.0) * (costs.act_bytes.sum() * M / D + costs.static_bytes.sum() / D))
    return costs, free_cluster(D, memory_bytes=mem), D, M


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_the_default_search_is_never_beaten_by_a_narrower_one(seed):
    """Property over random small instances: the default search (every lever, pieces allowed) is
    never slower than any lever subset's search or than tuner.split_layers=off, and never refuses
    where one of them finds a plan."""
    from octopipe.errors import InfeasibleError
    costs, cluster, D, M = _random_instance(seed)
    splitter = row_splitter(costs, [True] * costs.n_layers)

    def makespan(**kw) -> float | None:
        try:
            return tune(costs, cluster, D, M, TuneOptions(TunerConfig(max_evaluations=400, ilp=False, **kw),
                                                          seed=0, splitter=splitter)).makespan_s
        except InfeasibleError:
            return None
    full = makespan()
    narrower = {"split_layers=off": makespan(split_layers="off")}
    for k in (1, 2, 3):
        for sub in itertools.combinations(LEVERS, k):
            narrower[",".join(sub)] = makespan(levers=sub)
    found = {k: v for k, v in narrower.items() if v is not None}
    if found:
        assert full is not None, f"the default search refused; {sorted(found)} found plans"
        assert full <= min(found.values()) * (1 + 1e-9), {k: v for k, v in found.items() if v < full}
