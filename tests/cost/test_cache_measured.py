"""The decode cache of the attention kinds transformers keeps in a cache class of the family's own (issue #57),
priced by the cost model and measured on transformers 5.17's own tiny model (tests/families.py CACHE_KINDS):

- MiniMax (MiniMaxCache): full-attention layers' keys and values, and each lightning (linear) attention layer's
  running K^T V, num_attention_heads × head_dim × head_dim in the model's dtype;
- DeepSeek-V4 (DeepseekV4CSACache, DeepseekV4HCACache): each layer's sliding window (a compressed layer's one
  shared K=V head), its compressed entries (CSA: the indexer's keys too), the tokens awaiting their window (kv and
  gate projections) and CSA's overlap from the last closed window.

The measurement is every tensor the cache object holds after a prefill and one decode step of a bf16 model, each
counted once (numel × element_size; the cache's 0-dimensional bookkeeping, a window size kept as a tensor, is no
cached data): the cost model's bytes per sequence must equal it, layer by layer, at each context. The contexts stay
under the tiny sliding window (64), where transformers' window holds every token (past it, one fewer than the
window the cost model prices: docs/cost.md), and close compressed windows of both rates (4 and 8) with tokens left
pending.
"""

from __future__ import annotations

import json

import families
import pytest

from quantize.cli import main
from quantize.cost import bounds as cost
from quantize.errors import UsageError

CONTEXTS = (3, 13, 46)  # 3: no compressed window closed yet; 13 and 46: closed ones and tokens pending


def measured(family: str, context: int) -> list[int]:
    """The bytes transformers' own bf16 model of `family` keeps for one sequence, layer by layer, after a prefill of
    context − 1 tokens and one decode step (families.cache_bytes: every tensor its cache object holds)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = families.config(family)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(2, cfg.vocab_size, (1, context - 1)), use_cache=True).past_key_values
        step = torch.randint(2, cfg.vocab_size, (1, 1))
        cache = model(input_ids=step, past_key_values=cache, use_cache=True).past_key_values
    return families.cache_bytes(cache, cfg.num_hidden_layers)


def priced(family: str) -> cost.KVCache:
    return cost.kv_layout_from_config(json.loads(families.config(family).to_json_string(use_diff=True)))


@pytest.mark.parametrize("family", list(families.CACHE_KINDS))
@pytest.mark.parametrize("context", CONTEXTS)
def test_cost_prices_the_cache_transformers_keeps(family, context):
    kv = priced(family)
    kept = measured(family, context)
    assert [layer.bytes for layer in kv.layer_bytes(context)] == kept
    assert kv.bytes_per_sequence(context) == sum(kept)


def test_what_each_layer_keeps():
    minimax, v4 = priced("minimax").layer_bytes(46), priced("deepseek_v4").layer_bytes(46)
    assert [layer.attention for layer in minimax] == ["full_attention", "lightning_attention"] * 2
    assert [bool(layer.kv_bytes) for layer in minimax] == [True, False] * 2
    assert [layer.compressed_entries for layer in v4] == [0, 46 // 4, 46 // 8, 46 // 4]
    assert [layer.tokens_held for layer in v4] == [46] * 4


def test_the_lightning_state_is_constant_and_the_compressed_cache_grows():
    minimax, v4 = priced("minimax"), priced("deepseek_v4")
    assert [a.state_bytes for a in minimax.layer_bytes(13)] == [b.state_bytes for b in minimax.layer_bytes(46)]
    assert minimax.describe()["state_layers"] == 2 and "lightning" in minimax.describe()["state_dtype"]
    described = v4.describe()
    assert described["compressed_layers"] == 3 and described["windowed_layers"] == 1
    # past the window (64 tokens) a compressed layer still grows: an entry per 4 (CSA) or 8 (HCA) tokens
    far, farther = v4.layer_bytes(64 * 8), v4.layer_bytes(64 * 16)
    assert far[0].bytes == farther[0].bytes  # the sliding layer holds its window
    assert all(b.bytes > a.bytes for a, b in zip(far[1:], farther[1:], strict=True))


@pytest.mark.parametrize("family", list(families.CACHE_KINDS))
def test_cli_prices_the_checkpoint(family, tmp_path, capsys):
    """`quantize cost --checkpoint` on the saved tiny model: the figure measured, its MoE layers every layer
    (DeepSeek-V4's mlp_layer_types: hash_moe and moe both route to experts)."""
    path = families.build(family, tmp_path / family)
    assert main(["cost", "--checkpoint", str(path), "--context", "46", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_sequence"] == sum(measured(family, 46))
    assert [m["layer"] for m in out["moe"]["layers"]] == [0, 1, 2, 3]
    assert main(["cost", "--checkpoint", str(path), "--context", "46"]) == 0
    text = capsys.readouterr().out
    assert ("lightning" if family == "minimax" else "compressed attention in 3 of 4 layers") in text


def test_the_layer_and_mlp_types_are_deepseek_v4s():
    """The names the cost model reads are those transformers' DeepseekV4Config allows (a rename upstream fails here)."""
    from transformers.models.deepseek_v4 import configuration_deepseek_v4 as v4

    from quantize.checkpoint import architecture as arch

    assert set(arch.COMPRESSED_LAYERS) == set(v4.DEEPSEEK_V4_LAYER_TYPES) - {"sliding_attention"}
    assert set(v4.DEEPSEEK_V4_MLP_LAYER_TYPES) <= set(arch.MOE_MLP_LAYER_TYPES)


@pytest.mark.parametrize(
    "rates",
    [None, {"compressed_sparse_attention": 4}, {"compressed_sparse_attention": 4, "heavily_compressed_attention": 0}],
)
def test_a_compressed_layer_without_its_rate_is_refused_naming_it(rates):
    raw = json.loads(families.config("deepseek_v4").to_json_string(use_diff=True))
    with pytest.raises(
        UsageError, match="config.json.s compress_rates gives (compressed_sparse|heavily_compressed)_attention layers"
    ):
        cost.kv_layout_from_config({**raw, "compress_rates": rates})
