"""mode=simulate on an asynchronous schedule: versions held, stash bytes and throughput
against flushed 1F1B in its summary; impossible streams refused naming the field."""
import pytest
from hydra import compose, initialize_config_dir

from octopipe.config.loader import load
from octopipe.config.store import register
from octopipe.errors import ConfigError, ScheduleError
from octopipe.io import CONF_DIR
from octopipe.modes import execute as execute_mode
from octopipe.modes import simulate
from octopipe.modes.inputs import Inputs
from octopipe.schedule.library import SCHEDULE_PRESETS


def _inputs(*overrides):
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return Inputs(load(compose("config", overrides=["model=tiny_moe", *overrides])))


@pytest.mark.parametrize("name, held", [("pipedream", [4, 3, 2, 1]), ("pipedream_2bw", [2, 2, 2, 2]),
                                        ("pipedream_vsync", [4, 4, 3, 2])])
def test_simulate_reports_versions_stash_and_throughput(name, held):
    s = simulate.run(_inputs(f"schedule={name}", "pp=4", "microbatches=32")).summary["asynchronous"]
    assert s["versions_held"] == held
    assert all(b > 0 for b, h in zip(s["stash_bytes"], held) if h > 1)
    assert s["peak_memory_with_stash_bytes"] > 0
    # a stream of 32 without flushes beats 1F1B flushed every 4 micro-batches
    assert s["throughput_vs_1f1b"] > 1.2
    assert sum(s["updates_per_stage"]) == (32 * 4 if name != "pipedream_2bw" else 8 * 4)


def test_impossible_streams_and_flushing_modes_say_so():
    with pytest.raises(ScheduleError, match="microbatches"):
        simulate.run(_inputs("schedule=pipedream", "pp=4", "microbatches=2"))
    with pytest.raises(ScheduleError, match="does not divide"):
        simulate.run(_inputs("schedule=pipedream_2bw", "pp=4", "microbatches=10"))
    with pytest.raises(ConfigError, match="flushes every iteration.*mode=train schedule=pipedream"):
        execute_mode.run(_inputs("mode=execute", "schedule=pipedream", "pp=2", "microbatches=4",
                                 "runtime.compute=emulated"))
