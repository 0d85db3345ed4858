"""What a rank does for F, I, W and B of one (stage, micro-batch): real layers or emulation.

Real: F keeps the stage's input and output; B is one autograd pass over the stage; I computes
the input gradient only and keeps, through torch.distributed.pipelining's split-backward
helpers, the gradients of the intermediate nodes that feed the parameters; W later turns those
into parameter gradients without re-running the input path. A stage without a float input (the
one holding the embedding) has no input gradient: its I is empty and its W does the pass.
A stage in `recompute` runs F without the autograd graph, keeping only its input (and the CPU
RNG state, so that dropout repeats); its B, or I (or W for a stage without a float input),
first reruns the forward with the graph, at the same weights and autocast, then proceeds as
without. A `SavedMeter` counts what F saves for the backward and what the stage keeps (its
input, output and I's intermediate gradients); its peak over an iteration is `saved_peak_bytes`.
Emulated: each action sleeps its modelled duration and produces a buffer of the modelled size,
so that transfers are real while the CPU stays free.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.func import functional_call

from octopipe.model.spec import ModelSpec
from octopipe.runtime.memory import SavedMeter, storage_pointers, tensor_bytes
from octopipe.runtime.stage import StageModule, SyntheticBatches


def finite_flag(h: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: whether every value of `h` is finite. For outputs of 32 bits or fewer,
    one float64 sum: any inf or NaN makes it non-finite and finite values cannot overflow it, at
    about half the cost of `isfinite(h).all()`, which float64 and other outputs keep."""
    if h.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.isfinite(h.sum(dtype=torch.float64))
    return torch.isfinite(h).all()


@dataclass
class _Saved:
    """A stage's F kept for its backward: `out` is None until a recomputed F reruns (from `rng`);
    `held` counts the kept tensors in the meter while this lives."""

    x_in: torch.Tensor | None
    out: torch.Tensor | None
    grad_out: torch.Tensor | None = None
    param_groups: list = field(default_factory=list)
    rng: torch.Tensor | None = None
    held: list = field(default_factory=list)


class RealCompute:
    """Runs the real layers of the stages a rank holds."""

    def __init__(self, model, partition, copies: tuple[tuple[int, int], ...], n_microbatches: int,
                 seed: int, device: torch.device, mb_replica: tuple[int, ...] = (),
                 weights=None) -> None:
        """`model`: a ModelSpec or a block list (`octopipe.runtime.stage`). `copies` = the
        (replica, stage) pairs this rank holds; replica 0 is the primary pipeline, others are
        Chimera-style copies with the same initial weights. `batches` (set after construction,
        default synthetic) gives each micro-batch's data; `autocast` (None or a dtype) runs
        forwards under torch.autocast, each stage handing on fp32. `weights`: an asynchronous
        weight policy (octopipe.asynchronous.runtime.WeightStash): forwards run at its
        versions, backwards hand it their gradients. `recompute` (set after construction,
        default none): the stages whose forward is rerun inside their backward."""
        self.model, self.partition, self.m = model, partition, n_microbatches
        self.seed, self.device, self.mb_replica = seed, device, mb_replica
        self.n_stages = len(partition)
        self.copies = {c: StageModule(model, *partition[c[1]], seed=seed).to(device) for c in copies}
        self.batches = SyntheticBatches(model, seed) if isinstance(model, ModelSpec) else None
        self.autocast: torch.dtype | None = None
        self.recompute: frozenset[int] = frozenset()
        self.meter = SavedMeter()
        self.metering = True               # count saved bytes this iteration (training: the last step only)
        self.saved: dict[tuple[int, int], _Saved] = {}
        self._trainable: dict[int, list] = {}      # id(module) -> its trainable parameters (`_params`)
        self.iteration = 0
        self.losses: dict[int, float] = {}
        self._batches: dict[int, dict] = {}
        self.weights = weights
        self.check_finite = False          # training: note whether each forward output is finite
        self.output_finite: dict[int, list[torch.Tensor]] = {}
        for (_, s), mod in self.copies.items():
            if weights is not None:
                weights.bind(s, mod)

    def module(self, stage: int, mb: int) -> StageModule:
        return self.copies[(self.mb_replica[mb] if self.mb_replica else 0, stage)]

    def batch(self, mb: int) -> dict:
        if mb not in self._batches:
            self._batches[mb] = {k: v.to(self.device) for k, v in
                                 self.batches.batch(self.iteration, mb).items()}
        return self._batches[mb]

    def start_iteration(self, iteration: int) -> None:
        self.iteration, self.saved, self.losses, self._batches = iteration, {}, {}, {}
        self._trainable = {}
        self.output_finite = {}
        for mod in self.copies.values():
            mod.zero_grad(set_to_none=True)
        self.meter.exclude = storage_pointers(self.parameters())
        self.meter.reset_peak()

    @property
    def saved_peak_bytes(self) -> int:
        """The iteration's peak of saved activations and kept stage inputs and outputs (`SavedMeter`)."""
        return self.meter.peak

    def state_bytes(self) -> int:
        """Bytes of the stages' parameters and gradients (the optimizer's state is the loop's:
        `memory.optimizer_bytes`)."""
        params = self.parameters()
        return tensor_bytes([*params, *(p.grad for p in params)])

    def _call(self, mod, stage: int, mb: int, x: torch.Tensor | None, batch: dict, again: bool) -> torch.Tensor:
        """The stage's forward, at the asynchronous policy's weight version where there is one
        (`again`: the leaves the micro-batch's first forward read)."""
        if self.weights is None:
            return mod(x, batch)
        if again:
            params = self.weights.leaves[(stage, mb)]
        else:
            params = self.weights.forward_params(stage, mb)
            self.meter.exclude |= storage_pointers(params.values())
        return functional_call(mod, params, (x, batch))

    def _run(self, stage: int, mb: int, x: torch.Tensor | None, again: bool = False) -> torch.Tensor:
        mod, batch = self.module(stage, mb), self.batch(mb)
        if self.autocast is None:
            h = self._call(mod, stage, mb, x, batch, again)
        else:
            with torch.autocast(self.device.type, dtype=self.autocast):
                h = self._call(mod, stage, mb, x, batch, again)
            h = h.float()
        if h._is_view():
            h = h.clone()   # the split backward detaches the output in place, which views forbid
        return h

    def _hooks(self) -> contextlib.AbstractContextManager:
        """The meter's saved-tensor hooks while metering (they cost a Python call per saved tensor)."""
        return self.meter.hooks() if self.metering else contextlib.nullcontext()

    def _hold(self, tensors: list) -> list:
        """Holders counting `tensors` (Nones skipped) in the meter while metering."""
        return [self.meter.hold(t) for t in tensors if t is not None] if self.metering else []

    def _rng_devices(self) -> list:
        return [self.device] if self.device.type == "cuda" else []

    def forward(self, stage: int, mb: int, x: torch.Tensor | None) -> torch.Tensor:
        if x is not None and x.is_floating_point():
            x = x.detach().requires_grad_(True)
        if stage in self.recompute:
            rng = [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in self._rng_devices())]
            with torch.no_grad():
                h = self._run(stage, mb, x)
            sv = _Saved(x, None, rng=rng)
        else:
            with self._hooks():
                h = self._run(stage, mb, x)
            sv = _Saved(x, h)
        sv.held = self._hold([x, sv.out])
        self.saved[(stage, mb)] = sv
        if self.check_finite:       # a flag tensor, read after the iteration: no sync here
            self.output_finite.setdefault(stage, []).append(finite_flag(h))
        if stage == self.n_stages - 1:
            self.losses[mb] = float(h.detach())
        return h.detach()

    def _rerun(self, stage: int, mb: int, sv: _Saved) -> None:
        """A recomputed stage's forward again, with the graph, from the RNG state its F began with."""
        if sv.out is not None:
            return
        devices = self._rng_devices()
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(sv.rng[0])
            for d, state in zip(devices, sv.rng[1:]):
                torch.cuda.set_rng_state(state, d)
            with self._hooks():
                sv.out = self._run(stage, mb, sv.x_in, again=True)
        sv.held += self._hold([sv.out])

    def _grad_out(self, stage: int, grad: torch.Tensor | None) -> torch.Tensor:
        if stage == self.n_stages - 1:   # asynchronous: each update is SGD on one micro-batch
            return torch.full((), 1.0 if self.weights is not None else 1.0 / self.m, device=self.device)
        return grad

    def _params(self, stage: int, mb: int) -> list:
        """The trainable parameters a backward of (`stage`, `mb`) differentiates: listed once per
        iteration and copy (walking a module's parameters costs a Python call per submodule)."""
        if self.weights is not None:
            return self.weights.params(stage, mb)
        mod = self.module(stage, mb)
        got = self._trainable.get(id(mod))
        if got is None:
            got = self._trainable[id(mod)] = [p for p in mod.parameters() if p.requires_grad]
        return got

    def _weight_iter(self, stage: int, mb: int):
        """What the split-backward helpers walk: the module's parameters, or the stash's leaves."""
        if self.weights is not None:
            return iter(self.weights.params(stage, mb))
        return self.module(stage, mb).parameters()

    def backward(self, stage: int, mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        sv = self.saved.pop((stage, mb))
        params = self._params(stage, mb)
        wants_input = sv.x_in is not None and sv.x_in.requires_grad
        inputs = ([sv.x_in] if wants_input else []) + params
        if inputs:
            self._rerun(stage, mb, sv)
        if not inputs or not sv.out.requires_grad:     # a first stage without parameters (a one-hot)
            return None
        if self.weights is None:    # autograd adds to each .grad itself: no Python call per parameter
            torch.autograd.backward(sv.out, self._grad_out(stage, grad), inputs=inputs)
            return sv.x_in.grad if wants_input else None
        grads = torch.autograd.grad(sv.out, inputs, self._grad_out(stage, grad), allow_unused=True)
        self.weights.backward_done(stage, mb, grads[1:] if wants_input else grads)
        return grads[0] if wants_input else None

    def backward_input(self, stage: int, mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        sv = self.saved[(stage, mb)]
        sv.grad_out = self._grad_out(stage, grad)
        if sv.x_in is None or not sv.x_in.requires_grad:
            return None
        self._rerun(stage, mb, sv)
        (dx,), sv.param_groups = stage_backward_input([sv.out], [sv.grad_out], [sv.x_in],
                                                      self._weight_iter(stage, mb))
        sv.held += self._hold([g for group in sv.param_groups for gs in group.get("grads") or () for g in gs])
        return dx

    def backward_weight(self, stage: int, mb: int) -> None:
        sv = self.saved.pop((stage, mb))
        params = self._params(stage, mb)
        if sv.x_in is None or not sv.x_in.requires_grad:
            if params:
                self._rerun(stage, mb, sv)
            if params and sv.out.requires_grad:     # else a first stage without parameters: nothing to learn
                if self.weights is None:
                    torch.autograd.backward(sv.out, sv.grad_out, inputs=params)
                else:
                    self.weights.backward_done(stage, mb, torch.autograd.grad(sv.out, params, sv.grad_out,
                                                                              allow_unused=True))
        else:
            stage_backward_weight(self._weight_iter(stage, mb), sv.param_groups)
            if self.weights is not None:
                self.weights.backward_done(stage, mb, [p.grad for p in params])

    def sync_replicas(self, groups: dict[int, tuple[tuple[int, ...], object]], rank: int) -> None:
        """Sum each stage's gradients over its copies (Chimera replicas): locally, then with an
        all-reduce over the ranks holding a copy (`groups[stage] = (ranks, process group)`),
        stage by stage in the same order on every rank."""
        for s in range(self.n_stages):
            local = [mod for (r, st), mod in sorted(self.copies.items()) if st == s]
            ranks, group = groups.get(s, ((rank,), None))
            if not local or (len(local) == 1 and len(ranks) == 1):
                continue
            params = [list(mod.parameters()) for mod in local]
            flat = torch.cat([torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                         for p in ps]) for ps in params[:1]])
            for ps in params[1:]:
                flat += torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
            if len(ranks) > 1:
                dist.all_reduce(flat, group=group)
            for ps in params:
                off = 0
                for p in ps:
                    p.grad = flat[off:off + p.numel()].view_as(p).clone()
                    off += p.numel()

    def named_grads(self) -> dict[str, torch.Tensor]:
        out = {}
        for _, mod in sorted(self.copies.items()):
            for name, p in mod.named_parameters():
                if name not in out:
                    out[name] = p.grad.detach().cpu().clone() if p.grad is not None \
                        else torch.zeros_like(p).cpu()
        return out

    def parameters(self):
        return [p for mod in self.copies.values() for p in mod.parameters()]


AWAKE_S = 5e-4     # an emulated action's last half millisecond is waited out awake (EmulatedCompute._sleep)


class EmulatedCompute:
    """Sleeps each action's modelled duration; the messages have the modelled byte sizes.

    `durations[stage] = (f, i, w)` seconds; `message_elems[stage]` = float32 elements of the
    activation the stage sends on (its gradient comes back with the same size).
    """

    saved_peak_bytes = 0        # nothing is saved for a backward
    metering = False            # so nothing to meter

    def __init__(self, durations: dict[int, tuple[float, float, float]], message_elems: dict[int, int],
                 n_stages: int, device: torch.device) -> None:
        self.durations, self.elems, self.n_stages, self.device = durations, message_elems, n_stages, device
        self.losses: dict[int, float] = {}

    def start_iteration(self, iteration: int) -> None:
        self.losses = {}

    def sync_replicas(self, groups, rank: int) -> None:
        pass

    @staticmethod
    def _sleep(seconds: float) -> None:
        """Wait `seconds`: asleep until the last `AWAKE_S`, then awake, since the OS wakes a
        sleeper late (by a few hundred microseconds on a busy machine), which would lengthen
        every emulated action by that much where real compute has no such delay."""
        end = time.perf_counter() + seconds
        while (left := end - time.perf_counter()) > AWAKE_S:
            time.sleep(left - AWAKE_S)
        while time.perf_counter() < end:
            pass

    def _message(self, stage: int) -> torch.Tensor:
        return torch.zeros(max(self.elems.get(stage, 1), 1), device=self.device)

    def forward(self, stage: int, mb: int, x: torch.Tensor | None) -> torch.Tensor:
        self._sleep(self.durations[stage][0])
        if stage == self.n_stages - 1:
            self.losses[mb] = 0.0
        return self._message(stage)

    def backward(self, stage: int, mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        self._sleep(self.durations[stage][1] + self.durations[stage][2])
        return self._message(stage - 1) if stage > 0 else None

    def backward_input(self, stage: int, mb: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        self._sleep(self.durations[stage][1])
        return self._message(stage - 1) if stage > 0 else None

    def backward_weight(self, stage: int, mb: int) -> None:
        self._sleep(self.durations[stage][2])

    def named_grads(self) -> dict[str, torch.Tensor]:
        return {}

    def state_bytes(self) -> int:
        """No parameters or gradients are held."""
        return 0

    def parameters(self):
        return []
