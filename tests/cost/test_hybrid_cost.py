"""The decode cache of every attention kind (issue #57), priced from config.json as transformers 5.17's own config
classes write it (tests/families.py HYBRID: 4 layers mixing the kinds): KV of the layers that hold a KV cache, each
with its own head sizes and window or chunk, plus the fixed recurrent and convolution state of the others.

Every expected figure is a hand count written out from the tiny configs' numbers (families.COMMON: hidden 128,
4 query heads, 2 KV heads of 32; families.LINEAR and HYBRID), layer by layer, independent of the code: KV at 2 bytes
a value (a 16-bit cache), a recurrent/SSM state at 4 bytes a value (float32), a convolution state at 2 bytes.
"""

from __future__ import annotations

import json

import families
import pytest

from quantize.cli import main
from quantize.cost import bounds as cost
from quantize.errors import UsageError

KV, STATE, CONV = 2, 4, 2  # bytes a value
GQA_TOKEN = 2 * 2 * 32  # K and V: 2 KV heads × head_dim 32 = 128 values a token
# Gated DeltaNet (families.LINEAR): 4 v heads × k dim 32 × v dim 16; conv 4 × (2·2·32 + 4·16) = 4 × 192
GDN = 4 * 32 * 16 * STATE + 4 * (2 * 2 * 32 + 4 * 16) * CONV  # 8,192 + 1,536 = 9,728
# Kimi Delta Attention: 2 heads × 32 × 32; conv 4 × 3·2·32 = 4 × 192
KDA = 2 * 32 * 32 * STATE + 4 * (3 * 2 * 32) * CONV  # 8,192 + 1,536 = 9,728
# Mamba2 of Nemotron-H: 4 heads × 32 × state 16; conv 4 × (4·32 + 2·2·16) = 4 × 192
NEMOTRON_MAMBA = 4 * 32 * 16 * STATE + 4 * (4 * 32 + 2 * 2 * 16) * CONV  # 8,192 + 1,536
# Mamba2 of Granite 4: 4 heads × 64 × 16; conv 4 × (2·128 + 2·1·16) = 4 × 288
GRANITE_MAMBA = 4 * 64 * 16 * STATE + 4 * (2 * 128 + 2 * 1 * 16) * CONV  # 16,384 + 2,304 = 18,688
# Mamba2 of Falcon-H1 (mamba_d_ssm 128): 4 heads × 32 × 16; conv 4 × (128 + 2·2·16) = 4 × 192
FALCON_MAMBA = 4 * 32 * 16 * STATE + 4 * (128 + 2 * 2 * 16) * CONV  # 9,728
LFM2_CONV = 3 * 128 * CONV  # conv_L_cache 3 × hidden 128 = 768


def hand(context: int) -> dict[str, list[float]]:
    """Per layer, the bytes one sequence keeps at `context` tokens (a hand count from the tiny configs)."""
    c = context
    gqa = GQA_TOKEN * c * KV
    return {
        # linear_attention, full_attention, linear_attention, full_attention
        "qwen3_next": [GDN, gqa, GDN, gqa],
        "qwen3_5_text": [GDN, gqa, GDN, gqa],
        "qwen3_5_moe_text": [GDN, gqa, GDN, gqa],  # its experts keep nothing
        # full layers are MLA: kv_lora_rank 64 + qk_rope_head_dim 16 = 80 values a token
        "kimi_linear": [KDA, 80 * c * KV, KDA, 80 * c * KV],
        # mamba, attention, mlp, moe: MLP and MoE blocks keep nothing
        "nemotron_h": [NEMOTRON_MAMBA, gqa, 0, 0],
        "granitemoehybrid": [GRANITE_MAMBA, gqa, GRANITE_MAMBA, gqa],
        # every layer: attention and Mamba2 side by side
        "falcon_h1": [gqa + FALCON_MAMBA] * 4,
        "lfm2": [LFM2_CONV, gqa, LFM2_CONV, gqa],
        # MLA 128 + 16, plus the indexer's keys: index_head_dim 32 = 176 values a token, every layer
        "deepseek_v32": [176 * c * KV] * 4,
        # sliding layers 2 × 2 × 32 over at most 16 tokens; full layers 2 × 2 KV heads × 64 (global_head_dim)
        "gemma4_text": [GQA_TOKEN * min(c, 16) * KV, 2 * 2 * 64 * c * KV] * 2,
        # three chunked layers hold at most attention_chunk_size 16 tokens, the last the whole context
        "llama4_text": [GQA_TOKEN * min(c, 16) * KV] * 3 + [gqa],
    }


def config_json(family: str) -> dict:
    """config.json as save_pretrained writes it for the family's tiny config."""
    return json.loads(families.config(family).to_json_string(use_diff=True))


@pytest.mark.parametrize("family", list(families.HYBRID))
@pytest.mark.parametrize("context", [2048, 32768])
def test_cache_bytes_match_a_hand_count(family, context):
    kv = cost.kv_layout_from_config(config_json(family))
    expect = hand(context)[family]
    assert [layer.bytes for layer in kv.layer_bytes(context)] == expect
    assert kv.bytes_per_sequence(context) == sum(expect)


@pytest.mark.parametrize("family", list(families.HYBRID))
def test_state_is_constant_in_context_and_kv_grows(family):
    kv = cost.kv_layout_from_config(config_json(family))
    short, long = kv.layer_bytes(2048), kv.layer_bytes(32768)
    assert [a.state_bytes for a in short] == [b.state_bytes for b in long]
    assert kv.state_bytes_per_sequence() == sum(a.state_bytes for a in short)
    for a, b in zip(short, long, strict=True):
        if a.kv_bytes and a.tokens_held == 2048:
            assert b.kv_bytes == 16 * a.kv_bytes  # 32k / 2k, uncapped
        elif a.kv_bytes:
            assert b.kv_bytes == a.kv_bytes and a.tokens_held == 16  # capped at the window or chunk


def test_gemma4_full_layers_use_their_own_head_dim():
    kv = cost.kv_layout_from_config(config_json("gemma4_text"))
    assert kv.layer_values == (128, 256, 128, 256)
    assert [layer.tokens_held for layer in kv.layer_bytes(32768)] == [16, 32768, 16, 32768]


def test_gemma4_kv_shared_layers_keep_no_cache_of_their_own():
    """Layers from num_hidden_layers − num_kv_shared_layers on read an earlier layer's cache (transformers' cache
    holds entries for the first two layers only)."""
    cfg = json.loads(families.config("gemma4_text", num_kv_shared_layers=2).to_json_string(use_diff=True))
    kv = cost.kv_layout_from_config(cfg)
    assert [layer.bytes for layer in kv.layer_bytes(2048)] == [GQA_TOKEN * 16 * KV, 2 * 2 * 64 * 2048 * KV, 0, 0]
    assert kv.kinds[2:] == ("shared_kv", "shared_kv")


def test_kv_shared_layers_that_leave_no_cache_are_refused():
    """num_kv_shared_layers 100 on 4 layers priced every layer's KV as 0 (a review)."""
    cfg = json.loads(families.config("gemma4_text", num_kv_shared_layers=2).to_json_string(use_diff=True))
    for shared in (4, 100):
        with pytest.raises(UsageError, match=f"num_kv_shared_layers is {shared}, but the model has 4 layers"):
            cost.kv_layout_from_config({**cfg, "num_kv_shared_layers": shared})


def test_falcon_h1_state_is_stated():
    kv = cost.kv_layout_from_config(config_json("falcon_h1"))
    d = kv.describe()
    assert d["state_layers"] == 4 and d["state_bytes_per_sequence"] == 4 * FALCON_MAMBA
    assert "float32" in d["state_dtype"]


def test_nemotron_h_ssm_cache_dtype_is_read():
    cfg = {**config_json("nemotron_h"), "mamba_ssm_cache_dtype": "bfloat16"}
    kv = cost.kv_layout_from_config(cfg)
    assert kv.layer_bytes(2048)[0].state_bytes == 4 * 32 * 16 * 2 + 4 * 192 * CONV


def test_hub_spellings_of_the_layer_list():
    """The forms hub checkpoints carry, as the config classes read them: Nemotron-H's hybrid_override_pattern,
    Kimi-Linear's linear_attn_config (1-based layer numbers), Granite 4's 'mamba'/'attention'."""
    nemotron = {k: v for k, v in config_json("nemotron_h").items() if k != "layers_block_type"}
    nemotron["hybrid_override_pattern"] = "M*-E"
    assert cost.kv_layout_from_config(nemotron).kinds == ("mamba2", "full_attention", "mlp", "moe")
    kimi = {k: v for k, v in config_json("kimi_linear").items() if k not in ("layer_types", "linear_num_heads")}
    kimi["linear_attn_config"] = {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "num_heads": 2}
    assert [layer.bytes for layer in cost.kv_layout_from_config(kimi).layer_bytes(2048)] == hand(2048)["kimi_linear"]
    granite = {**config_json("granitemoehybrid"), "layer_types": ["mamba", "attention", "mamba", "attention"]}
    assert [b.bytes for b in cost.kv_layout_from_config(granite).layer_bytes(2048)] == hand(2048)["granitemoehybrid"]


# --- `quantize cost --checkpoint` on tiny hybrid checkpoints --------------------------------------------------------


def tiny_checkpoint(family: str, path):
    """config.json (save_pretrained) and one safetensors file of zero bf16 tensors with the names and shapes of
    the family's model (built on the meta device: no weights computed)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    cfg = families.config(family)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    tensors = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in model.state_dict().items()}
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    cfg.save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["nemotron_h", "kimi_linear", "qwen3_5_text"])
def test_cli_prices_a_hybrid_checkpoint(family, tmp_path, capsys):
    """Nemotron-H saves no num_hidden_layers, Kimi-Linear spells its top-k num_experts_per_token: both valid."""
    ckpt = tiny_checkpoint(family, tmp_path / family)
    assert main(["cost", "--checkpoint", str(ckpt), "--context", "32768", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_sequence"] == sum(hand(32768)[family])
    assert out["state_bytes_per_sequence"] == sum(b for b in hand(0)[family])  # at 0 tokens only state is left
    assert [layer["bytes"] for layer in out["kv_bytes_per_layer"]] == hand(32768)[family]
    assert main(["cost", "--checkpoint", str(ckpt), "--context", "2048"]) == 0
    text = capsys.readouterr().out
    assert "state" in text and "float32" in text


def test_cli_moe_of_a_hybrid_is_routed(tmp_path, capsys):
    """Nemotron-H's one MoE block (layer 3, from layers_block_type) and Kimi-Linear's (mlp_layer_types: 1 to 3)."""
    out = {}
    for family in ("nemotron_h", "kimi_linear"):
        assert main(["cost", "--checkpoint", str(tiny_checkpoint(family, tmp_path / family)), "--json"]) == 0
        out[family] = json.loads(capsys.readouterr().out)["moe"]
    assert [(m["layer"], m["experts"], m["top_k"]) for m in out["nemotron_h"]["layers"]] == [(3, 4, 2)]
    assert [(m["layer"], m["experts"], m["top_k"]) for m in out["kimi_linear"]["layers"]] == [
        (i, 4, 2) for i in (1, 2, 3)
    ]


def test_cli_overrides_beside_checkpoint(tmp_path, capsys):
    """--kv-bytes prices the checkpoint's own KV at another element size (its state stays float32); --layers,
    --kv-heads and --head-dim together replace its cache; one of them alone is the user's error (exit 2)."""
    ckpt = tiny_checkpoint("qwen3_5_text", tmp_path / "q")
    assert main(["cost", "--checkpoint", str(ckpt), "--context", "2048", "--kv-bytes", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_sequence"] == 2 * GDN + 2 * GQA_TOKEN * 2048 * 1
    argv = ["cost", "--checkpoint", str(ckpt), "--context", "2048", "--layers", "3", "--kv-heads", "1"]
    assert main([*argv, "--head-dim", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_sequence"] == 3 * 2 * 1 * 8 * 2048 * 2
    assert main(argv) == 2
    assert "together" in capsys.readouterr().err
