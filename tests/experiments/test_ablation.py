"""experiment=ablation's pieces: the 15 lever subsets, one workload (the full set never worse
than any subset, by construction) and the sentence per model."""
from octopipe.config.experiment import AblationExperiment
from octopipe.config.tuner import LEVERS, TunerConfig
from octopipe.experiments.ablation import FULL, Row, Workload, run_workload, sentence, subsets, table_csv
from octopipe.tune.splitting import row_splitter
from tests.tune.helpers import free_cluster
from tests.tune.test_tuner import hetero_costs


def test_subsets_are_every_nonempty_lever_set_full_last():
    s = subsets()
    assert len(s) == 2 ** len(LEVERS) - 1 == len(set(s)) and s[-1] == FULL


def test_one_workload_full_never_worse_than_any_subset():
    costs = hetero_costs()
    cl = free_cluster(4, memory_bytes=60 * 2**30, latency=1e-5, bandwidth=50e9)
    w = Workload("hetero", "preset", costs, cl, row_splitter(costs, [True] * costs.n_layers))
    exp = AblationExperiment(name="ablation", models=(), profiles=(), devices=4, microbatches=8,
                             max_evaluations=120)
    rows = run_workload(w, exp, TunerConfig(ilp=False, max_iters=10, patience=3, finalists=2), 0)
    assert [r.levers for r in rows] == subsets()
    full = rows[-1]
    assert all(full.makespan_s <= r.makespan_s * (1 + 1e-12) for r in rows)
    assert full.speedup >= 1.0 - 1e-9          # every baseline competes with the full set
    assert "hetero: co-optimizing all levers gives" in sentence(rows)
    assert table_csv(rows).count("\n") == len(rows) + 1


def test_sentence_names_levers_that_hurt():
    def row(levers, sp):
        return Row("m", "preset", levers, 1.0 / sp, "ZB-H1", sp, 1.0, "converged")
    rows = [row(s, 0.8 if len(s) == 1 else 1.1) for s in subsets()]
    text = sentence(rows)
    assert "partition, placement, schedule, split_layers alone fall below" in text
