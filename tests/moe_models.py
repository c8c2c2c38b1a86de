"""Tiny seeded mixture-of-experts checkpoints for conversion tests, built from transformers' own config classes
(no download): 2 layers, hidden 64, 4 routed experts, built and saved by families.save_random, saved as
safetensors the way transformers 5 writes each family (per-expert tensors for Qwen3-MoE, OLMoE, DeepSeek-V3 and
Mixtral's `block_sparse_moe.experts.N.w1`; fused 3-D tensors for gpt-oss and Llama 4)."""

from __future__ import annotations

from pathlib import Path

from families import save_random

MOE_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
# every expert's projections share one group size under GPTQ's group 128 (smaller-group): moe_intermediate 64
MOE = {
    "qwen3_moe": dict(
        head_dim=16, intermediate_size=96, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
    ),
    "olmoe": dict(intermediate_size=64, num_experts=4, num_experts_per_tok=2, eos_token_id=1, pad_token_id=1),
    "deepseek_v3": dict(
        num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=64, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=2, topk_group=1,
    ),
    "mixtral": dict(head_dim=16, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(
        head_dim=16, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
    ),
    "llama4_text": dict(
        head_dim=16, intermediate_size=64, intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=1,
    ),
}  # fmt: skip


def make_tiny_moe(path: Path, family: str, seed: int = 0) -> Path:
    """A 2-layer `family` MoE (MOE) with seeded random bf16 weights and a tokenizer, saved as safetensors."""
    from transformers import AutoConfig

    return save_random(AutoConfig.for_model(family, **{**MOE_COMMON, **MOE[family]}), path, seed)
