"""Files at the edges: the config directory, atomic writes, run directories.

The CLI and the benchmarks write results only through here, so a result is never half-written.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def json_text(doc: Any) -> str:
    """The project's JSON form: indented, sorted keys, numpy values as plain numbers."""
    return json.dumps(doc, indent=2, sort_keys=True, default=_jsonable) + "\n"


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text))


def write_json(path: Path, doc: Any) -> None:
    """Write JSON via a temporary file and rename, so a result is never half-written."""
    write_text(path, json_text(doc))


def preset_names(group: str) -> list[str]:
    """The presets of config group `group` (conf/<group>/*.yaml), sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
