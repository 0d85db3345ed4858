"""Processes seen through /proc (Linux): the descendants of a process and whether one is gone."""
from __future__ import annotations

import os
import time
from pathlib import Path


def _parents() -> dict[int, int]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, sorted by pid."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return sorted(found)


def _started(pid: int) -> int:
    """The process's start time in clock ticks since boot (pids wrap around; start times do not)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _is_forkserver(pid: int) -> bool:
    try:
        return b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def forked_ranks(pid: int) -> list[int]:
    """The processes a forkserver below `pid` forked (the ranks), oldest first."""
    parents = _parents()
    servers = {p for p in descendants(pid) if _is_forkserver(p)}
    return sorted((c for c, pp in parents.items() if pp in servers), key=_started)


def gone(pid: int) -> bool:
    """No such process, or only its zombie left for a parent to reap."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (ProcessLookupError, FileNotFoundError):
        return True


def wait_until(ok, timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return True
        time.sleep(every)
    return ok()
