"""`python -m octopipe.run`: the Hydra app. Modes live in `octopipe.modes.<mode>`.

Each mode module exposes `run(cfg, out_dir) -> dict`; this edge turns the returned figures into
`summary.json` (written atomically) and turns OctoPipe errors into one line on stderr, exit 2.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from octopipe.errors import OctoPipeError

MODES = ("plan", "inspect", "simulate", "compare", "solvers", "execute")
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("model", "cluster", "schedule", "solver", "tuner", "runtime", "cost", "experiment")


def fail(message: str) -> "None":
    """Print one line (plus a marked grid for table errors) on stderr and exit with status 2."""
    print(f"octopipe: error: {message}", file=sys.stderr)
    sys.exit(2)


def write_json(path: Path, doc: dict) -> None:
    """Write JSON via a temporary file and rename, so a result is never half-written."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=_jsonable) + "\n")
    os.replace(tmp, path)


def _jsonable(x):
    import numpy as np
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def check_overrides(argv: list[str]) -> None:
    """Reject unknown presets and modes before Hydra starts, with the valid choices listed."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("hydra.", "+", "~", "-")):
            continue
        key, _, value = arg.partition("=")
        if key in GROUPS and "," not in value and value not in ("null", ""):
            folder = CONF_DIR / key
            names = sorted(p.stem for p in folder.glob("*.yaml"))
            if value not in names:
                fail(f"unknown {key} preset {value!r}; valid: {', '.join(names) or '(none yet)'}")
        if key == "mode" and "," not in value and value not in MODES:
            fail(f"unknown mode {value!r}; valid: {', '.join(MODES)}")


def check_composition(argv: list[str]) -> None:
    """Compose the config once before Hydra runs, so that an override Hydra rejects (a key the
    preset lacks, bad grammar) is one line and exit 2 rather than Hydra's multi-line report.
    Skipped when flags are given (--multirun, --help, --cfg, ...): Hydra handles those itself."""
    if any(a.startswith("-") for a in argv):
        return
    from hydra import compose, initialize_config_dir
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            compose("config", overrides=[a for a in argv if "=" in a])
    except Exception as e:  # Hydra's composition and grammar errors share no narrower base
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        msg = lines[0] if lines else type(e).__name__
        if e.__cause__ is not None and str(e.__cause__).strip():
            msg += " " + str(e.__cause__).strip().splitlines()[0]
        fail(f"override: {msg}")


def dispatch(cfg: DictConfig, out_dir: Path) -> dict:
    mode = str(cfg.mode)
    if mode not in MODES:
        raise OctoPipeError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    # An experiment may name its own driver module (same `run(cfg, out_dir)` contract).
    driver = OmegaConf.select(cfg, "experiment.driver", default=None)
    target = str(driver) if driver else f"octopipe.modes.{mode}"
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name == target:
            raise OctoPipeError(f"{'experiment driver ' + target if driver else 'mode=' + mode} "
                                f"is not available in this version") from e
        raise
    summary = module.run(cfg, out_dir)
    summary = {"mode": mode, **summary}
    write_json(out_dir / "summary.json", summary)
    return summary


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
    check_overrides(sys.argv[1:])
    check_composition(sys.argv[1:])
    _app()


if __name__ == "__main__":
    main()
