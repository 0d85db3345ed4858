"""What keeps a rank process tied to its launcher: it beats a heartbeat the watchdog reads, it
ignores Ctrl-C (the launcher decides and stops every rank), and it dies with its launcher.

A rank's parent is torch's forkserver, not the launcher, so a parent-death signal alone does not
follow the launcher; instead a daemon thread holds a pidfd of the launcher (Linux; `kill(pid, 0)`
and /proc elsewhere) and, the moment the launcher is gone (SIGTERM, SIGKILL, a crash), removes
the run's temporary directory and ends the rank. The forkserver and the resource tracker then
exit by themselves: their last peers are gone.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import threading
import time
from typing import Any

from octopipe.runtime.control import Control
from octopipe.runtime.worker import RankProgram, rank_main

BEAT_S = 0.1


def _zombie_or_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def _launcher_gone(pidfd: int | None, pid: int, wait_s: float) -> bool:
    """Wait up to `wait_s`; whether the launcher has exited."""
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], wait_s)[0])
    time.sleep(wait_s)
    return _zombie_or_gone(pid)


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _watch(launcher: int, result_dir: str, rank: int, control: Control) -> None:
    pidfd = _open_pidfd(launcher)
    while True:
        control.beat(rank)
        if _launcher_gone(pidfd, launcher, BEAT_S) or (pidfd is None and os.getppid() == 1):
            for _ in range(2):      # a peer may be writing its result file at this moment
                shutil.rmtree(result_dir, ignore_errors=True)
            os._exit(1)


def rank_entry(launcher: int, result_dir: str, program: RankProgram, rank: int, payload: Any,
               control: Control) -> None:
    """The process entry of a launched rank: the lifeline, then `program` through `rank_main`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(launcher, result_dir, rank, control), daemon=True,
                     name="octopipe-lifeline").start()
    rank_main(rank, payload, control, program)
