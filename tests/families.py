"""Tiny seeded checkpoints of the model families people quantize in 2026, built from transformers' own config
classes (no download): `build(family, path)` writes safetensors weights (bf16), config.json and a word-level
tokenizer (conftest.tokenizer_for), as a Hugging Face folder would hold them.

Shapes: hidden 128, 4 query heads and 2 KV heads of 32, 2 layers, vocabulary 256: every linear's input features
are a multiple of 128 (the group of the shipped int4 recipes and the side of FP8 block), so a recipe's bits per
weight on these models are the format's, not its fallbacks'. MoE families: 4 routed experts, top-2; DeepSeek-V3's
first layer dense (first_k_dense_replace), one shared expert, multi-head latent attention; gpt-oss alternates
sliding and full attention; Gemma 2/3 alternate sliding windows of 16.

Also importable outside pytest (benchmarks/families.py puts tests/ on sys.path)."""

from __future__ import annotations

from pathlib import Path

from conftest import tokenizer_for

COMMON = dict(
    vocab_size=256,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    bos_token_id=1,  # the tokenizer's <eos> (conftest.tokenizer_for): some configs default to ids past 256
    eos_token_id=1,
    pad_token_id=1,
)
EXPERTS = dict(num_experts_per_tok=2)

# model_type -> the fields that make it this family (beside COMMON)
DENSE = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "mistral": dict(sliding_window=None),
    "gemma2": dict(sliding_window=16, tie_word_embeddings=True),
    "gemma3_text": dict(sliding_window=16, sliding_window_pattern=2, tie_word_embeddings=True),
    "phi3": {},
}
MOE = {
    "qwen3_moe": dict(EXPERTS, num_experts=4, moe_intermediate_size=128, decoder_sparse_step=1),
    "mixtral": dict(EXPERTS, num_local_experts=4),
    "olmoe": dict(EXPERTS, num_experts=4),
    "deepseek_v3": dict(
        EXPERTS,
        num_key_value_heads=4,
        head_dim=16,  # DeepSeek-V3's rotary part (qk_rope_head_dim)
        n_routed_experts=4,
        moe_intermediate_size=128,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=128,
        q_lora_rank=128,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=32,
        n_group=2,
        topk_group=1,
    ),
    "gpt_oss": dict(EXPERTS, num_local_experts=4, sliding_window=16),
    "llama4_text": dict(
        EXPERTS, num_local_experts=4, intermediate_size_mlp=256, interleave_moe_layer_step=1, num_experts_per_tok=1
    ),
    # GLM-4.5/4.6 (glm4_moe): DeepSeek-V3's routing (n_routed_experts, grouped top-k, a shared expert, a dense first
    # layer) on plain GQA attention
    "glm4_moe": dict(
        EXPERTS,
        n_routed_experts=4,
        n_shared_experts=1,
        moe_intermediate_size=128,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    ),
    # MiniMax-M2: Mixtral-like experts (num_local_experts) stored as block_sparse_moe.experts.N.w1/w2/w3, q/k norms
    "minimax_m2": dict(EXPERTS, num_local_experts=4),
    # ERNIE 4.5's config class spells the expert count moe_num_experts and k moe_k (its attribute_map takes the
    # usual names); its first layer is dense (moe_layer_start_index 1)
    "ernie4_5_moe": dict(
        EXPERTS, moe_num_experts=4, moe_intermediate_size=128, moe_num_shared_experts=1, moe_layer_start_index=1
    ),
}
# Families released in 2026 whose layers are not all attention (4 layers mixing the kinds), and the newest
# attention layouts: linear attention (Gated DeltaNet, Kimi Delta Attention), Mamba2, short convolutions, sparse
# attention with an indexer, per-layer head sizes, chunked attention. Their state sizes are small and distinct
# (heads 4 or 2, state 16, kernels 4 and 3) so a hand count tells the fields apart.
LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
MIXED = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
# Gated DeltaNet mixed with attention, every MLP a sparse MoE block and a shared expert (Qwen3-Next, Qwen3.5-MoE)
GDN_MOE = dict(
    **LINEAR,
    **EXPERTS,
    num_hidden_layers=4,
    layer_types=MIXED,
    num_experts=4,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
)
HYBRID = {
    "qwen3_next": dict(**GDN_MOE, decoder_sparse_step=1),
    "qwen3_5_text": dict(**LINEAR, num_hidden_layers=4, layer_types=MIXED),
    "qwen3_5_moe_text": GDN_MOE,
    "kimi_linear": dict(
        **EXPERTS,
        num_hidden_layers=4,
        layer_types=MIXED,
        linear_num_heads=2,
        linear_head_dim=32,
        linear_conv_kernel_dim=4,
        num_key_value_heads=4,
        kv_lora_rank=64,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=32,
        num_experts=4,
        moe_intermediate_size=128,
    ),
    "nemotron_h": dict(
        **EXPERTS,
        layers_block_type=["linear_attention", "full_attention", "mlp", "moe"],
        mamba_num_heads=4,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        n_routed_experts=4,
        n_shared_experts=1,
        moe_intermediate_size=128,
        moe_shared_expert_intermediate_size=128,
        num_hidden_layers=None,
    ),
    "granitemoehybrid": dict(
        **EXPERTS,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        mamba_n_heads=4,
        mamba_d_head=64,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=2,
        num_local_experts=4,
        shared_intermediate_size=128,
    ),
    "falcon_h1": dict(
        num_hidden_layers=4,
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_ssm=128,
        mamba_d_state=16,
        mamba_n_groups=2,
        mamba_d_conv=4,
        mamba_expand=2,
    ),
    "lfm2": dict(num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3),
    "deepseek_v32": dict(
        **MOE["deepseek_v3"],
        num_hidden_layers=4,
        index_head_dim=32,
        index_n_heads=4,
        index_topk=16,
    ),
    "gemma4_text": dict(
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=16,
        global_head_dim=64,
        num_global_key_value_heads=2,
        attention_k_eq_v=True,
        vocab_size_per_layer_input=256,
        hidden_size_per_layer_input=16,
        tie_word_embeddings=True,
    ),
    "llama4_text": dict(
        **MOE["llama4_text"],
        num_hidden_layers=4,
        attention_chunk_size=16,
        layer_types=["chunked_attention"] * 3 + ["full_attention"],
    ),
}
FAMILIES = {**DENSE, **MOE, **HYBRID}
# Attention kinds whose decode cache transformers keeps in a cache class of the family's own, built for the cost
# model's measured tests (tests/cost/test_cache_measured.py), not among FAMILIES (the evaluation tests run every one
# of those): MiniMax alternates full attention with lightning (linear) attention, whose state is heads × head_dim²;
# DeepSeek-V4 mixes a sliding window with compressed attention (CSA, with an indexer, and HCA) at rates 4 and 8,
# small enough that a few dozen tokens close windows of both
CACHE_KINDS = {
    "minimax": dict(EXPERTS, num_hidden_layers=4, num_local_experts=4, block_size=8),
    "deepseek_v4": dict(
        EXPERTS,
        num_hidden_layers=4,
        layer_types=[
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "compressed_sparse_attention",
        ],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        num_key_value_heads=1,
        head_dim=64,
        partial_rotary_factor=0.25,
        q_lora_rank=64,
        sliding_window=64,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        index_n_heads=2,
        index_head_dim=32,
        index_topk=4,
        o_groups=2,
        o_lora_rank=32,
        n_routed_experts=4,  # its class maps COMMON's intermediate_size to moe_intermediate_size
        hc_mult=2,
        num_nextn_predict_layers=0,
    ),
}


def config(family: str, **overrides):
    """The transformers config of `family` (a model_type of FAMILIES) at the tiny shapes."""
    from transformers import AutoConfig

    known = {**FAMILIES, **CACHE_KINDS}
    if family not in known:
        raise KeyError(f"unknown family {family!r}; one of {', '.join(known)}")
    return AutoConfig.for_model(family, **{**COMMON, **known[family], **overrides})


def _tensors_held(obj, seen: set[int]):
    """Every tensor reachable from a transformers cache object (its attributes, and theirs where they are objects of
    transformers: the cache layers; their dicts and lists), once each; a 0-dimensional tensor is bookkeeping
    (DynamicSlidingWindowLayer keeps its window size as one), no data."""
    import torch

    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen and obj.dim() > 0:
            seen.add(id(obj))
            yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors_held(value, seen)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _tensors_held(value, seen)
    elif type(obj).__module__.startswith("transformers.") and hasattr(obj, "__dict__"):
        yield from _tensors_held(vars(obj), seen)


def cache_bytes(cache, layers: int) -> list[int]:
    """The bytes a transformers cache object holds for each of a model's `layers` layers, numel × element_size of
    every tensor counted once (DeepSeek-V4's compressed layers keep their keys as their values): its layer's
    (cache.layers[i]: keys and values, convolution and recurrent states, a compressor's dicts) and MiniMaxCache's
    linear_cache[i] (the lightning-attention state, kept outside the layers). Every tensor the cache holds must be
    one layer's: a state kept elsewhere would go unmeasured (asserted)."""
    seen: set[int] = set()
    held = [0] * layers
    for i in range(layers):
        mine = [cache.layers[i]] if i < len(cache.layers) else []
        linear = getattr(cache, "linear_cache", [])
        mine += [linear[i]] if i < len(linear) else []
        held[i] = sum(t.numel() * t.element_size() for t in _tensors_held(mine, seen))
    assert not list(_tensors_held(cache, seen)), "the cache holds tensors of no layer"
    return held


def build(family: str, path: Path, seed: int = 0) -> Path:
    """A 2-layer `family` model with seeded random bf16 weights, saved to `path` as safetensors with its
    config.json and a word-level tokenizer over the shipped calibration text; returns `path`."""
    return save_random(config(family), path, seed)


def save_random(cfg, path: Path, seed: int = 0) -> Path:
    """The model of transformers config `cfg` with seeded random bf16 weights, saved to `path` as safetensors with
    its config.json and conftest's word-level tokenizer; returns `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer_for(cfg.vocab_size).save_pretrained(path)
    return Path(path)


# the tensors DeepSeek-V3's and GLM-4.5's published multi-token-prediction layer (model.layers.61, .92) holds beside a
# decoder layer's: its embedding and output head (copies of the model's), the norms of the two inputs it joins (the
# token's embedding, the decoder's last hidden state) and their projection back to hidden_size
MTP_EXTRA = {
    "embed_tokens.weight": ("vocab", "hidden"),
    "enorm.weight": ("hidden",),
    "hnorm.weight": ("hidden",),
    "eh_proj.weight": ("hidden", "2hidden"),
    "shared_head.norm.weight": ("hidden",),
    "shared_head.head.weight": ("vocab", "hidden"),
}


def build_mtp(family: str, path: Path, seed: int = 0) -> tuple[Path, Path]:
    """One seeded `family` model (an MTP family: DeepSeek-V3, GLM-4.5) saved twice under `path`: `decoder`, its 2
    decoder layers alone (as transformers saves it), and `mtp`, the same bytes plus one multi-token-prediction layer
    after them as the published checkpoints store it (layers.2: a decoder layer, here the seeded model's third, and
    MTP_EXTRA), config.json declaring it (num_nextn_predict_layers 1). Both hold the same config.json and tokenizer.
    Returns (decoder, mtp)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    n, h, v = COMMON["num_hidden_layers"], COMMON["hidden_size"], COMMON["vocab_size"]
    full = save_random(config(family, num_hidden_layers=n + 1), path / "full", seed)
    cfg = json.loads((full / "config.json").read_text())
    # per-layer lists (DeepSeek-V3.2's layer_types, mlp_layer_types) describe the decoder's layers alone
    cfg |= {k: x[:n] for k, x in cfg.items() if isinstance(x, list) and len(x) == n + 1 and k.endswith("layer_types")}
    cfg |= {"num_hidden_layers": n, "num_nextn_predict_layers": 1}
    tensors = load_file(full / "model.safetensors")
    g = torch.Generator().manual_seed(seed + 1)
    sizes = {"hidden": h, "2hidden": 2 * h, "vocab": v}
    extra = {
        f"model.layers.{n}.{k}": torch.randn([sizes[d] for d in dims], generator=g).to(torch.bfloat16)
        for k, dims in MTP_EXTRA.items()
    }
    out = []
    for name, kept in (("decoder", {k: t for k, t in tensors.items() if f".layers.{n}." not in k}), ("mtp", tensors)):
        folder = path / name
        shutil.copytree(full, folder, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
        save_file({**kept, **(extra if name == "mtp" else {})}, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        out.append(folder)
    shutil.rmtree(full)
    return out[0], out[1]


# the tensors Qwen3-Next's and Qwen3.5's published MTP module holds under its own prefix `mtp.` beside its decoder
# layers (mtp.layers.0: a full-attention decoder layer): the projection of the joined embedding and hidden state back
# to hidden_size, the norms of the two and the module's final norm (config.json: mtp_num_hidden_layers)
MTP_PREFIXED_EXTRA = {
    "fc.weight": ("hidden", "2hidden"),
    "norm.weight": ("hidden",),
    "pre_fc_norm_embedding.weight": ("hidden",),
    "pre_fc_norm_hidden.weight": ("hidden",),
}


def build_mtp_prefixed(family: str, path: Path, declared: bool = True, seed: int = 0) -> tuple[Path, Path]:
    """One seeded `family` model (an MTP family storing its module under `mtp.`: Qwen3-Next, Qwen3.5) saved twice
    under `path`: `decoder`, as transformers saves it, and `mtp`, the same bytes plus the MTP module as the published
    checkpoints store it (mtp.layers.0: seeded tensors of the shapes of the decoder's last layer, a full-attention
    one; and MTP_PREFIXED_EXTRA), config.json declaring it (mtp_num_hidden_layers 1) where `declared`. Returns
    (decoder, mtp)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    decoder = build(family, path / "decoder", seed)
    cfg = json.loads((decoder / "config.json").read_text())
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    tensors = load_file(decoder / "model.safetensors")
    last = f"model.layers.{n - 1}."
    shapes = {f"layers.0.{k.removeprefix(last)}": list(t.shape) for k, t in tensors.items() if k.startswith(last)}
    sizes = {"hidden": h, "2hidden": 2 * h}
    shapes |= {k: [sizes[d] for d in dims] for k, dims in MTP_PREFIXED_EXTRA.items()}
    g = torch.Generator().manual_seed(seed + 1)
    extra = {f"mtp.{k}": torch.randn(s, generator=g).to(torch.bfloat16) for k, s in sorted(shapes.items())}
    mtp = path / "mtp"
    shutil.copytree(decoder, mtp)
    save_file({**tensors, **extra}, mtp / "model.safetensors", metadata={"format": "pt"})
    if declared:
        (mtp / "config.json").write_text(json.dumps(cfg | {"mtp_num_hidden_layers": 1}, indent=2, sort_keys=True))
    return decoder, mtp
