"""Bytes a rank keeps: the activations saved for backward (live and peak), and its state.

`SavedMeter` counts what autograd saves for backward while its `hooks()` are active (through
torch.autograd.graph.saved_tensors_hooks) plus the tensors a caller `hold`s itself (a stage's
input and output between its forward and backward). A storage is counted once while any saved
or held reference to it lives, by its whole size (a saved view keeps its base alive), and freed
when the last reference is dropped. Storages in `exclude` (the parameters, which the state
counts) are not counted.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


class _Held:
    """What the pack hook returns in place of a saved tensor: the tensor and its counted storage."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: torch.Tensor, meter: SavedMeter | None, key: int) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        if self.meter is not None:
            self.meter.release(self.key)


def _unpack(held: _Held) -> torch.Tensor:
    return held.tensor


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage under `t`; None for a tensor without one."""
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return st.data_ptr(), st.nbytes()


class SavedMeter:
    """Live and peak bytes of the storages saved for backward or held (see the module)."""

    def __init__(self, exclude: set[int] | None = None) -> None:
        self.live = 0
        self.peak = 0
        self.exclude: set[int] = exclude if exclude is not None else set()
        self._refs: dict[int, list[int]] = {}     # storage pointer -> [references, bytes]

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """A context under which every tensor autograd saves is counted until autograd drops it."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: torch.Tensor) -> _Held:
        # detached: a saved output holding its own grad_fn would be a cycle that outlives a
        # retained graph (autograd restores the grad_fn on unpacking)
        return self.hold(t.detach())

    def hold(self, t: torch.Tensor) -> _Held:
        """Count `t`'s storage until the returned holder is dropped."""
        st = _storage(t)
        if st is None or st[1] == 0 or st[0] in self.exclude:
            return _Held(t, None, 0)
        ptr, nbytes = st
        ref = self._refs.get(ptr)
        if ref is None:
            self._refs[ptr] = [1, nbytes]
            self.live += nbytes
            if self.live > self.peak:
                self.peak = self.live
        else:
            ref[0] += 1
        return _Held(t, self, ptr)

    def release(self, ptr: int) -> None:
        ref = self._refs[ptr]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[ptr]

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        self.peak = self.live


def storage_pointers(tensors) -> set[int]:
    """The storage pointers of `tensors` (what a meter's `exclude` takes)."""
    return {st[0] for t in tensors if (st := _storage(t)) is not None}


def tensor_bytes(tensors) -> int:
    """The bytes of `tensors` (None entries skipped), each counted once."""
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        if t is not None:
            seen[id(t)] = t
    return sum(t.numel() * t.element_size() for t in seen.values())


def optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    """The bytes of a torch optimizer's state tensors (AdamW: its two moments and step counts)."""
    return tensor_bytes(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def memory_comparison(measured: Sequence[float], simulated: Sequence[float]) -> dict:
    """summary.json's memory figures (mode=execute and mode=train): each rank's measured bytes
    beside the simulator's peak for it, and the largest |measured - simulated| / simulated."""
    errs = [abs(a - b) / b for a, b in zip(measured, simulated) if b > 0]
    return {"memory_measured_bytes": list(measured), "memory_simulated_bytes": list(simulated),
            "memory_max_rel_err": max(errs) if errs else None}
