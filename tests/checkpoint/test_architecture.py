"""Architecture knowledge read from config.json fields (checkpoint/architecture.py): attention kinds and
windows per layer, the KV layout, MoE layers, experts and top-k, and the part of the model a tensor name is."""

from __future__ import annotations

import pytest

from quantize.checkpoint import architecture as arch
from quantize.errors import UsageError

GQA = {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}


def windows(cfg: dict) -> list[int | None]:
    return [layer.window for layer in arch.attention_layers(cfg)]


@pytest.mark.parametrize(
    "extra,expect",
    [
        ({}, [None] * 6),  # Llama: full attention
        ({"sliding_window": 64}, [64] * 6),  # Mistral: every layer slides
        ({"sliding_window": 64, "use_sliding_window": False}, [None] * 6),  # Qwen2/Qwen3(-MoE) default
        ({"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 4}, [None] * 4 + [64] * 2),
        ({"model_type": "gemma2", "sliding_window": 64}, [64, None] * 3),  # an older Gemma 2 config.json
        ({"model_type": "gemma3_text", "sliding_window": 64}, [64] * 5 + [None]),  # Gemma 3's default pattern 6
        ({"sliding_window": 64, "sliding_window_pattern": 3}, [64, 64, None] * 2),
        ({"sliding_window": 64, "layer_types": ["full_attention", "sliding_attention"] * 3}, [None, 64] * 3),
        (  # Llama 4: chunked attention keeps at most attention_chunk_size tokens
            {"attention_chunk_size": 32, "layer_types": ["chunked_attention"] * 3 + ["full_attention"] * 3},
            [32] * 3 + [None] * 3,
        ),
    ],
)
def test_attention_windows_per_layer(extra, expect):
    assert windows({**GQA, **extra}) == expect


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("qwen2", {}),  # a Qwen2.5 config.json: sliding_window set, use_sliding_window absent
        ("qwen2", {"use_sliding_window": True, "max_window_layers": 4}),
        ("qwen3", {"use_sliding_window": True}),  # from the class's own max_window_layers (28): none slides
        ("qwen3_moe", {}),
        ("qwen3_moe", {"use_sliding_window": True, "max_window_layers": 4}),  # its class slides every layer
    ],
)
def test_a_switched_window_is_the_config_classes_own(model_type, extra):
    """Where config.json lists no layer_types, a family whose class switches its window with use_sliding_window
    keeps none unless it is set: a Qwen2.5 config.json (sliding_window 32768, no switch) was priced as sliding on
    every layer, under the cache transformers keeps past 32k."""
    from transformers import AutoConfig

    cfg = {**GQA, "model_type": model_type, "sliding_window": 64, **extra}
    theirs = AutoConfig.for_model(**cfg)
    types = (
        getattr(theirs, "layer_types", None)
        or ["sliding_attention" if theirs.sliding_window else "full_attention"] * GQA["num_hidden_layers"]
    )
    assert windows(cfg) == [64 if t == "sliding_attention" else None for t in types]


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("qwen2_moe", {"max_window_layers": 4}),  # slides layers 0 and 2 (Qwen2's rule: 4 and 5)
        ("qwen2_moe", {}),  # the class's max_window_layers 28: layers 0, 2, 4 (Qwen2's rule: none)
        ("smollm3", {}),  # slides its layer without RoPE, 3 (read before as sliding every layer)
        ("smollm3", {"no_rope_layers": [1, 0, 1, 1, 0, 1]}),
    ],
)
def test_a_class_with_its_own_switched_window_rule_is_read_through_the_class(model_type, extra):
    """Qwen2-MoE's and SmolLM3's classes, switched on (use_sliding_window true) without layer_types, derive
    layer_types by rules of their own: read as written, Qwen2's rule priced other layers as sliding than the ones
    transformers' cache slides; now refused as written, naming the switch, and read from config.json as the class
    completes it (what `quantize cost` reads): the layers and window of the cache transformers builds for it."""
    from transformers import AutoConfig
    from transformers.cache_utils import DynamicCache

    from quantize.checkpoint.loader import completed_config

    cfg = {**GQA, "model_type": model_type, "sliding_window": 64, "use_sliding_window": True, **extra}
    with pytest.raises(UsageError, match="use_sliding_window true"):
        arch.attention_layers(cfg)
    kept = [getattr(layer, "sliding_window", None) for layer in DynamicCache(config=AutoConfig.for_model(**cfg)).layers]
    assert windows(completed_config(cfg)) == kept and 64 in kept and None in kept


def test_a_window_the_class_switches_off_is_no_window():
    """Qwen2-MoE's class stores sliding_window 0 while use_sliding_window is false (Qwen1.5-MoE's config.json, a
    checkpoint transformers saves): read through the class, every layer full attention, as transformers' cache keeps
    it; the cost of every such checkpoint was refused ("config.json's sliding_window is 0")."""
    from quantize.checkpoint.loader import completed_config

    cfg = completed_config({**GQA, "model_type": "qwen2_moe", "sliding_window": 32768, "use_sliding_window": False})
    assert cfg["sliding_window"] == 0 and windows(cfg) == [None] * GQA["num_hidden_layers"]
    with pytest.raises(UsageError, match="sliding_window is 0"):  # a layer that slides still needs a window
        windows({**cfg, "layer_types": ["sliding_attention"] * GQA["num_hidden_layers"]})


@pytest.mark.parametrize(
    "extra",
    [{}, {"no_rope_layers": [1, 0, 1, 1, 0, 1]}, {"no_rope_layer_interval": 3}],
    ids=["default-interval", "listed", "interval-3"],
)
def test_llama_4_without_layer_types_chunks_the_layers_transformers_chunks(extra):
    """A Llama 4 config.json as published (no layer_types): every layer was priced as full attention; the layers
    are Llama4TextConfig's own (transformers derives them from no_rope_layers), each with its window."""
    from transformers import Llama4TextConfig

    cfg = {**GQA, "model_type": "llama4_text", "attention_chunk_size": 32, **extra}
    theirs = Llama4TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"}).layer_types
    assert [layer.kind for layer in arch.attention_layers(cfg)] == theirs and "chunked_attention" in theirs
    assert windows(cfg) == [32 if t == "chunked_attention" else None for t in theirs]
    top = {"model_type": "llama4", "text_config": cfg}
    assert windows(top) == windows(cfg)


def test_a_multimodal_config_reads_its_text_config():
    cfg = {"model_type": "gemma3", "text_config": {**GQA, "model_type": "gemma3_text", "sliding_window": 8}}
    assert windows(cfg) == [8] * 5 + [None]
    assert arch.kv_spec(cfg).values_per_token == 2 * 2 * 64


@pytest.mark.parametrize(
    "extra,words",
    [
        ({"layer_types": ["lightning_attention"] * 6}, "'lightning_attention'"),
        ({"layer_types": ["full_attention"] * 5}, "lists 5 layer types, num_hidden_layers is 6"),
        ({"layer_types": ["sliding_attention"] * 6}, "sliding_window is not set"),
        ({"sliding_window": True}, "sliding_window is True"),
        ({"num_attention_heads": "8"}, "num_attention_heads is '8'"),
    ],
)
def test_bad_attention_fields_are_usage_errors(extra, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        arch.kv_spec({**GQA, **extra})


def test_a_linear_attention_layer_of_a_family_whose_mixer_is_unknown_is_refused():
    with pytest.raises(UsageError, match="'llama'\\) names linear_attention layers"):
        arch.cache_spec({**GQA, "model_type": "llama", "layer_types": ["linear_attention"] * 6})


def test_kv_layouts():
    assert arch.kv_spec(GQA).values_per_token == 2 * 2 * 64  # head_dim from hidden_size / heads
    assert arch.kv_spec({**GQA, "head_dim": 128}).values_per_token == 2 * 2 * 128
    mla = arch.kv_spec({**GQA, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_key_value_heads": 128})
    assert (mla.attention, mla.values_per_token) == ("MLA", 576)
    with pytest.raises(UsageError, match="qk_rope_head_dim"):
        arch.kv_spec({**GQA, "kv_lora_rank": 512})


@pytest.mark.parametrize(
    "extra,layers",
    [
        ({"num_local_experts": 8}, [0, 1, 2, 3, 4, 5]),  # Mixtral, gpt-oss: every layer
        ({"num_experts": 8, "mlp_only_layers": [0, 3], "decoder_sparse_step": 1}, [1, 2, 4, 5]),  # Qwen
        ({"num_experts": 8, "mlp_only_layers": [], "decoder_sparse_step": 2}, [1, 3, 5]),
        ({"model_type": "deepseek_v3", "n_routed_experts": 8, "first_k_dense_replace": 3}, [3, 4, 5]),
        ({"model_type": "deepseek_v2", "n_routed_experts": 8, "first_k_dense_replace": 1, "moe_layer_freq": 2}, [2, 4]),
        ({"num_local_experts": 8, "moe_layers": [1, 3, 5]}, [1, 3, 5]),  # Llama 4
        ({"num_local_experts": 8, "interleave_moe_layer_step": 2}, [1, 3, 5]),
    ],
)
def test_moe_layers(extra, layers):
    spec = arch.moe_spec({**GQA, "num_experts_per_tok": 2, **extra})
    assert spec is not None and list(spec.layers) == layers and (spec.experts, spec.top_k) == (8, 2)


def test_dense_and_bad_moe_configs():
    assert arch.moe_spec(GQA) is None
    assert arch.moe_spec({**GQA, "num_local_experts": 1, "num_experts_per_tok": 1}) is None
    assert (
        arch.moe_spec(
            {**GQA, "model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1}
        ).shared_experts
        == 1
    )
    for bad in ({"num_experts": 8}, {"num_experts": 8, "num_experts_per_tok": 9}):
        with pytest.raises(UsageError, match="num_experts_per_tok"):
            arch.moe_spec({**GQA, **bad})


@pytest.mark.parametrize(
    "name,role,part",
    [
        ("model.layers.3.mlp.experts.17.down_proj", "payload", "routed_experts"),
        ("model.layers.3.block_sparse_moe.experts.0.w1", "linear_kept", "routed_experts"),
        ("model.layers.3.mlp.experts", "linear_kept", "routed_experts"),  # fused gate_up_proj / down_proj
        ("model.layers.3.feed_forward.experts", "linear_kept", "routed_experts"),  # Llama 4
        ("model.layers.3.mlp.shared_experts.up_proj", "linear_kept", "shared_experts"),
        ("model.layers.3.mlp.shared_expert.up_proj", "linear_kept", "shared_experts"),
        ("model.layers.3.mlp.shared_expert_gate", "linear_kept", "router"),
        ("model.layers.3.mlp.gate", "linear_kept", "router"),
        ("model.layers.3.block_sparse_moe.gate", "linear_kept", "router"),
        ("model.layers.3.mlp.router", "linear_kept", "router"),
        ("model.layers.3.mlp.gate_proj", "scale", "mlp"),
        ("model.layers.3.self_attn.kv_b_proj", "payload", "attention"),
        ("model.layers.3.self_attn.q_norm", "norm", "norm"),
        ("model.embed_tokens", "embedding", "embedding"),
        ("lm_head", "lm_head", "lm_head"),
        ("model.vision_tower.patch", "linear_kept", "other"),
    ],
)
def test_part_of(name, role, part):
    assert arch.part_of(name, role) == part


def _saved(model_type: str, **fields) -> dict:
    """config.json as transformers' config class of `model_type` writes it (save_pretrained)."""
    import json

    from transformers import AutoConfig

    return json.loads(AutoConfig.for_model(model_type, **fields).to_json_string(use_diff=True))


@pytest.mark.parametrize(
    "model_type,fields,expect",
    [
        # ERNIE 4.5 stores num_experts as moe_num_experts and top-k as moe_k (its attribute_map); MoE layers from
        # moe_layer_start_index on, every moe_layer_interval-th (Ernie4_5_MoeDecoderLayer)
        (
            "ernie4_5_moe",
            dict(moe_num_experts=4, moe_k=2, moe_layer_start_index=1, moe_layer_interval=2),
            (4, 2, (1, 3)),
        ),
        # Kimi-Linear stores top-k as num_experts_per_token; its MoE layers are mlp_layer_types' "sparse" ones
        ("kimi_linear", dict(num_experts=4, num_experts_per_tok=2), (4, 2, (1, 2, 3))),
        # Nemotron-H: n_routed_experts; the MoE layers are layers_block_type's "moe" blocks, no num_hidden_layers saved
        ("nemotron_h", dict(layers_block_type=["linear_attention", "moe", "full_attention", "moe"]), (8, 2, (1, 3))),
        # DeepSeek-V3.2: mlp_layer_types from first_k_dense_replace
        ("deepseek_v32", dict(n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2), (4, 2, (2, 3))),
    ],
)
def test_moe_fields_as_each_config_class_stores_them(model_type, fields, expect):
    cfg = _saved(model_type, num_hidden_layers=4, **fields)
    if model_type == "nemotron_h":
        assert "num_hidden_layers" not in cfg
    spec = arch.moe_spec(cfg)
    assert (spec.experts, spec.top_k, spec.layers) == expect
