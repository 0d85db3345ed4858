"""`train.layout=DIR`: train what `mode=layout` chose, on this machine.

A mode=layout run directory holds summary.json (`best`: tp, pp, dp, micro-batch size and count,
recomputation) and plan.json (the best layout's plan, its stages' layers and table). The run
takes the layout's tp, pp, dp, micro-batching and plan as they are, recomputes the stages the
layout recomputes (selective recomputation runs as full: the runtime recomputes whole stages),
and trains the layout's preset scaled down to fit this machine (`scale_model`): every width
(hidden, head_dim, FFN, expert FFN, SSM head width, LoRA ranks, the vision front end's) divided by
the same power of two until the model has at most runtime.max_params parameters (then, if it must,
the routed experts halved, keeping a multiple of tp and at least top-k); the number of
layers and every count tp divides (heads, KV heads, experts, SSM heads) stay, so the plan's
partition and the layout's tp still apply; the vocabulary shrinks to at most 2048 (a multiple of
tp, byte tokens need 256) and the sequence to at most 128 tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from octopipe.config.model import ModelConfig
from octopipe.config.schema import Config
from octopipe.errors import ConfigError, OctoPipeError
from octopipe.model.build import build_model
from octopipe.model.params import model_params
from octopipe.plan import Plan
from octopipe.plan_io import load_plan
from octopipe.train.parallel import check_world

WIDTHS = ("head_dim", "ffn", "expert_ffn", "shared_ffn", "ssm_head_dim", "q_lora_rank", "kv_lora_rank",
          "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "projector_ffn")
MAX_VOCAB, MAX_SEQ, MIN_WIDTH = 2048, 128, 4


@dataclass(frozen=True)
class LayoutChoice:
    """What a mode=layout run chose: the degrees, micro-batching, per-stage recomputation levels
    of its plan's stages, and the plan itself."""

    source: str
    model: str
    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    microbatches: int
    global_batch: int
    recompute: tuple[str, ...]
    plan: Plan

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def recomputed(self) -> tuple[bool, ...]:
        """Per plan stage, whether the training recomputes its forward (selective runs as full)."""
        return tuple(level != "none" for level in self.recompute)


def _field(path: str, why: str) -> ConfigError:
    return ConfigError(f"train.layout={path}: {why}; give the directory a mode=layout run wrote "
                       f"(python -m octopipe.run mode=layout model=... cluster=...)")


def read_layout(path: str) -> LayoutChoice:
    """The layout a mode=layout run directory holds; one line naming what is missing or damaged."""
    root = Path(path)
    if not root.is_dir():
        raise _field(path, "not a directory")
    for name in ("summary.json", "plan.json"):
        if not (root / name).is_file():
            raise _field(path, f"no {name} there")
    try:
        summary = json.loads((root / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _field(path, f"summary.json is not JSON ({type(e).__name__})") from None
    best = summary.get("best") if isinstance(summary, dict) else None
    if summary.get("mode", "layout") != "layout" or not isinstance(best, dict) or "dp" not in best:
        raise _field(path, "summary.json holds no layout (no `best` tp/pp/dp record)")
    try:
        plan = load_plan(root / "plan.json")
    except (OctoPipeError, OSError, ValueError, KeyError) as e:
        raise _field(path, f"plan.json cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    try:
        tp, pp, dp = int(best["tp"]), int(best["pp"]), int(best["dp"])
        mbs, m, gb = int(best["micro_batch_size"]), int(best["microbatches"]), int(summary["global_batch"])
        rc = best["recompute"]
    except (KeyError, TypeError, ValueError) as e:
        raise _field(path, f"summary.json's layout lacks {e}") from None
    levels = tuple([rc] * plan.table.n_stages if isinstance(rc, str) else rc)
    if len(levels) != plan.table.n_stages or any(x not in ("none", "selective", "full") for x in levels):
        raise _field(path, f"its recomputation {rc!r} does not match the plan's {plan.table.n_stages} stages")
    if plan.table.n_devices != pp:
        raise _field(path, f"plan.json has {plan.table.n_devices} ranks and the layout pp={pp}")
    if gb % dp or dp * mbs * m != gb:
        raise _field(path, f"its global batch {gb} is not dp {dp} x micro-batch {mbs} x {m} micro-batches")
    return LayoutChoice(str(root), str(summary.get("model", plan.model)), tp, pp, dp, mbs, m, gb, levels, plan)


def _scaled_widths(mc: ModelConfig, f: int) -> ModelConfig | None:
    """`mc` with every width divided by `f`; None when a width would not stay a whole number of
    at least MIN_WIDTH."""
    def shrink(d: dict) -> dict | None:
        out = dict(d)
        for k in (*WIDTHS, "hidden"):
            if out.get(k):
                if out[k] % f or out[k] // f < MIN_WIDTH:
                    return None
                out[k] = out[k] // f
        return out
    if mc.hidden % f or mc.hidden // f < MIN_WIDTH:
        return None
    blocks = {kind: shrink(dict(shape or {})) for kind, shape in mc.blocks.items()}
    vision = shrink(dict(mc.vision)) if mc.vision else None
    if any(b is None for b in blocks.values()) or (mc.vision and vision is None):
        return None
    return replace(mc, hidden=mc.hidden // f, blocks=blocks, vision=vision)


def _fewer_experts(mc: ModelConfig, tp: int) -> ModelConfig | None:
    """`mc` with half the routed experts of every MoE block (still a multiple of tp and at least
    its top-k); None when no block can halve."""
    blocks, changed = {}, False
    for kind, shape in mc.blocks.items():
        shape = dict(shape or {})
        n, k = int(shape.get("experts", 0) or 0), int(shape.get("top_k", 1) or 1)
        if n and n % 2 == 0 and (n // 2) % tp == 0 and n // 2 >= max(k, tp):
            shape["experts"], changed = n // 2, True
        blocks[kind] = shape
    return replace(mc, blocks=blocks) if changed else None


def scale_model(mc: ModelConfig, tp: int, max_params: int) -> tuple[ModelConfig, str]:
    """The preset shrunk to at most `max_params` parameters (see the module docstring) and a note
    saying what changed ("" when nothing did)."""
    vocab = max(256, min(mc.vocab, MAX_VOCAB) // tp * tp)
    base = replace(mc, vocab=vocab, seq_len=min(mc.seq_len, MAX_SEQ))
    f, best, experts = 1, base, 1
    while model_params(build_model(best)) > max_params:
        smaller = _scaled_widths(base, f * 2)
        if smaller is not None:
            f, best = f * 2, smaller
            continue
        fewer = _fewer_experts(best, tp)
        if fewer is None:
            raise ConfigError(f"train.layout: {mc.name} cannot be scaled below runtime.max_params="
                              f"{max_params:g} parameters by dividing its widths (at least {MIN_WIDTH} each) and "
                              f"experts; raise runtime.max_params or lay out a smaller model")
        best, experts = fewer, experts * 2
    changes = [f"{k} {a} -> {b}" for k, a, b in (("hidden", mc.hidden, best.hidden), ("vocab", mc.vocab, best.vocab),
                                                  ("seq_len", mc.seq_len, best.seq_len)) if a != b]
    if f > 1:
        changes.append(f"every other width / {f}")
    if experts > 1:
        changes.append(f"experts / {experts}")
    if not changes:
        return mc, ""
    return replace(best, name=f"{mc.name}-scaled"), ", ".join(changes)


def apply_layout(cfg: Config) -> tuple[Config, LayoutChoice | None, str]:
    """`cfg` with train.layout's degrees, micro-batching, recomputation and scaled model applied
    (unchanged without train.layout), the layout, and a note of what was scaled."""
    path = cfg.train.layout
    if not path:
        return cfg, None, ""
    choice = read_layout(path)
    if cfg.model.name != choice.model:
        raise ConfigError(f"train.layout={path} was laid out for {choice.model} and this run's model is "
                          f"{cfg.model.name}: pass model={choice.model} (a layout belongs to its model)")
    check_world(cfg, choice.world, f"train.layout={path}: tp {choice.tp} x pp {choice.pp} x dp {choice.dp}")
    model, note = scale_model(replace(cfg.model, micro_batch_size=choice.micro_batch_size), choice.tp,
                              cfg.runtime.max_params)
    train = replace(cfg.train, tp=choice.tp, pp=choice.pp, dp=choice.dp, microbatches=choice.microbatches,
                    recompute="plan" if any(choice.recomputed()) else "none", model="auto")
    return replace(cfg, model=model, train=train), choice, note


def layout_summary(choice: LayoutChoice, note: str) -> dict:
    """summary.json's `layout` record of a train.layout run."""
    return {"source": choice.source, "model": choice.model, "tp": choice.tp, "pp": choice.pp, "dp": choice.dp,
            "micro_batch_size": choice.micro_batch_size, "microbatches": choice.microbatches,
            "global_batch": choice.global_batch, "recompute": list(choice.recompute), "scaled": note}
