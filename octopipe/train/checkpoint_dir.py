"""Which run a checkpoint directory belongs to, settled before any rank starts.

A training run that saves checkpoints claims its directory (by default `<run dir>/checkpoints`,
always new) by creating `.octopipe-checkpoints` exclusively: two runs never write into one
directory at once, and a run never writes where another run's checkpoints lie, so no
checkpoint is overwritten. A resumed run may continue in the directory of the checkpoint it
resumes from, when nothing after that step is there and the run that wrote it has ended. The
directory is checked writable up front, and unfinished saves (`step_N.tmp`, left by a rank
killed while saving) are removed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from octopipe.errors import ConfigError

OWNER = ".octopipe-checkpoints"
_STEP = re.compile(r"^step_(\d+)$")
_FIELD = "train.checkpoint_dir"


@dataclass(frozen=True)
class Claim:
    """A claimed checkpoint directory and what claiming it cleaned (`removed`: unfinished saves)."""

    directory: Path
    removed: tuple[str, ...] = ()


def steps_in(directory: Path) -> list[int]:
    """The steps of the complete checkpoints in `directory`, ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if p.is_dir() and (m := _STEP.match(p.name)))


def _alive(owner: dict) -> bool:
    """Whether the run recorded in an owner file may still be running (same host, live pid)."""
    if owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(owner.get("pid", 0)), 0)
    except (ProcessLookupError, ValueError, OverflowError):
        return False
    except PermissionError:
        return True
    return int(owner.get("pid", 0)) > 0


def _owner(directory: Path) -> dict:
    try:
        doc = json.loads((directory / OWNER).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".octopipe-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{_FIELD}={directory}: cannot write checkpoints there ({e.strerror or e}); give a "
                          f"writable directory, or leave it empty for <run dir>/checkpoints") from None


def _write_owner(directory: Path, run: str, replace: bool) -> None:
    text = json.dumps({"run": run, "pid": os.getpid(), "host": socket.gethostname()})
    if replace:
        tmp = directory / f"{OWNER}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, directory / OWNER)
        return
    try:
        fd = os.open(directory / OWNER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ConfigError(f"{_FIELD}={directory}: another training run claimed it at this moment; give "
                          f"another directory") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _check_takeover(directory: Path, start: int, resume: Path | None) -> None:
    """Refuse a directory with another run's checkpoints, unless this run resumes from one of
    them and nothing after its step is there."""
    owner = _owner(directory)
    if owner and _alive(owner):
        raise ConfigError(f"{_FIELD}={directory}: in use by another training run (pid {owner.get('pid')}); "
                          f"give another directory")
    steps = steps_in(directory)
    if not steps:
        return
    inside = resume is not None and resume.resolve().parent == directory.resolve()
    if not inside:
        raise ConfigError(f"{_FIELD}={directory}: holds another run's checkpoints (step_{steps[-1]:06d}"
                          f"{' and more' if len(steps) > 1 else ''}), which this run would overwrite; give an "
                          f"empty directory, or leave it empty for <run dir>/checkpoints")
    later = [s for s in steps if s > start]
    if later:
        raise ConfigError(f"{_FIELD}={directory}: holds step_{later[0]:06d}, after the resumed step {start}, "
                          f"which this run would overwrite; give another train.checkpoint_dir")


def claim(directory: str | Path, run: str, start: int = 0, resume: str = "") -> Claim:
    """Make `directory` this run's (`run`: a name for it, e.g. its run directory): created and
    checked writable, no other run's checkpoints at or after `start` in it, unfinished saves
    removed. ConfigError (one line naming train.checkpoint_dir) otherwise."""
    d = Path(directory).expanduser()
    if d.exists() and not d.is_dir():
        raise ConfigError(f"{_FIELD}={directory}: not a directory; give a directory, or leave it empty for "
                          f"<run dir>/checkpoints")
    _make_dir(d)
    held = (d / OWNER).exists() or bool(steps_in(d))
    if held:
        _check_takeover(d, start, Path(resume).expanduser() if resume else None)
    _write_owner(d, run, replace=held and (d / OWNER).exists())
    removed = []
    for p in sorted(d.glob("step_*.tmp")):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return Claim(d, tuple(removed))
