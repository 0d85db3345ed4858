"""LayerKind and LayerSpec: the unit that partitioning moves between stages."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LayerKind(str, Enum):
    EMBEDDING = "embedding"
    ATTENTION = "attention"            # softmax self-attention with GQA; window > 0 = sliding window
    MLA = "mla"                        # multi-head latent attention (DeepSeek-V3, Kimi K2)
    LINEAR_ATTENTION = "linear_attention"  # lightning attention (MiniMax-Text-01)
    MAMBA2 = "mamba2"
    MAMBA1 = "mamba1"
    MLP = "mlp"                        # dense FFN; `activation` says swiglu, gelu or relu2
    MOE = "moe"
    PATCH_EMBED = "patch_embed"        # vision patch embedding
    VIT_BLOCK = "vit_block"            # vision transformer block (attention + MLP)
    PROJECTOR = "projector"            # vision-to-text projector (MLP)
    HEAD = "head"                      # final norm + LM head + cross-entropy loss


@dataclass(frozen=True)
class LayerSpec:
    """One layer with its shape; fields that do not apply to a kind stay 0.

    `tokens` is the number of tokens this layer processes per sample when it differs from the
    model's sequence length (vision layers work on image patches); 0 means "the sequence length".

    Vision conventions: PATCH_EMBED and VIT_BLOCK have `hidden` = the ViT width and `tokens` = patch
    tokens per sample; PROJECTOR maps `tokens` merged tokens of width `in_hidden` through `ffn`
    to `hidden` = the language model's width.
    """

    kind: LayerKind
    hidden: int
    name: str = ""
    # attention (GQA) and ViT blocks
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    window: int = 0                    # sliding-window size; 0 = full causal attention
    causal: bool = True
    # dense MLP / ViT MLP / projector
    ffn: int = 0
    activation: str = "swiglu"         # swiglu | gelu | relu2
    bias: bool = False                 # linear layers carry biases (gpt-oss, Qwen2 QKV, ViT)
    qk_norm: bool = False              # per-head RMSNorm on queries and keys (Qwen3)
    # MoE
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    shared_ffn: int = 0
    # Mamba
    ssm_state: int = 0
    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_groups: int = 1
    conv_kernel: int = 4
    ssm_chunk: int = 256
    dt_rank: int = 0                   # Mamba-1 only
    # MLA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    # embedding / head
    vocab: int = 0
    # vision
    patch: int = 0
    channels: int = 3
    temporal_patch: int = 1            # frames per patch (Qwen2-VL's Conv3d patch embedding uses 2)
    in_hidden: int = 0                 # projector input width (ViT hidden × merge factor)
    tokens: int = 0
    # sub-layer splitting (octopipe.model.pieces): this is piece `piece` of `pieces` of one layer
    piece: int = 0
    pieces: int = 1

    @property
    def label(self) -> str:
        return self.name or self.kind.value
