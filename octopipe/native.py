"""Small C kernels compiled once with the system C compiler and cached by source hash.

The tuner's estimator (`octopipe/tune/listsched.c`) and the simulator's strict engine
(`octopipe/sim/strict.c`) are built here on first use; each has a pure-Python twin that runs when
no compiler exists (or `OCTOPIPE_NO_CC` is set) and serves the tests as an oracle. No `-march`
and no fast-math: the same IEEE arithmetic, so the same schedules, on every x86-64 and arm64
machine (the flags are part of the cache tag, so a change rebuilds).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

CFLAGS = ("-O3", "-shared", "-fPIC")


def load(src: Path, declare: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL | None:
    """Build `src` (once per source version) and load it, with `declare` setting its functions'
    argument types; None when that is not possible or `OCTOPIPE_NO_CC` is set."""
    if os.environ.get("OCTOPIPE_NO_CC"):
        return None
    try:
        text = src.read_bytes()
    except OSError:
        return None
    tag = hashlib.sha1(text + " ".join(CFLAGS).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("OCTOPIPE_CACHE", Path(tempfile.gettempdir()) / f"octopipe-{os.getuid()}"))
    lib_path = cache / f"{src.stem}-{tag}.so"
    if not lib_path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = lib_path.with_suffix(f".{os.getpid()}.tmp")
        cc = os.environ.get("CC", "cc")
        try:
            subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(src), "-lm"],
                           check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        os.replace(tmp, lib_path)
    lib = ctypes.CDLL(str(lib_path))
    declare(lib)
    return lib
