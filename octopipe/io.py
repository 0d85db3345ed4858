"""Files at the edges: the config directory, atomic writes, run directories.

The CLI and the benchmarks write results only through here, so a result is never half-written.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from octopipe.errors import ConfigError

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
    """Call `write(tmp)` on a temporary file beside `path`, then rename it into place; a writer
    that has nothing to write (a figure of a case the run left out) leaves no file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        if tmp.exists():
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text))


def write_json(path: Path, doc: Any) -> None:
    """Write JSON via a temporary file and rename, so a result is never half-written."""
    write_text(path, json_text(doc))


_SPECIAL = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def regular_file(path: str | Path, what: str, max_bytes: int | None = None, limit: str = "") -> int:
    """The size of `path` once it is known to be a regular file (a FIFO would block a read and a
    device never end one) of at most `max_bytes`; ConfigError naming `what` (the field) and what
    the path is otherwise. `limit` names the setting that raises `max_bytes`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what}={str(path)!r}: does not exist; give a file") from None
    except OSError as e:
        why = "a symbolic link loop" if e.errno == errno.ELOOP else f"cannot be read ({e.strerror})"
        raise ConfigError(f"{what}={str(path)!r}: {why}; give a file") from None
    for test, name in _SPECIAL:
        if test(st.st_mode):
            raise ConfigError(f"{what}={str(path)!r}: {name}, not a regular file; give a file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise ConfigError(f"{what}={str(path)!r}: {st.st_size / 1e6:.1f} MB, above the {max_bytes / 1e6:.1f} MB "
                          f"limit{' (' + limit + ')' if limit else ''}; give a smaller file"
                          f"{' or raise ' + limit.split(' ')[0] if limit else ''}")
    return st.st_size


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of `path`; ConfigError naming `what` (the field, e.g. `schedule.file`) when
    it is no regular file, cannot be read or is not text (a binary file)."""
    regular_file(path, what)
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}={str(path)!r}: not a UTF-8 text file (byte {e.start}: "
                          f"{e.object[e.start:e.start + 1]!r}); give a text file") from None
    except OSError as e:
        raise ConfigError(f"{what}={str(path)!r}: cannot be read ({e.strerror})") from None


RUN_MARKER = ".octopipe-run"
"""The file a run creates first (exclusively) in its run directory: the directory is then its."""

_OTHER_RUN = (RUN_MARKER, "summary.json", ".hydra")


def holds_a_run(path: Path) -> bool:
    """Whether directory `path` already holds (the config or results of) a run."""
    return any((Path(path) / name).exists() for name in _OTHER_RUN)


def _try_claim(path: Path) -> bool:
    """Create `path` and its marker, exclusively; False when another run holds it."""
    path.mkdir(parents=True, exist_ok=True)
    if holds_a_run(path):
        return False
    try:
        fd = os.open(path / RUN_MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    return True


def _candidates(first: Path, inside: bool, name: str) -> Iterator[Path]:
    yield first
    base = first / name if inside else first
    if inside:
        yield base
    for n in range(2, 10_000):
        yield base.with_name(f"{base.name}-{n}")


def claim_run_dir(path: str | Path, fresh_name: str, given: bool) -> Path:
    """A run directory no other run uses: `path` if it is free, else (two runs started in the same
    second, or a user's directory holding another run) the first free one of `path-2`, `path-3`,
    ... (`given=False`) or `path/fresh_name`, `path/fresh_name-2`, ... (`given=True`). Claimed
    atomically (an exclusively created marker file), so concurrent runs never share one.
    ConfigError (one line) when the directory cannot be created or written."""
    text = str(path).strip()
    if not text:
        raise ConfigError("hydra.run.dir is empty; give a directory, or leave it out for "
                          "runs/<date>/<time>_<mode>")
    first = Path(text)
    for cand in _candidates(first, given, fresh_name):
        try:
            if _try_claim(cand):
                return cand
        except FileExistsError:
            if cand == first and not first.is_dir():
                raise ConfigError(f"hydra.run.dir={text!r} is a file, not a directory; give a "
                                  "directory") from None
            bad = next((p for p in [cand, *cand.parents] if p.exists() and not p.is_dir()), cand)
            raise ConfigError(f"hydra.run.dir={text!r}: cannot create the run directory: {str(bad)!r} "
                              "is a file") from None
        except OSError as e:
            raise ConfigError(f"hydra.run.dir={text!r}: cannot create the run directory "
                              f"({e.strerror or e})") from None
    raise ConfigError(f"hydra.run.dir={text!r}: no free run directory beside it; give another")


def preset_names(group: str) -> list[str]:
    """The presets of config group `group` (conf/<group>/*.yaml), sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
