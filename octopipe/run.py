"""`python -m octopipe.run`: the Hydra app. Modes live in `octopipe.modes.<mode>`.

The edge: register the config schema, compose, turn the DictConfig into typed values once
(`octopipe.config.load`), build the inputs (`octopipe.modes.inputs.Inputs`, lazily), call
`mode.run(inputs) -> Result` (or the experiment's driver), and hand the Result to the reporter,
which prints it and writes `summary.json` and the artifacts atomically. OctoPipe errors become
one line on stderr and exit 2.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console

from octopipe.config import Config, load, register
from octopipe.config.store import registered_presets
from octopipe.config.schema import MODES
from octopipe.errors import OctoPipeError
from octopipe.io import CONF_DIR, preset_names
from octopipe.modes.inputs import Inputs
from octopipe.modes.report import console_for, publish
from octopipe.schedule.library import SCHEDULE_PRESETS

GROUPS = ("model", "cluster", "schedule", "solver", "tuner", "runtime", "cost", "train", "experiment")


def fail(message: str) -> NoReturn:
    """Print one line (plus a marked grid for table errors) on stderr and exit with status 2."""
    print(f"octopipe: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_overrides(argv: list[str]) -> None:
    """Reject unknown presets and modes before Hydra starts, with the valid choices listed."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("hydra.", "+", "~", "-")):
            continue
        key, _, value = arg.partition("=")
        if key in GROUPS and "," not in value and value not in ("null", ""):
            names = sorted(set(preset_names(key)) | set(registered_presets(key)))
            if value not in names:
                fail(f"unknown {key} preset {value!r}; valid: {', '.join(names) or '(none yet)'}")
        if key == "mode" and "," not in value and value not in MODES:
            fail(f"unknown mode {value!r}; valid: {', '.join(MODES)}")


def composition_error(e: Exception) -> str:
    """Hydra's multi-line report of a rejected override as one line naming the key."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    cause = e.__cause__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0]
        full_key = getattr(cause, "full_key", None)
        if full_key and full_key not in msg and full_key not in first:
            first = f"{full_key}: {first}"
        msg += " " + first
    return f"override: {msg}"


def check_composition(argv: list[str]) -> None:
    """Compose the config once before Hydra runs, so that an override Hydra rejects (a key the
    preset lacks, bad grammar) is one line and exit 2 rather than Hydra's multi-line report.
    Skipped when flags are given (--multirun, --help, --cfg, ...): Hydra handles those itself.
    The values themselves are checked by `load` when the run starts (one line, exit 2)."""
    if any(a.startswith("-") for a in argv):
        return
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            compose("config", overrides=[a for a in argv if "=" in a])
    except Exception as e:  # Hydra's composition and grammar errors share no narrower base
        fail(composition_error(e))


def module_of(config: Config) -> str:
    """The module that runs `config`: the experiment's driver, else the mode's."""
    driver = config.experiment.driver if config.experiment is not None else None
    return driver or f"octopipe.modes.{config.mode}"


def dispatch(cfg: DictConfig, out_dir: Path, console: Console | None = None) -> dict[str, Any]:
    """Run the mode `cfg` asks for and report it into `out_dir`; the summary written."""
    console = console or console_for(160)
    config = load(cfg)
    target = module_of(config)
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name == target:
            what = f"experiment driver {target}" if target != f"octopipe.modes.{config.mode}" \
                else f"mode={config.mode}"
            raise OctoPipeError(f"{what} is not available in this version") from e
        raise
    inputs = Inputs(config, interactive=console.is_terminal,
                    progress=lambda line: console.print(f"[dim]{line}[/dim]"))
    return publish(module.run(inputs), config.mode, out_dir, console)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def _app(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        dispatch(cfg, out_dir)
    except OctoPipeError as e:
        fail(str(e))
    except OmegaConfBaseException as e:
        fail(f"config: {e}".splitlines()[0])
    print(f"results: {out_dir}")


def main() -> None:
    register(SCHEDULE_PRESETS)
    check_overrides(sys.argv[1:])
    check_composition(sys.argv[1:])
    _app()


if __name__ == "__main__":
    main()
