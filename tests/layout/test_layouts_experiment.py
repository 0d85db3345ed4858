"""experiment=layouts on a tiny case: the chosen layout against the hand layout and the oracle."""
from hydra import compose, initialize_config_dir

from octopipe.config import load, register
from octopipe.config.experiment import HandLayout, LayoutCase, LayoutsExperiment
from octopipe.experiments.layouts import markdown, run_case
from octopipe.io import CONF_DIR
from octopipe.modes.inputs import Inputs
from octopipe.schedule.library import SCHEDULE_PRESETS


def inputs(*overrides) -> Inputs:
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return Inputs(load(compose("config", overrides=list(overrides))))


def test_the_preset_loads_its_cases():
    exp = inputs("experiment=layouts").config.experiment
    assert isinstance(exp, LayoutsExperiment) and len(exp.cases) >= 5
    assert exp.cases[0].model == "llama3_70b" and exp.cases[0].hand.chunks == 5


def test_tiny_case_chosen_beats_hand_and_matches_the_oracle():
    case = LayoutCase(model="tiny_hybrid", cluster="h100_1x8", gpus=4, global_batch=8,
                      exhaustive=True, hand=HandLayout(tp=2, pp=2, dp=1, micro_batch_size=2,
                                                       schedule="1f1b"))
    row = run_case(case, inputs("mode=layout", "layout.tuned=3", "layout.micro_batch_sizes=[1,2]"))
    assert row["hand"]["how"] == "hand" and row["hand"]["tp"] == 2 and row["hand"]["microbatches"] == 4
    assert row["chosen"]["iteration_s"] <= row["hand"]["iteration_s"] * (1 + 1e-9)
    assert row["speedup_vs_hand"] >= 1 - 1e-9
    assert row["chosen_vs_exhaustive"] <= 1.01
    assert "tiny_hybrid" in markdown([row])
