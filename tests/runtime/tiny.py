"""Tiny ModelSpecs that cover every layer kind (CPU, milliseconds per layer), and `job` to run them."""
from __future__ import annotations

from octopipe.config.runtime import RuntimeConfig
from octopipe.model.layer import LayerKind as K
from octopipe.model.layer import LayerSpec
from octopipe.model.spec import ModelSpec
from octopipe.plan import Plan
from octopipe.runtime.job import Fault, Job
from octopipe.schedule.table import ScheduleTable

H = 32
VOCAB = 64


def attn(window: int = 0) -> LayerSpec:
    return LayerSpec(K.ATTENTION, H, heads=4, kv_heads=2, head_dim=8, window=window)


def mlp(act: str = "swiglu") -> LayerSpec:
    return LayerSpec(K.MLP, H, ffn=48, activation=act)


def mamba2() -> LayerSpec:
    return LayerSpec(K.MAMBA2, H, ssm_state=8, ssm_heads=4, ssm_head_dim=16, ssm_groups=2, ssm_chunk=8)


def mamba1() -> LayerSpec:
    return LayerSpec(K.MAMBA1, H, ssm_state=4, ssm_heads=1, ssm_head_dim=32, dt_rank=4)


def moe() -> LayerSpec:
    return LayerSpec(K.MOE, H, experts=4, top_k=2, expert_ffn=16, shared_experts=1, shared_ffn=16)


def mla() -> LayerSpec:
    return LayerSpec(K.MLA, H, heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_dim=8,
                     qk_rope_dim=4, v_head_dim=8)


def lin() -> LayerSpec:
    return LayerSpec(K.LINEAR_ATTENTION, H, heads=4, head_dim=8)


def emb() -> LayerSpec:
    return LayerSpec(K.EMBEDDING, H, vocab=VOCAB)


def head() -> LayerSpec:
    return LayerSpec(K.HEAD, H, vocab=VOCAB)


def model(layers, seq: int = 16, mbs: int = 2, name: str = "tiny") -> ModelSpec:
    return ModelSpec(name, tuple(layers), seq_len=seq, micro_batch_size=mbs, vocab=VOCAB)


def dense(n_blocks: int = 2) -> ModelSpec:
    """embedding, (attention, mlp) × n_blocks, head."""
    body = [x for _ in range(n_blocks) for x in (attn(), mlp())]
    return model([emb(), *body, head()])


def hybrid() -> ModelSpec:
    """Every text layer kind once: attention (plain and sliding), MLA, lightning, Mamba-1/2,
    dense MLPs of the three activations, MoE."""
    return model([emb(), mamba2(), mlp("relu2"), attn(window=5), moe(), mla(), mlp("gelu"),
                  lin(), mamba1(), mlp(), head()])


def vlm() -> ModelSpec:
    """Vision front end (patch embed, 2 ViT blocks, projector merging 2 patches) before text."""
    vit = LayerSpec(K.VIT_BLOCK, 24, heads=3, head_dim=8, causal=False, ffn=32, activation="gelu")
    return model([LayerSpec(K.PATCH_EMBED, 24, patch=2, channels=3, tokens=8), vit, vit,
                  LayerSpec(K.PROJECTOR, H, in_hidden=48, ffn=48), emb(), attn(), mlp(), head()])


def job(model: ModelSpec | None, partition, table: ScheduleTable, *, seed: int = 0,
        pinned: tuple[int, ...] | None = None, fault: Fault | None = None, **settings) -> Job:
    """A Job running `table` over `partition` of `model`; `settings` are RuntimeConfig fields
    (here one iteration, no warm-up and a 120 s timeout unless given)."""
    config = RuntimeConfig(**{"iterations": 1, "warmup": 0, "timeout_s": 120.0, **settings})
    return Job(Plan(partition, table), model, config, seed=seed, pinned=pinned, fault=fault)
