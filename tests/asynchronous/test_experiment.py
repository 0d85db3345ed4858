"""experiment=pipedream (quick) in process: the summary keys the issue lists, the delay law,
the equal-budget runs, the report's verdicts."""
import json

from hydra import compose, initialize_config_dir

from octopipe.config.loader import load
from octopipe.config.store import register
from octopipe.experiments import pipedream as experiment
from octopipe.io import CONF_DIR
from octopipe.modes.inputs import Inputs
from octopipe.schedule.library import SCHEDULE_PRESETS

KEYS = {"delay_by_stages", "delay_law_residual", "final_objective", "winner", "timeline_ticks",
        "timeline_microbatches", "runtime_max_rel_err", "runtime_throughput_vs_1f1b"}


def test_quick_experiment(tmp_path):
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = load(compose("config", overrides=["experiment=pipedream", "experiment.quick=true"]))
    res = experiment.run(Inputs(cfg))
    s = res.summary
    assert set(s) >= KEYS
    json.dumps(s)
    assert all(abs(r) <= 1 for r in s["delay_law_residual"].values())
    assert s["delay_by_stages"][16]["max"] == 16 ** 2 - 8
    assert set(s["final_objective"]) == {"quadratic", "logistic", "char_lm"}
    for name, by_method in s["final_objective"].items():
        assert set(by_method) >= {"1f1b", "pd", "rpd_matched", "rpd_uniform"}
        assert s["winner"][name][4] in by_method
    # at equal budgets the stream of M micro-batches is shortest for PD
    ticks = s["timeline_ticks"]
    assert ticks["pd"][4] < ticks["localsgd"][4] < ticks["1f1b"][4] and s["timeline_microbatches"] == 40
    report = res.report[0]
    assert "matches" in report and "S² − S/2" in report
    assert {a.name for a in res.artifacts} >= {"report.md", "delay_law.png", "objective_vs_ticks.png"}
