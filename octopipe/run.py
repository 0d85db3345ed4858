"""`python -m octopipe.run`: the Hydra app. Modes live in `octopipe.modes.<mode>`.

The edge: register the config schema, compose, turn the DictConfig into typed values once
(`octopipe.config.load`), build the inputs (`octopipe.modes.inputs.Inputs`, lazily), call
`mode.run(inputs) -> Result` (or the experiment's driver), and hand the Result to the reporter,
which prints it and writes `summary.json` and the artifacts atomically. OctoPipe errors become
one line on stderr and exit 2.
"""
from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console

from octopipe.config import Config, load, register
from octopipe.config.schema import MODES
from octopipe.config.store import registered_presets
from octopipe.errors import ConfigError, OctoPipeError, Terminated
from octopipe.io import CONF_DIR, claim_run_dir, preset_names
from octopipe.modes.inputs import Inputs
from octopipe.modes.report import console_for, publish
from octopipe.schedule.library import SCHEDULE_PRESETS

GROUPS = ("model", "cluster", "schedule", "solver", "tuner", "runtime", "cost", "train", "experiment")


def fail(message: str) -> NoReturn:
    """Print one line (plus a marked grid for table errors) on stderr and exit with status 2."""
    print(f"octopipe: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_grammar(argv: list[str]) -> None:
    """Parse every override with Hydra's own grammar before Hydra starts, so that a bad one (`pp 2`
    without `=`, unquoted parentheses) is one line naming it, with a hint where one helps."""
    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-"):
            continue
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as e:
            reason = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), "")
            if "=" not in arg:
                fail(f"override {arg!r}: expected key=value (e.g. pp=2), got no '='")
            key, _, value = arg.partition("=")
            hint = (f"; quote the value for Hydra, e.g. \"{key}='{value}'\"" if any(c in value for c in "()[]{}*,: ")
                    else "")
            fail(f"override {arg!r} cannot be parsed ({reason.split(' expecting ')[0]}){hint}")


def _choices(value: str) -> list[str]:
    """The presets a value names: one, or a --multirun comma list."""
    return [v.strip() for v in value.split(",")] if "(" not in value else []


def check_overrides(argv: list[str]) -> None:
    """Reject unknown presets and modes before Hydra starts (each name of a --multirun comma list
    too), with the valid choices listed."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("hydra.", "+", "~", "-")):
            continue
        key, _, value = arg.partition("=")
        for one in _choices(value):
            if key in GROUPS and one not in ("null", ""):
                names = sorted(set(preset_names(key)) | set(registered_presets(key)))
                if one not in names:
                    fail(f"unknown {key} preset {one!r}; valid: {', '.join(names) or '(none yet)'}")
            if key == "mode" and one not in MODES:
                fail(f"unknown mode {one!r}; valid: {', '.join(MODES)}")


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


def check_composition(argv: list[str]) -> DictConfig | None:
    """Compose the config once before Hydra runs, so that an override Hydra rejects (a key the
    preset lacks, bad grammar) is one line and exit 2 rather than Hydra's multi-line report.
    Skipped when flags are given (--multirun, --help, --cfg, ...): Hydra handles those itself.
    The values themselves are checked by `load` when the run starts (one line, exit 2). Returns
    the composed config with its `hydra` node (None when skipped)."""
    if any(a.startswith("-") for a in argv):
        return None
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose("config", overrides=[a for a in argv if "=" in a], return_hydra_config=True)
    except Exception as e:  # Hydra's composition and grammar errors share no narrower base
        fail(composition_error(e))


def _hydra_quoted(path: str) -> str:
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def with_run_dir(argv: list[str], cfg: DictConfig | None) -> list[str]:
    """`argv` with `hydra.run.dir` set to a directory this run has claimed (`claim_run_dir`): two
    runs started in the same second, or a user's directory holding another run's results, never
    share one; a fresh subdirectory is said on stdout. A directory that cannot be created is a
    ConfigError (one line)."""
    if cfg is None or str(OmegaConf.select(cfg, "hydra.mode", default="")).endswith("MULTIRUN"):
        return argv                 # a sweep: Hydra's sweep directory holds one per job
    given = [a for a in argv if a.startswith("hydra.run.dir=")]
    if given and not given[-1].partition("=")[2].strip():
        raise ConfigError("hydra.run.dir is empty; give a directory, or leave it out for "
                          "runs/<date>/<time>_<mode>")
    try:
        wanted = str(OmegaConf.select(cfg, "hydra.run.dir", throw_on_resolution_failure=True))
        mode = str(cfg.get("mode", "run"))
    except OmegaConfBaseException:
        return argv                 # a directory only Hydra can resolve: Hydra makes it
    out = claim_run_dir(wanted, f"{time.strftime('%H-%M-%S')}_{mode}", bool(given))
    if given and out != Path(wanted):
        print(f"note: {wanted} holds another run; this run writes into {out}")
    return [a for a in argv if not a.startswith("hydra.run.dir=")] + [f"hydra.run.dir={_hydra_quoted(str(out))}"]


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
    if not callable(getattr(module, "run", None)):
        raise ConfigError(f"experiment.driver={target}: the module has no run(inputs) function; give a module "
                          f"whose run(inputs) returns a Result (e.g. octopipe.experiments.tabular)")
    inputs = Inputs(config, interactive=console.is_terminal,
                    progress=lambda line: console.print(f"[dim]{line}[/dim]"), run_dir=out_dir)
    return publish(module.run(inputs), config.mode, out_dir, console)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def _app(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        dispatch(cfg, out_dir)
    except OctoPipeError as e:
        fail(str(e))
    except OmegaConfBaseException as e:
        fail(f"config: {e}".splitlines()[0])
    except UnicodeDecodeError as e:
        fail(f"an input file is not UTF-8 text ({e.reason} at byte {e.start}); give a text file")
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        fail(f"cannot read or write{where}: {e.strerror or e}")
    print(f"results: {out_dir}")


def _forget_unhandled_interrupt() -> None:
    """Keep exit 130 after a caught Ctrl-C. CPython marks a KeyboardInterrupt that leaves a string
    `exec`/`eval` (dataclasses and namedtuples build their methods that way) as unhandled even
    when it is caught later, and under `python -m` then ends the process by SIGINT instead of
    the exit code given; the next string `exec` clears that mark."""
    exec("pass", {})


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def stops_cleanly() -> Iterator[None]:
    """Ctrl-C and SIGTERM/SIGHUP end the run through every `finally` (ranks stopped, temporary
    files removed), then print one line: exit 130 for Ctrl-C, 128 + the signal otherwise."""
    handled = [s for s in (signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(s) is not signal.SIG_IGN]     # nohup's ignored SIGHUP stays so
    previous = {s: signal.signal(s, _terminate) for s in handled}
    try:
        yield
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C: no traceback on the way out
        _forget_unhandled_interrupt()
        print("octopipe: interrupted", file=sys.stderr)
        sys.exit(130)
    except Terminated as t:
        print(f"octopipe: terminated by {signal.Signals(t.signum).name}", file=sys.stderr)
        sys.exit(128 + t.signum)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main() -> None:
    with stops_cleanly():
        register(SCHEDULE_PRESETS)
        argv = sys.argv[1:]
        check_grammar(argv)
        check_overrides(argv)
        cfg = check_composition(argv)
        try:
            argv = with_run_dir(argv, cfg)
        except OctoPipeError as e:
            fail(str(e))
        sys.argv = [sys.argv[0], *argv]
        _app()


if __name__ == "__main__":
    main()
