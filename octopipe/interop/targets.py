"""What each stack can run (`target=`), as rules a plan either keeps or breaks.

- granularity: `pieces` (layers may be cut into pieces: OctoPipe's runtime), `layers` (whole
  OctoPipe layers: torch's stages are the user's modules, split anywhere between them), `units`
  (whole decoder layers, the vision encoder with the embedding: torchtitan, Megatron, DeepSpeed);
- placement: `any` stage → rank map, `loop` (stage s on rank s mod pp, the same number of stages on
  every rank), `v` (two stages per rank, the second pass reversed), `one` (one stage per rank, in
  order);
- schedule: a free table of F, I, W and B per rank (torch's CSV), or the stack's own schedules
  (`fixed`: chunks → schedule name, where 0 stands for any chunk count of 2 or more).

The sources are the stacks' own code as of 2026 (torch 2.13 `_PipelineScheduleRuntime`,
torchtitan 0.3 `pipeline_parallel.py`, Megatron-LM `PipelineParallelLayerLayout`, DeepSpeed
`PipelineModule`); `docs/interop.md` says what each rule costs, measured.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from octopipe.errors import ConfigError, OctoPipeError
from octopipe.interop.units import Units
from octopipe.plan import Plan
from octopipe.schedule.library import build_schedule

TARGET_NAMES = ("octopipe", "torch", "torchtitan", "megatron", "deepspeed")
# torch's named schedules as OctoPipe's library builds them: (schedule, chunks)
TORCH_SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("looped_bfs", 2),
                   ("zbh1", 2), ("zbv", 2), ("dualpipev", 2))
MAX_LOOP_CHUNKS = 4


@dataclass(frozen=True)
class Target:
    """One stack's rules; `relax(rule)` is the same stack with that rule lifted, which is how the
    cost of each rule is measured."""

    name: str
    granularity: str                          # pieces | layers | units
    placements: tuple[str, ...]               # any | loop | v | one
    fixed: tuple[tuple[int, str], ...] = ()   # () = any table; else (chunks, schedule) pairs
    baselines: tuple[tuple[str, int], ...] = ()
    stack: str = ""

    @property
    def free(self) -> bool:
        return self.granularity == "pieces" and self.placements == ("any",) and not self.fixed

    def rules(self) -> tuple[str, ...]:
        """The rules that hold this target back from OctoPipe's own plans."""
        out = []
        if self.granularity != "pieces":
            out.append("granularity")
        if self.placements != ("any",):
            out.append("placement")
        if self.fixed:
            out.append("schedule")
        return tuple(out)

    def relax(self, rule: str) -> Target:
        if rule == "granularity":
            return replace(self, granularity="pieces" if self.granularity == "layers" else "layers")
        if rule == "placement":
            return replace(self, placements=("any",))
        if rule == "schedule":
            return replace(self, fixed=())
        raise ValueError(rule)

    def rule_text(self, rule: str) -> str:
        return {"granularity": {"units": "whole decoder layers (no stage bound inside one, the "
                                          "vision encoder with the embedding)",
                                "layers": "whole layers (no layer cut into pieces)"}.get(self.granularity, ""),
                "placement": {("loop",): "loop placement (stage s on rank s mod pp)",
                              ("loop", "v"): "loop or V placement with equal stages per rank",
                              ("one",): "one stage per rank, in order"}.get(self.placements, ""),
                "schedule": "its own schedules only (" + ", ".join(sorted({s for _, s in self.fixed})) + ")",
                }[rule]

    def schedule_for(self, chunks: int) -> str | None:
        """The schedule a fixed-schedule target runs at `chunks` stages per rank (None: any table)."""
        for v, name in self.fixed:
            if v == chunks or (v == 0 and chunks >= 2):
                return name
        return None

    def chunk_options(self, n_devices: int, n_units: int, chunks: int | None = None) -> list[tuple[str, int]]:
        """(placement, chunks) layouts the target may use for this many ranks and modules (only
        `chunks` stages per rank when given; "any" placement then keeps any count)."""
        out = []
        for style in self.placements:
            if style == "one":
                out.append(("one", 1))
            elif style == "v":
                out.append(("v", 2))
            elif style == "loop":
                out += [("loop", v) for v in range(1, MAX_LOOP_CHUNKS + 1)
                        if not self.fixed or self.schedule_for(v) is not None]
            else:
                out.append(("any", 0))
        out = [(s, v) for s, v in out if chunks is None or v in (0, chunks)]
        return [(s, v) for s, v in out if n_devices * max(v, 1) <= n_units]


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("octopipe", "pieces", ("any",), stack="OctoPipe's runtime"),
    Target("torch", "layers", ("any",), baselines=TORCH_SCHEDULES,
           stack="torch.distributed.pipelining (_PipelineScheduleRuntime, CSV)"),
    Target("torchtitan", "units", ("loop", "v"), baselines=TORCH_SCHEDULES,
           stack="torchtitan (pipeline_parallel_schedule_csv)"),
    Target("megatron", "units", ("loop",), ((1, "1f1b"), (0, "interleaved")),
           (("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("interleaved", 4)),
           stack="Megatron-LM (--pipeline-model-parallel-layout)"),
    Target("deepspeed", "units", ("one",), ((1, "1f1b"),), (("1f1b", 1),),
           stack="DeepSpeed PipelineModule (parts)"),
)}


def target_named(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ConfigError(f"target={name!r} is unknown; use one of {', '.join(TARGET_NAMES)}") from None


def unsupported(target: Target, units: Units | None) -> str | None:
    """Why the target cannot run this model at all (None: it can, given a plan that keeps its rules)."""
    if target.granularity == "units" and units is None:
        return (f"target={target.name}: the model has no module names the stack knows; use a preset, "
                "model=hf or model=module")
    if target.name == "megatron" and units is not None:
        if units.source != "torchtitan":
            return "target=megatron: Megatron-LM builds its own GPT or hybrid model; plan a preset for it"
        if any(n == "vision_encoder" for names in units.names for n in names):
            return ("target=megatron: Megatron's pipeline layout has no encoder layers (this model has a "
                    "vision encoder); use target=torchtitan or torch")
    return None


def placement_of(style: str, n_devices: int, chunks: int) -> tuple[int, ...]:
    """The stage → rank map of a placement style."""
    D = n_devices
    if style == "v":
        return tuple(range(D)) + tuple(reversed(range(D)))
    return tuple(s % D for s in range(D * max(chunks, 1)))


def layout_of(placement: tuple[int, ...], n_devices: int) -> tuple[str, int] | None:
    """The (style, chunks) a stage → rank map is, or None when it is neither loop nor V."""
    S = len(placement)
    if S % n_devices:
        return None
    v = S // n_devices
    if placement == placement_of("loop", n_devices, v):
        return ("one" if v == 1 else "loop", v)
    if v == 2 and placement == placement_of("v", n_devices, 2):
        return ("v", 2)
    return None


def violations(plan: Plan, target: Target, units: Units | None) -> list[str]:
    """What in `plan` the target cannot run, one phrase per broken rule ([] = it runs it)."""
    out: list[str] = []
    if target.granularity != "pieces" and plan.pieces:
        out.append(f"it cuts layers {sorted(int(k) for k in plan.pieces)} into pieces")
    if target.granularity == "units" and not plan.pieces and units is not None:
        bad = units.misaligned(plan.partition)
        if bad:
            out.append(f"a stage bound at layer {bad[0]} cuts inside a decoder layer")
    t = plan.table
    D = t.n_devices
    layout = layout_of(tuple(t.placement), D)
    allowed = set(target.placements)
    if "any" not in allowed:
        ok = layout is not None and (layout[0] in allowed or (layout[0] == "one" and "loop" in allowed))
        if not ok:
            out.append(f"its placement {list(t.placement)} is not {' or '.join(target.placements)}")
    if target.fixed and layout is not None:
        name = target.schedule_for(layout[1])
        if name is None:
            out.append(f"{target.name} has no schedule for {layout[1]} stages per rank")
        elif _named_rows(name, D, t.n_microbatches, layout[1]) != tuple(t.compute_only().rows):
            out.append(f"its table is not {target.name}'s {name} order")
    if t.is_lowered:
        out.append("its table holds communication actions (the stacks take compute only)")
    return out


def _named_rows(name: str, n_devices: int, n_microbatches: int, chunks: int) -> tuple | None:
    try:
        return tuple(build_schedule(name, n_devices, n_microbatches, chunks).rows)
    except OctoPipeError:
        return None
