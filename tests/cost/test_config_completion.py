"""`quantize cost --checkpoint` reads config.json as transformers' config class for its model_type completes it
(compat/transformers.completed_config): the fields the class derives in __post_init__ or takes by default, which a
published config.json leaves out, price the cache as the library keeps it.

A review priced Qwen3-Next's published config.json (full_attention_interval, no layer_types) as full attention on
every layer with no state (1,572,864 B at 2k where the model keeps 424,608), Gemma 4's full-attention layers at the
sliding layers' head sizes, LFM2's short-convolution layers (full_attn_idxs) as attention; it refused LFM2-MoE's
num_dense_layers and Kimi-Linear's defaults (routed experts "in layers 0..3, the weights hold them in 1..3") and a
Gemma 3 text_config that leaves out the fields equal to the class's defaults ("lacks num_attention_heads").

Each case is a config.json in the hub's form (fields left out as published). The expected figures are the cache
transformers itself keeps for the tiny model over TOKENS tokens, layer by layer (fewer tokens than any window, so a
sliding layer's cache is the tokens seen), and the MoE layers are the layers of that model holding routed experts.
"""

from __future__ import annotations

import json
import math

import families
import pytest

from quantize.cli import main
from quantize.cost import bounds as cost
from quantize.errors import UsageError

TOKENS = 8
COMMON = dict(
    vocab_size=256,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=1,
    pad_token_id=1,
    tie_word_embeddings=False,
)
GEMMA4 = dict(
    COMMON,
    model_type="gemma4_text",
    sliding_window=16,
    vocab_size_per_layer_input=256,
    hidden_size_per_layer_input=16,
    tie_word_embeddings=True,
)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=16)
QWEN2_MOE = dict(
    model_type="qwen2_moe",
    max_window_layers=21,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
)

CASES = {
    # Qwen3-Next-80B-A3B's config.json: every full_attention_interval-th layer full attention, no layer_types
    "qwen3_next_full_attention_interval": dict(
        COMMON,
        **LINEAR,
        model_type="qwen3_next",
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
    ),
    # LFM2's config.json names its attention layers in full_attn_idxs, the others short convolutions
    "lfm2_full_attn_idxs": dict(COMMON, model_type="lfm2", full_attn_idxs=[1, 3], conv_L_cache=3),
    # Gemma 4 as the hub writes it: the full-attention layers' head_dim and KV heads in global_head_dim and
    # num_global_key_value_heads (the class builds per_layer_config from them)
    "gemma4_global_head_dim": dict(
        GEMMA4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        global_head_dim=128,  # 2 × 1 × 128 values a token, the sliding layers' 2 × 2 × 32 twice over
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
    ),
    # no layer_types: the class slides five layers of six and keeps the last full
    "gemma4_no_layer_types": dict(GEMMA4, num_hidden_layers=6, global_head_dim=64),
    # Gemma-3-4b-it's form: a multimodal config whose text_config leaves out the fields equal to the class's
    # defaults (num_attention_heads 8, num_key_value_heads 4, head_dim 256, layer_types)
    "gemma3_nested_text_config_defaults": dict(
        model_type="gemma3",
        text_config=dict(
            model_type="gemma3_text", vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=6
        ),
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=8,
        ),
        mm_tokens_per_image=4,
    ),
    # LFM2-MoE: layers below num_dense_layers keep a dense MLP, the others route to experts
    "lfm2_moe_num_dense_layers": dict(
        COMMON,
        model_type="lfm2_moe",
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        conv_L_cache=3,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        num_dense_layers=1,
    ),
    # Kimi-Linear with linear_attn_config's sizes but not its layer lists, and no first_k_dense_replace or
    # mlp_layer_types: the class's defaults say which layers are which
    "kimi_linear_defaults": dict(
        COMMON,
        model_type="kimi_linear",
        num_hidden_layers=6,
        num_key_value_heads=4,
        kv_lora_rank=64,
        q_lora_rank=None,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        linear_attn_config=dict(num_heads=2, head_dim=32, short_conv_kernel_size=4),
    ),
    # OLMo-hybrid with the class's default layer pattern: Gated DeltaNet, the last layer of four full attention
    "olmo_hybrid_defaults": dict(COMMON, **LINEAR, model_type="olmo_hybrid", linear_conv_kernel_dim=4),
    # DeepSeek-V4's legacy compress_ratios (0 sliding, 4 compressed sparse, 128 heavily compressed attention) and
    # the class's default compress_rates: refused before (issue #57), and priced as sliding windows alone before that
    "deepseek_v4_compress_ratios": dict(
        COMMON,
        model_type="deepseek_v4",
        num_key_value_heads=1,
        head_dim=64,
        q_lora_rank=64,
        qk_rope_head_dim=16,
        sliding_window=16,
        compress_ratios=[0, 4, 128, 4],
        o_groups=2,
        o_lora_rank=32,
        index_n_heads=2,
        index_head_dim=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        hc_mult=2,
    ),
    # MiniMax with the class's default layers: full attention, then lightning (linear) attention, alternately
    "minimax_defaults": dict(COMMON, model_type="minimax", num_local_experts=4, num_experts_per_tok=2),
    # Qwen1.5-MoE-A2.7B's config.json: its window switched off, which the class stores as sliding_window 0 (the cost
    # refused it: "config.json's sliding_window is 0")
    "qwen2_moe_window_off": dict(COMMON, **QWEN2_MOE, use_sliding_window=False, sliding_window=32768),
}


def hub_checkpoint(raw: dict, path):
    """config.json exactly as `raw` (the hub's form), and zero bf16 tensors of the model transformers builds from
    it (on the meta device); the config transformers reads from that folder."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(raw))
    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    tensors = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in model.state_dict().items()}
    save_file(tensors, path / "model.safetensors")
    return path, cfg


def cache_kept(cfg, tokens: int) -> tuple[list[int], list[int]]:
    """The bytes transformers' own bf16 model keeps for one sequence of `tokens` tokens, layer by layer (every tensor
    its cache holds: families.cache_bytes), and the layers holding routed experts."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(2, cfg.get_text_config().vocab_size, (1, tokens))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    kept = families.cache_bytes(cache, cfg.get_text_config().num_hidden_layers)
    experts = sorted({int(n.split(".layers.")[1].split(".")[0]) for n in model.state_dict() if ".experts." in n})
    return kept, experts


@pytest.mark.parametrize("case", list(CASES))
def test_cost_prices_the_cache_transformers_keeps(case, tmp_path, capsys):
    ckpt, cfg = hub_checkpoint(CASES[case], tmp_path / case)
    kept, expert_layers = cache_kept(cfg, TOKENS)
    assert main(["cost", "--checkpoint", str(ckpt), "--context", str(TOKENS), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    priced = [layer["bytes"] for layer in out["kv_bytes_per_layer"]]
    assert priced == kept
    assert out["kv_bytes_per_sequence"] == sum(kept)
    assert [m["layer"] for m in (out.get("moe") or {}).get("layers", [])] == expert_layers


WINDOW = 4  # fewer tokens than TOKENS: a sliding layer's cache is full


@pytest.mark.parametrize(
    "raw",
    [
        dict(COMMON, **QWEN2_MOE, num_hidden_layers=6, use_sliding_window=True, sliding_window=WINDOW),
        dict(COMMON, model_type="smollm3", num_hidden_layers=8, use_sliding_window=True, sliding_window=WINDOW),
    ],
    ids=["qwen2_moe", "smollm3"],
)
def test_a_switched_on_window_slides_the_layers_transformers_slides(raw, tmp_path, capsys):
    """config.json with use_sliding_window true and no layer_types: Qwen2-MoE's class slides layers 0, 2, 4 below
    max_window_layers, SmolLM3's its layers without RoPE (3, 7), not Qwen2's rule (from max_window_layers on, or
    every layer). The layers whose cache transformers' own model keeps at fewer than the TOKENS tokens seen are the
    ones priced at the window, each at WINDOW tokens where transformers keeps one fewer (docs/cost.md); the others
    hold every token, byte for byte."""
    ckpt, cfg = hub_checkpoint(raw, tmp_path / raw["model_type"])
    kept, _ = cache_kept(cfg, TOKENS)
    assert main(["cost", "--checkpoint", str(ckpt), "--context", str(TOKENS), "--json"]) == 0
    priced = json.loads(capsys.readouterr().out)["kv_bytes_per_layer"]
    full = max(kept)  # a layer holding all TOKENS tokens
    slid = [i for i, b in enumerate(kept) if b < full]
    assert slid and [b for b in kept if b < full] == [full * (WINDOW - 1) // TOKENS] * len(slid)
    assert [i for i, layer in enumerate(priced) if layer["tokens_held"] < TOKENS] == slid
    expected = [full * WINDOW // TOKENS if i in slid else b for i, b in enumerate(kept)]
    assert [layer["bytes"] for layer in priced] == expected


def test_qwen3_next_state_is_constant_and_attention_grows(tmp_path, capsys):
    """The published form at 2k and 32k: three Gated DeltaNet layers of four keep a fixed state, one attention
    layer 2 × 2 KV heads × 32 values a token at 2 bytes (the review's repro priced four attention layers)."""
    raw = dict(CASES["qwen3_next_full_attention_interval"], full_attention_interval=4)
    ckpt, _ = hub_checkpoint(raw, tmp_path / "q")
    state = 4 * 32 * 16 * 4 + 4 * (2 * 2 * 32 + 4 * 16) * 2  # float32 state; 16-bit convolution inputs
    for context in (2048, 32768):
        assert main(["cost", "--checkpoint", str(ckpt), "--context", str(context), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["kv_bytes_per_sequence"] == 3 * state + 2 * 2 * 32 * 2 * context
        assert out["state_bytes_per_sequence"] == 3 * state


def one_tensor_checkpoint(raw: dict, path):
    """config.json as `raw` beside one small tensor: enough weights for the cost to reach config.json."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(raw))
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}, path / "model.safetensors")
    return path


@pytest.mark.parametrize(
    "raw,says",
    [
        # a linear-attention layer of a family whose mixer the cost model does not know: its state is not guessed
        (dict(COMMON, model_type="llama", layer_types=["linear_attention", "full_attention"] * 2), "linear_attention"),
        # the class's own refusal, named with config.json
        (dict(COMMON, model_type="qwen3_next", layer_types=["full_attention"] * 3), "Qwen3NextConfig"),
    ],
    ids=["unknown_mixer", "class_refuses"],
)
def test_what_the_class_completes_but_cannot_be_priced_is_refused(raw, says, tmp_path, capsys):
    assert main(["cost", "--checkpoint", str(one_tensor_checkpoint(raw, tmp_path / "c"))]) == 2
    err = capsys.readouterr().err
    assert says in err and "config.json" in err and "Traceback" not in err, err


def test_a_model_type_transformers_does_not_know_is_read_as_written(tmp_path, capsys):
    raw = dict(COMMON, model_type="not_in_transformers", layer_types=["sliding_attention", "full_attention"] * 2)
    ckpt = one_tensor_checkpoint({**raw, "sliding_window": 16}, tmp_path / "c")
    assert main(["cost", "--checkpoint", str(ckpt), "--context", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [layer["tokens_held"] for layer in out["kv_bytes_per_layer"]] == [16, 2048, 16, 2048]


# --- config.json numbers out of range: exit 2 naming the field, never an overflow or a list without end ---------

QWEN = dict(COMMON, **LINEAR, model_type="qwen3_next", linear_conv_kernel_dim=4)


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_key_value_heads", 10**30),  # priced 7.9e35 bytes, exit 0
        ("head_dim", 10**400),  # OverflowError, exit 3
        ("num_hidden_layers", 10**12),  # MemoryError (10**8: minutes)
        ("linear_num_value_heads", 10**200),
        ("kv_lora_rank", 10**400),
    ],
)
def test_shape_fields_past_any_model_are_refused(field, value, tmp_path, capsys):
    ckpt = one_tensor_checkpoint({**QWEN, "qk_rope_head_dim": 16, field: value}, tmp_path / "c")
    assert main(["cost", "--checkpoint", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"config.json's {field}" in err and f"{cost.MAX_SHAPE:,}" in err, err


def test_a_layer_list_past_any_model_is_refused(tmp_path, capsys):
    raw = {
        **QWEN,
        "num_hidden_layers": None,
        "model_type": "nemotron_h",
        "hybrid_override_pattern": "M*" * cost.MAX_SHAPE,
    }
    assert main(["cost", "--checkpoint", str(one_tensor_checkpoint(raw, tmp_path / "c"))]) == 2
    assert "hybrid_override_pattern lists 200,000 layers" in capsys.readouterr().err


@pytest.mark.parametrize("expand", [math.nan, math.inf, 1e308, 1e-9])
def test_mamba_expand_must_be_finite_and_give_a_size(expand):
    """As config.json is read without transformers (the report's decode column): NaN, inf and 1e308 ended in
    ValueError or OverflowError (exit 3); 1e-9 gave a Mamba of no channels."""
    raw = dict(COMMON, model_type="falcon_h1", mamba_n_heads=4, mamba_d_head="auto", mamba_d_state=16)
    raw |= dict(mamba_n_groups=2, mamba_d_conv=4, mamba_expand=expand)
    with pytest.raises(UsageError, match="mamba_expand"):
        cost.kv_layout_from_config(raw)


# --- the cost's own flags: named as the flag, bounded ------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--kv-bytes", "0"], "--kv-bytes 0.0"),
        (["--kv-bytes", "1e308"], "--kv-bytes 1e+308"),  # Infinity in the JSON, exit 0
        (["--kv-bytes", "nan"], "--kv-bytes nan"),
        (["--project-params", "nan"], "--project-params nan"),
        (["--project-params", "1e400"], "--project-params inf"),
        (["--project-params", "1e9", "--project-share", "2"], "--project-share 2.0"),
    ],
)
def test_cost_flags_out_of_range_are_named_as_the_flag(flags, says, tmp_path, capsys):
    ckpt = one_tensor_checkpoint(dict(COMMON, model_type="llama"), tmp_path / "c")
    assert main(["cost", "--checkpoint", str(ckpt), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "`kv_bytes`" not in err and "quantize.decode_cost" not in err, err


def test_kv_bytes_past_any_element_is_refused_without_a_checkpoint(capsys):
    assert main(["cost", "--kv-bytes", "1e308", "--json"]) == 2
    assert "--kv-bytes" in capsys.readouterr().err
    with pytest.raises(UsageError, match="at most 64"):
        cost.KVLayout(80, 8, 128, 1e308)
