"""GGUF as a checkpoint kind (checkpoint/ggufs.py): the header read and checked, every byte of the file accounted
for by the gguf package's block arithmetic, `quantize inspect` and `quantize cost` on it, its identity from its
bytes, and every malformed, truncated or forged file refused with exit 2 in under a second."""

from __future__ import annotations

import json
import os
import re
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quant_shape_to_byte_shape, quantize

from quantize import api
from quantize.checkpoint import files, ggufs
from quantize.checkpoint.accounting import bits_report
from quantize.cli import main
from quantize.cost import bounds
from quantize.errors import UsageError
from quantize.io import sha256_bytes, sha256_file

from conftest import assert_priced_as_its_decoder

# (tensor name, ggml type, (rows, cols)): a llama block with its linears in every type the tests cover
T = GGMLQuantizationType
QUANTIZABLE = {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


def write_gguf(
    path: Path, tensors: list[tuple[str, T, tuple[int, int]]], arch: str = "llama", **meta: int | list[int]
) -> Path:
    """A GGUF written by the gguf package: each tensor quantized by gguf.quants where the package can, else zero
    bytes of its type's byte shape (the header, not the values, is under test). `meta`: {arch}.KEY integers, or
    arrays of them."""
    w = GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    rng = np.random.default_rng(0)
    for name, qtype, shape in tensors:
        if qtype in QUANTIZABLE:
            data = rng.standard_normal(shape).astype(np.float32)
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, np.zeros(quant_shape_to_byte_shape(shape, qtype), np.uint8), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama(path: Path, linear: T = T.Q4_0, layers: int = 2, hidden: int = 256) -> Path:
    tensors = [("token_embd.weight", T.Q8_0, (64, hidden)), ("output_norm.weight", T.F32, (1, hidden))]
    for i in range(layers):
        tensors += [(f"blk.{i}.attn_norm.weight", T.F32, (1, hidden))]
        tensors += [(f"blk.{i}.{n}.weight", linear, (hidden, hidden)) for n in ("attn_q", "attn_output", "ffn_up")]
        tensors += [(f"blk.{i}.{n}.weight", linear, (hidden // 4, hidden)) for n in ("attn_k", "attn_v")]
    tensors = [(n, t, s if s[0] > 1 else (s[1],)) for n, t, s in tensors]  # norms are 1-D
    return write_gguf(
        path,
        tensors,
        block_count=layers,
        embedding_length=hidden,
        **{"attention.head_count": 4, "attention.head_count_kv": 1},
    )


def accounted(r) -> int:
    return r.header_bytes_read + r.total_bytes + r.padding_bytes


# --- the real file ---------------------------------------------------------------------------------


def test_smollm2_gguf_every_byte_and_bit(smollm2):
    r = api.inspect(smollm2)
    assert r.format == "gguf MOSTLY_Q4_1"
    assert {k: v["tensors"] for k, v in r.ggml_types.items()} == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert r.file_bytes == smollm2.stat().st_size == accounted(r)  # exact to the byte
    # SmolLM2-135M by hand: 49,152 × 576 embedding (tied: no output tensor); 30 layers of q, o (576²), k, v
    # (576 × 192), gate, up, down (576 × 1,536) and two norms; the final norm
    layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    assert r.parameters == 49152 * 576 + 30 * layer + 576 == 134_515_008
    assert r.ggml_types["Q4_1"]["bits_per_weight"] == 5.0  # 20 bytes per 32 weights
    assert r.ggml_types["Q8_0"]["bits_per_weight"] == 8.5  # 34 bytes per 32
    assert r.quantized_linear_parameters == 30 * (layer - 2 * 576)
    assert r.quantized_linear_bits_per_weight == 5.0  # every linear is Q4_1
    assert r.bytes_by_role == {
        "payload": r.ggml_types["Q4_1"]["bytes"],
        "embedding": 49152 * 576 * 34 // 32,
        "norm": 61 * 576 * 4,
    }
    assert r.bits_per_weight == pytest.approx(8 * r.total_bytes / r.parameters)
    assert set(r.bytes_by_part) == {"attention", "mlp", "embedding", "norm"}


def test_smollm2_header_matches_the_gguf_reader(smollm2):
    """Our bounds-checked walk agrees with the gguf package's own reader on every tensor (the reader is the
    oracle; it is not used at run time: it parses every vocabulary entry into an array and loops over forged
    counts)."""
    h = ggufs.read_header(smollm2)
    mine = {t.name: t for t in h.tensors}
    reader = GGUFReader(smollm2)
    assert len(mine) == len(reader.tensors) == 272
    for t in reader.tensors:
        m = mine[t.name]
        assert (m.ggml_type, m.elements, m.nbytes, m.dims) == (
            t.tensor_type.name,
            t.n_elements,
            t.n_bytes,
            tuple(int(d) for d in t.shape),
        )
        assert h.data_start + m.offset == t.data_offset


def test_smollm2_cost_from_its_header(smollm2):
    """KV bytes by hand from SmolLM2's config: 30 layers, 3 KV heads of 64 (576 / 9 heads), K and V, 2 bytes."""
    work = bounds.Workload(context_tokens=2048)
    c = api.decode_cost(smollm2, workload=work)
    assert c.kv_bytes_per_sequence == 30 * 2 * 3 * 64 * 2 * 2048
    assert c.kv_layout["layers"] == 30 and c.kv_layout["values_per_token_per_layer"] == 2 * 3 * 64
    assert c.checkpoint.total_bytes == api.inspect(smollm2).total_bytes
    assert c.parameters == 134_515_008


def test_a_gguf_is_known_by_its_magic_not_its_name(smollm2, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.symlink_to(smollm2)
    assert bits_report(renamed).ggml_types.keys() == {"Q4_1", "Q8_0", "F32"}


# --- written files: every type ------------------------------------------------------------------------

KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]
IQ = [T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS]
ALL = [*sorted(QUANTIZABLE, key=lambda t: t.value), *KQUANTS, *IQ]


def test_written_gguf_of_every_type_is_accounted_to_the_byte(tmp_path):
    """One linear per type, rows of 256 (every block size divides it): bytes per the library's block layout,
    bits per weight type_size × 8 / block_size, and header + tensors + padding = the file."""
    tensors = [(f"blk.0.ffn_up.{t.name.lower()}.weight", t, (8, 256)) for t in ALL]
    path = write_gguf(tmp_path / "types.gguf", tensors)
    r = api.inspect(path)
    assert set(r.ggml_types) == {t.name for t in ALL}
    for t in ALL:
        block, size = GGML_QUANT_SIZES[t]
        got = r.ggml_types[t.name]
        assert got["bytes"] == 8 * 256 // block * size
        assert got["bits_per_weight"] == size * 8 / block
    assert accounted(r) == r.file_bytes == path.stat().st_size
    assert r.padding_bytes > 0  # some types' tensors are not multiples of the 32-byte alignment
    reader = {t.name: (t.n_bytes, t.data_offset) for t in GGUFReader(path).tensors}
    h = ggufs.read_header(path)
    assert {t.name: (t.nbytes, h.data_start + t.offset) for t in h.tensors} == reader


@pytest.mark.parametrize("linear", [T.Q4_0, T.Q8_0, T.Q4_K, T.IQ4_XS, T.F16])
def test_roles_from_the_library_tensor_names(tmp_path, linear):
    r = api.inspect(llama(tmp_path / "m.gguf", linear))
    block, size = GGML_QUANT_SIZES[linear]
    linear_params = 2 * (3 * 256 * 256 + 2 * 64 * 256)
    role = "payload" if block > 1 else "linear_kept"
    assert r.bytes_by_role[role] == linear_params // block * size
    assert r.bytes_by_role["embedding"] == 64 * 256 // 32 * 34 and r.bytes_by_role["norm"] == 3 * 256 * 4
    assert r.quantized_linear_parameters == (linear_params if block > 1 else 0)
    assert r.bytes_by_part["attention"]["parameters"] == 2 * (256 * 256 + 2 * 64 * 256 + 256 * 256)
    assert r.bytes_by_part["mlp"]["parameters"] == 2 * 256 * 256
    assert not r.notes


def test_a_bias_beside_a_quantized_weight_is_no_quantized_linear_byte(tmp_path):
    path = write_gguf(
        tmp_path / "m.gguf", [("blk.0.attn_q.weight", T.Q4_0, (64, 64)), ("blk.0.attn_q.bias", T.F32, (64,))]
    )
    r = api.inspect(path)
    assert r.quantized_linear_bytes == 64 * 64 // 32 * 18 and r.quantized_linear_parameters == 64 * 64
    assert r.bytes_by_role == {"payload": 64 * 64 // 32 * 18, "bias": 64 * 4}
    assert [(m.module, m.format, m.parameters) for m in r.modules] == [("blk.0.attn_q", "Q4_0", 64 * 64 + 64)]


def test_a_big_endian_gguf(tmp_path):
    """A GGUF written on a big-endian machine (its version reads 0 in its low half little-endian): every count
    byte-swapped, the same accounting."""
    path = tmp_path / "be.gguf"
    w = GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("llama.block_count", 3)
    w.add_tensor("blk.0.attn_q.weight", quantize(np.ones((4, 64), np.float32), T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    h = ggufs.read_header(path)
    assert h.metadata["llama.block_count"] == 3
    r = api.inspect(path)
    assert r.ggml_types["Q8_0"]["bytes"] == 4 * 64 // 32 * 34 and accounted(r) == path.stat().st_size


def test_a_tensor_the_library_does_not_name_is_other_and_noted(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", [("mystery.weight", T.F32, (4, 32))])
    r = api.inspect(path)
    assert r.bytes_by_role == {"other": 4 * 32 * 4}
    assert "mystery.weight" in r.notes[0]


def test_inspect_json_and_text(tmp_path, capsys):
    path = llama(tmp_path / "m.gguf")
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["header_bytes_read"] + data["total_bytes"] + data["padding_bytes"] == path.stat().st_size
    assert data["ggml_types"]["Q4_0"]["bits_per_weight"] == 4.5
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gguf" in out and "Q4_0" in out and f"= {path.stat().st_size:,} bytes (the file)" in out


def test_cost_of_a_written_gguf(tmp_path):
    """KV from the metadata: 2 layers, 1 KV head of 256 / 4 = 64 (key_length absent: embedding / heads)."""
    c = api.decode_cost(llama(tmp_path / "m.gguf"), workload=bounds.Workload(context_tokens=100))
    assert c.kv_bytes_per_sequence == 2 * 1 * (64 + 64) * 2 * 100
    assert "llama.attention.key_length absent" in c.kv_layout["values_formula"]


def windowed(path: Path, arch: str, layers: int = 12, **meta: int) -> Path:
    """Attention layers of 4 query heads and 1 KV head of 64, a sliding window of 512 declared; `meta` overrides."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256)), ("output_norm.weight", T.F32, (256,))]
    for i in range(layers):
        tensors += [(f"blk.{i}.attn_q.weight", T.Q8_0, (256, 256))]
        tensors += [(f"blk.{i}.attn_{n}.weight", T.Q8_0, (64, 256)) for n in ("k", "v")]
    heads = {"attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 64}
    heads |= {"attention.value_length": 64, "attention.sliding_window": 512, "feed_forward_length": 512}
    shape = {"block_count": layers, "embedding_length": 256, "context_length": 32768}
    return write_gguf(path, tensors, arch, **(shape | heads | meta))


@pytest.mark.parametrize("context", [2048, 32768])
def test_a_sliding_window_gguf_is_priced_layer_by_layer(tmp_path, context):
    """Gemma 3: transformers' config class of the family says which layers slide (5 of every 6); each holds at most
    its window of 512 tokens, the others the whole context, 2 × 1 × 64 values a token, 2 bytes each (F16)."""
    c = api.decode_cost(windowed(tmp_path / "g.gguf", "gemma3"), workload=bounds.Workload(context_tokens=context))
    assert c.kv_bytes_per_sequence == (10 * min(context, 512) + 2 * context) * 2 * 1 * 64 * 2
    assert c.kv_layout["windowed_layers"] == 10 and c.kv_layout["window"] == 512
    assert "gemma3.attention.sliding_window" in c.kv_layout["values_formula"]


def test_a_sliding_window_of_an_architecture_transformers_does_not_map_is_refused(tmp_path, capsys):
    path = windowed(tmp_path / "c.gguf", "cohere2", layers=2)
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cohere2.attention.sliding_window" in err and "maps no config for architecture 'cohere2'" in err


def per_layer(path: Path, arch: str = "openelm", **meta: int | list[int]) -> Path:
    """Three blocks whose KV heads vary by layer (1, 2, none), heads of 64: an architecture transformers' GGUF loader
    does not map (OpenELM's layout), so the header alone prices it."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256))]
    tensors += [(f"blk.{i}.attn_qkv.weight", T.Q8_0, (384, 256)) for i in range(3)]
    heads = {"attention.head_count": [4, 4, 4], "attention.head_count_kv": [1, 2, 0]}
    heads |= {"attention.key_length": 64, "attention.value_length": 64}
    return write_gguf(path, tensors, arch, block_count=3, embedding_length=256, **(heads | meta))


@pytest.mark.parametrize("context", [2048, 32768])
@pytest.mark.parametrize("arch", ["openelm", "deci", "llama"])
def test_kv_heads_per_layer_are_priced_from_the_header_whatever_the_family(tmp_path, context, arch):
    """Layer l keeps kv_heads[l] × (64 + 64) values a token, 2 bytes each (F16); the layer without KV heads none:
    llama.cpp's rule for every architecture (its load_hparams), whether transformers' GGUF loader maps the family
    (deci, llama: before, refused because that config kept the array unread) or not (openelm). llama.cpp's `llama`
    lays every layer's attention out as wide as layer 0's, so it allocates this cache and does not run the model."""
    c = api.decode_cost(per_layer(tmp_path / "o.gguf", arch), workload=bounds.Workload(context_tokens=context))
    assert c.kv_bytes_per_sequence == (1 + 2 + 0) * (64 + 64) * context * 2
    assert c.kv_layout["kv_layers"] == 2 and c.kv_layout["values_per_token_by_layer"] == [128, 256, 0]
    assert f"{arch}.attention.head_count_kv, per block" in c.kv_layout["values_formula"]


@pytest.mark.parametrize(
    "meta,says",
    [
        ({"ssm.state_size": 16, "ssm.conv_kernel": 4}, "openelm.ssm.conv_kernel, openelm.ssm.state_size"),
        ({"attention.head_count_kv": [1, 2]}, "is [1, 2], not one entry per block (openelm.block_count 3)"),
        ({"attention.key_length": 0}, "openelm.attention.key_length is 0; llama.cpp reads one head size"),
        ({"attention.value_length": [64] * 3}, "openelm.attention.value_length is [64, 64, 64]; llama.cpp reads one"),
        ({"attention.head_count": [0, 4, 4]}, "openelm.attention.head_count is [0, 4, 4], no head in layer 0"),
    ],
)
def test_kv_heads_per_layer_the_header_cannot_price_are_refused(tmp_path, capsys, meta, says):
    """A recurrent state beside the KV heads (llama.cpp's rule per family: not restated), an array that is not one
    entry per block, a head size of 0 or given per layer (llama.cpp refuses an array), or no query head in layer 0
    (llama.cpp then takes every head as 0 values wide): exit 2 naming it."""
    assert main(["cost", "--checkpoint", str(per_layer(tmp_path / "o.gguf", **meta))]) == 2
    err = capsys.readouterr().err
    assert says in err and ("--layers/--kv-heads/--head-dim" in err or "re-convert" in err), err


@pytest.mark.parametrize(
    "arch,meta,says",
    [
        # Gated DeltaNet in three layers of four: one head_count_kv number, as llama.cpp's qwen3next writes it
        ("qwen3next", {"attention.head_count_kv": 2, "full_attention_interval": 4, "ssm.state_size": 128}, None),
        # Kimi Delta Attention beside MLA: the latent keys describe only the attention layers
        (
            "kimi-linear",
            {"attention.head_count_kv": [0, 0, 0, 4], "attention.kv_lora_rank": 32, "kda.head_dim": 64},
            None,
        ),
        # a Mamba2 hybrid is priced from its header as llama.cpp lays it out (ggufs.mamba_layers): one without
        # the SSM sizes llama.cpp requires is refused naming the first it lacks
        (
            "falcon-h1",
            {"attention.head_count_kv": 2, "ssm.state_size": 16, "ssm.conv_kernel": 4},
            "ssm.inner_size is absent",
        ),
    ],
)
def test_a_gguf_with_a_recurrent_state_is_not_priced_as_attention_alone(tmp_path, capsys, arch, meta, says):
    """Hybrids whose header sizes a recurrent state: priced as plain attention (or MLA) in every layer, their state
    0, exit 0 (a review's repros); refused now where transformers maps no config for them, naming the state."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256))]
    tensors += [(f"blk.{i}.attn_q.weight", T.Q8_0, (256, 256)) for i in range(4)]
    meta = {"attention.head_count": 4, "attention.key_length": 64, "attention.value_length": 64} | meta
    meta |= {"rope.dimension_count": 16}
    path = write_gguf(tmp_path / "h.gguf", tensors, arch, block_count=4, embedding_length=256, **meta)
    assert main(["cost", "--checkpoint", str(path), "--context", "32768"]) == 2
    err = capsys.readouterr().err
    says = says and f"{arch}.{says}"
    assert (says or f"architecture {arch!r} keeps a fixed recurrent state ({arch}.") in err, err
    assert "--layers" in err or (says and "re-convert" in err), err


@pytest.mark.parametrize("context", [2048, 32768])
@pytest.mark.parametrize("indexer", [0, 8])
def test_a_latent_mla_gguf_is_priced_as_its_latent(tmp_path, context, indexer):
    """DeepSeek as llama.cpp's deepseek2: kv_lora_rank 32 + rope dimension_count 16 values a token (+ the indexer's
    keys of V3.2), in 4 blocks less 1 multi-token-prediction layer, 2 bytes each: as config.json's MLA is priced."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 64))]
    tensors += [(f"blk.{i}.attn_kv_a_mqa.weight", T.Q8_0, (48, 64)) for i in range(4)]
    meta = {"attention.head_count": 4, "attention.kv_lora_rank": 32, "rope.dimension_count": 16}
    meta |= {"nextn_predict_layers": 1} | ({"attention.indexer.key_length": indexer} if indexer else {})
    path = write_gguf(tmp_path / "d.gguf", tensors, "deepseek2", block_count=4, embedding_length=64, **meta)
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
    assert c.kv_bytes_per_sequence == 3 * (32 + 16 + indexer) * context * 2
    assert c.kv_layout["attention"] == ("MLA + indexer" if indexer else "MLA") and c.kv_layout["layers"] == 3
    assert "kv_lora_rank 32 + rope dimension_count 16" in c.kv_layout["values_formula"]


def test_a_latent_gguf_without_its_rope_count_is_refused(tmp_path, capsys):
    tensors = [("token_embd.weight", T.Q8_0, (64, 64))]
    path = write_gguf(tmp_path / "d.gguf", tensors, "deepseek2", block_count=2, **{"attention.kv_lora_rank": 32})
    assert main(["cost", "--checkpoint", str(path)]) == 2
    assert "deepseek2.rope.dimension_count" in capsys.readouterr().err


def moe(path: Path, experts: int = 4, declared: int = 4) -> Path:
    """Two layers with fused routed experts (ffn_*_exps: experts along the outermost ggml dimension) and a router."""
    tensors = []
    for i in range(2):
        tensors += [
            (f"blk.{i}.attn_q.weight", T.Q8_0, (64, 64)),
            (f"blk.{i}.ffn_gate_inp.weight", T.F32, (experts, 64)),
        ]
        tensors += [(f"blk.{i}.ffn_{n}_exps.weight", T.Q4_0, (experts, 32, 64)) for n in ("gate", "up", "down")]
    meta = {"attention.head_count": 2, "expert_count": declared, "expert_used_count": 2}
    return write_gguf(path, tensors, block_count=2, embedding_length=64, **meta)


def test_routed_experts_of_a_gguf(tmp_path):
    path = moe(tmp_path / "m.gguf")
    r = api.inspect(path)
    per_layer = 3 * 4 * 32 * 64
    assert [(e.layer, e.experts_stored, e.parameters) for e in r.expert_layers] == [
        (0, 4, per_layer),
        (1, 4, per_layer),
    ]
    assert r.bytes_by_part["routed_experts"]["bytes"] == 2 * per_layer // 32 * 18
    assert r.bytes_by_part["router"]["parameters"] == 2 * 4 * 64
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=10, batch=1))
    assert c.moe is not None and [(m.experts, m.top_k) for m in c.moe.layers] == [(4, 2), (4, 2)]
    assert c.active_parameters == r.parameters - 2 * per_layer + 2 * per_layer * 2 // 4


def test_a_gguf_whose_expert_count_disagrees_is_refused(tmp_path, capsys):
    assert main(["cost", "--checkpoint", str(moe(tmp_path / "m.gguf", declared=8))]) == 2
    assert "layer 0 stores 4 routed experts, llama.expert_count declares 8" in capsys.readouterr().err


def test_cost_refuses_a_gguf_without_tensors(tmp_path, capsys):
    assert main(["cost", "--checkpoint", str(write_gguf(tmp_path / "m.gguf", [], block_count=1))]) == 2
    assert "holds no tensors" in capsys.readouterr().err


def _blocks(path: Path, shape: str, blocks: int) -> Path:
    """A GGUF of `blocks` blocks (one block's tensors stored) read by each way cost prices a KV cache: plain
    attention (llama), a sliding window through transformers' config (gemma3), a latent cache (deepseek2)."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256)), ("blk.0.attn_q.weight", T.Q8_0, (256, 256))]
    meta = {"attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 64}
    meta |= {"attention.value_length": 64, "feed_forward_length": 512, "context_length": 4096}
    meta |= {"attention.sliding_window": 512} if shape == "gemma3" else {}
    meta |= {"attention.kv_lora_rank": 32, "rope.dimension_count": 16} if shape == "deepseek2" else {}
    return write_gguf(path, tensors, shape, block_count=blocks, embedding_length=256, **meta)


@pytest.mark.parametrize(
    "shape,blocks", [("llama", 0), ("llama", 513), ("llama", 2**32 - 1), ("gemma3", 513), ("deepseek2", 2**32 - 1)]
)
def test_a_block_count_llama_cpp_refuses_is_refused_before_the_cache_is_built(tmp_path, capsys, shape, blocks):
    """llama.cpp aborts on a model of no block or more than LLAMA_MAX_LAYERS (tests/compat checks the installed
    one): refused naming the key, before a layer is laid out (before: 2^32 - 1 blocks were a MemoryError, exit 3,
    a million 58 s and 1.3 GB, 513 priced), and before scoring hands the file to llama.cpp."""
    from quantize.evaluate.engine import gguf_to_score

    path = _blocks(tmp_path / "m.gguf", shape, blocks)
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{shape}.block_count is {blocks}; llama.cpp loads a model of 1 to {ggufs.LLAMA_MAX_LAYERS}" in err, err
    with pytest.raises(UsageError, match="LLAMA_MAX_LAYERS"):
        gguf_to_score(path)
    assert main(["cost", "--checkpoint", str(_blocks(tmp_path / "ok.gguf", shape, ggufs.LLAMA_MAX_LAYERS))]) == 0


def two_blocks(path: Path, arch: str, kv_heads: list[int]) -> Path:
    """Two blocks of 4 query heads and `kv_heads` (a per-layer array) KV heads."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256))]
    tensors += [(f"blk.{i}.attn_q.weight", T.Q8_0, (256, 256)) for i in range(2)]
    meta = {"attention.head_count": 4, "attention.head_count_kv": kv_heads}
    return write_gguf(path, tensors, arch, block_count=2, embedding_length=256, **meta)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "openelm"])
def test_a_per_layer_head_count_of_another_length_is_refused(tmp_path, capsys, arch):
    """head_count_kv [2] for 2 blocks: llama.cpp refuses a per-layer array of another length; before, transformers'
    reading (one item: its number) priced 2 heads in every layer, exit 0."""
    path = two_blocks(tmp_path / "o.gguf", arch, [2])
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{arch}.attention.head_count_kv is [2], not one entry per block ({arch}.block_count 2)" in err, err


def test_a_per_layer_head_count_transformers_keeps_unread_names_the_gguf_key(tmp_path, capsys):
    """head_count_kv per layer beside a sliding window (Gemma 3: which layers slide is its config class's to say):
    transformers' config keeps the list as num_key_value_heads, which the config's reading refuses; the message
    names the header's key, not a config.json (there is none)."""
    kv = [1, 2] * 6
    path = windowed(tmp_path / "g.gguf", "gemma3", **{"attention.head_count_kv": kv})
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"gemma3.attention.head_count_kv is {kv}, one entry per block" in err and "config.json" not in err, err
    assert "num_key_value_heads" in err and "--layers/--kv-heads/--head-dim" in err, err


@pytest.mark.parametrize(
    "nextn,says", [(5, "is 5, not a count of 0 to its 2 blocks"), (2, "is 2, not fewer than its 2 blocks")]
)
def test_a_latent_gguf_of_no_decode_layer_is_refused(tmp_path, capsys, nextn, says):
    """nextn_predict_layers 5 or 2 of 2 blocks: before, 5 was priced as 2 - 5 layers (`layers: 0`, no KV bytes),
    exit 0; more than the blocks is refused for every architecture (check_layers), as many by the latent cache."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 64))]
    meta = {"attention.kv_lora_rank": 32, "rope.dimension_count": 16}
    path = write_gguf(tmp_path / "d.gguf", tensors, "deepseek2", block_count=2, nextn_predict_layers=nextn, **meta)
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"deepseek2.nextn_predict_layers {says}" in err, err


@pytest.mark.parametrize("arch", ["llama", "glm4moe", "deepseek2"])
def test_more_nextn_blocks_than_blocks_are_refused_for_every_architecture(tmp_path, capsys, arch):
    """nextn_predict_layers 3 of 2 blocks, which llama.cpp aborts on whatever the architecture (its load_hparams:
    tests/compat/test_llama_cpp.py): exit 2 naming the key, and refused before scoring hands the file to llama.cpp.
    Before, llama and glm4moe were priced as 2 decode layers, exit 0 (mtp_blocks declared none), and deepseek2's
    message said only that no layer would decode."""
    from quantize.evaluate.engine import gguf_to_score

    tensors = [("token_embd.weight", T.Q8_0, (64, 64)), ("blk.0.attn_q.weight", T.Q8_0, (64, 64))]
    meta = {"attention.head_count": 4, "attention.head_count_kv": 1, "nextn_predict_layers": 3}
    meta |= {"attention.kv_lora_rank": 32, "rope.dimension_count": 16} if arch == "deepseek2" else {}
    path = write_gguf(tmp_path / "m.gguf", tensors, arch, block_count=2, embedding_length=64, **meta)
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{arch}.nextn_predict_layers is 3, not a count of 0 to its 2 blocks ({arch}.block_count)" in err, err
    assert "n_layer_nextn <= n_layer_all" in err, err
    with pytest.raises(UsageError, match="nextn_predict_layers"):
        gguf_to_score(path)


def test_a_head_size_of_0_is_named_not_called_missing(tmp_path, capsys):
    """head_count 128 over an embedding of 64, no key_length: llama.cpp's default head size is 64 // 128 = 0; before,
    the message said key_length "is missing"."""
    path = write_gguf(
        tmp_path / "m.gguf",
        [("token_embd.weight", T.Q8_0, (64, 64))],
        block_count=2,
        embedding_length=64,
        **{"attention.head_count": 128},
    )
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert "llama.embedding_length 64 / llama.attention.head_count 128, is 0" in err and "missing" not in err, err


def test_cost_refuses_a_gguf_without_its_shape(tmp_path, capsys):
    path = write_gguf(tmp_path / "m.gguf", [("blk.0.ffn_up.weight", T.Q4_0, (8, 256))])
    assert main(["cost", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert "llama.attention.head_count is missing" in err and "--params" in err


# --- the folder, identity ------------------------------------------------------------------------------


def test_a_folder_with_one_gguf_and_a_tokenizer(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    g = llama(folder / "m.gguf")
    (folder / "tokenizer.json").write_text("{}")
    assert ggufs.find(folder) == g
    r = api.inspect(folder)
    assert r.files == ["m.gguf"] and accounted(r) == g.stat().st_size
    expected = sha256_bytes(f"m.gguf {sha256_file(g)}\n".encode())
    assert ggufs.weights_sha256(folder) == ggufs.weights_sha256(g) == expected
    # a single .gguf path: the weights hash files.py already gives any single file
    assert files.weights_sha256(g) == expected


def test_a_gguf_folder_identity_is_its_bytes_and_tokenizer(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    g = llama(folder / "m.gguf")
    (folder / "tokenizer.json").write_text("{}")
    before = files.identity_sha256(folder)
    assert files.weights_sha256(folder) == ggufs.weights_sha256(folder)
    (folder / "tokenizer.json").write_text('{"a": 1}')
    after_tokenizer = files.identity_sha256(folder)
    assert after_tokenizer != before  # the tokenizer is in it
    with g.open("r+b") as f:  # one byte of the GGUF (its last padding byte)
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    assert files.identity_sha256(folder) != after_tokenizer


def test_two_ggufs_in_a_folder_are_refused_naming_them(tmp_path, capsys):
    llama(tmp_path / "a.gguf")
    llama(tmp_path / "b.gguf")
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "2 GGUF files (a.gguf, b.gguf)" in err and "Traceback" not in err


def test_a_folder_named_like_a_gguf_file_is_called_a_folder(tmp_path, capsys):
    """Before: "holds no .safetensors file ... quantize reads safetensors only" for `inspect x.gguf/`."""
    (folder := tmp_path / "x.gguf").mkdir()
    (folder / "tokenizer.json").write_text("{}")
    for argv in (["inspect", str(folder)], ["cost", "--checkpoint", str(folder)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{folder} is a folder named like a GGUF file" in err and "safetensors only" not in err, err
    g = llama(folder / "m.gguf")
    assert ggufs.find(folder) == g  # one inside: that one, as for any folder


def test_a_folder_with_safetensors_is_not_a_gguf(tmp_path):
    llama(tmp_path / "a.gguf")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert ggufs.find(tmp_path) is None


def test_a_gguf_linked_outside_its_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(ggufs.ALLOW_SYMLINKS, raising=False)
    outside = llama(tmp_path / "elsewhere.gguf")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "m.gguf").symlink_to(outside)
    with pytest.raises(UsageError, match="links outside the checkpoint folder"):
        api.inspect(folder)
    assert ggufs.ALLOW_SYMLINKS == files.ALLOW_SYMLINKS


# --- refusals: exit 2, under a second, no traceback -------------------------------------------------------


def _preamble(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _kv(key: bytes, vtype: int, value: bytes) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + value


def _info(name: bytes, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


def _aligned(header: bytes, data: bytes) -> bytes:
    return header + b"\0" * (-len(header) % 32) + data


ARR, STR, U8, U32 = 9, 8, 0, 4
FORGED = {
    "empty": (b"", "0 bytes long"),
    "not GGUF": (b"GGML" + b"\0" * 40, "not the magic"),
    "version 99": (_preamble(0, 0, 99) + b"\0" * 8, "version 99"),
    "tensor count 2^63": (_preamble(2**63, 0), "are not read"),
    "kv count 2^64-1": (_preamble(0, 2**64 - 1), "are not read"),
    "kv count past the file": (_preamble(0, 100) + b"\0" * 64, "more than its 88 bytes hold"),
    "string of 2^63 bytes": (_preamble(0, 1) + struct.pack("<Q", 2**63) + b"k" * 16, "runs past the end"),
    "array of 2^60 strings": (
        _preamble(0, 1) + _kv(b"k", ARR, struct.pack("<IQ", STR, 2**60)),
        "declares 1,152,921,504,606,846,976 items",
    ),
    "5M empty strings": (
        _preamble(0, 1) + _kv(b"k", ARR, struct.pack("<IQ", STR, 5 * 2**20)) + b"\0" * (8 * 5 * 2**20),
        "more than 4,194,304 are not read",
    ),
    # under MAX_WALKED: each array inside an array walked, ~20 s, before MAX_NESTED
    "4M empty arrays": (
        _preamble(0, 1)
        + _kv(b"k", ARR, struct.pack("<IQ", ARR, 2**22 - 10))
        + struct.pack("<IQ", U8, 0) * (2**22 - 10),
        "more than 1,024 are not read (llama.cpp reads no array of arrays)",
    ),
    "array of 2^62 bytes": (_preamble(0, 1) + _kv(b"k", ARR, struct.pack("<IQ", U8, 2**62)), "items"),
    "unknown value type": (_preamble(0, 1) + _kv(b"k", 77, b"\0" * 8), "value type 77"),
    "nested arrays": (
        _preamble(0, 1) + _string(b"k") + struct.pack("<I", ARR) + struct.pack("<IQ", ARR, 1) * 20 + b"\0" * 64,
        "nests arrays",
    ),
    "key not UTF-8": (_preamble(0, 1) + _kv(b"\xff\xfe", U32, b"\0" * 4), "not UTF-8"),
    "duplicate key": (_preamble(0, 2) + _kv(b"k", U32, b"\0" * 4) * 2, "appears twice"),
    "alignment 3": (_preamble(0, 1) + _kv(b"general.alignment", U32, struct.pack("<I", 3)), "power of two"),
    "1000 dimensions": (_preamble(1, 0) + _string(b"t") + struct.pack("<I", 1000) + b"\0" * 64, "1000 dimensions"),
    "unknown ggml type": (  # newer than the gguf package (llama.cpp's Q2_0, 42, in gguf 0.19.0), not damaged
        _aligned(_preamble(1, 0) + _info(b"t", (32,), 4242, 0), b"\0" * 128),
        "newer than this gguf package reads",
    ),
    "row not whole blocks": (
        _aligned(_preamble(1, 0) + _info(b"t", (33,), T.Q4_0.value, 0), b"\0" * 64),
        "not a multiple of the 32-element block",
    ),
    "misplaced offset": (_aligned(_preamble(1, 0) + _info(b"t", (8,), T.F32.value, 32), b"\0" * 96), "starts at"),
    "tensor past the end": (_aligned(_preamble(1, 0) + _info(b"t", (2**40,), T.F32.value, 0), b"\0" * 32), "past"),
    "dims product 2^256": (
        _aligned(_preamble(1, 0) + _info(b"t", (2**64 - 1,) * 4, T.F32.value, 0), b"\0" * 32),
        "runs past the end",
    ),
    "bytes after the data": (_aligned(_preamble(1, 0) + _info(b"t", (8,), T.F32.value, 0), b"\0" * 96), "follow"),
    "duplicate tensor": (
        _aligned(_preamble(2, 0) + _info(b"t", (8,), T.F32.value, 0) + _info(b"t", (8,), T.F32.value, 32), b"\0" * 64),
        "appears twice",
    ),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_malformed_gguf_is_exit_2_in_under_a_second(tmp_path, capsys, case):
    raw, says = FORGED[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    start = time.perf_counter()
    assert main(["inspect", str(path)]) == 2
    assert time.perf_counter() - start < 1.0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "failed:" not in err
    assert str(path) in err and says in err, err


def _sparse_arrays(path: Path, keys: int, length: int, declared: int | None = None) -> Path:
    """A header of `keys` metadata arrays of `length` UINT8 zeros each, the zeros left as holes of a sparse file
    (nothing written, nothing on disk); `declared`: the metadata count the preamble gives (more: the rest missing)."""
    with path.open("wb") as f:
        f.write(_preamble(0, keys if declared is None else declared))
        for i in range(keys):
            f.write(_string(f"k{i}".encode()) + struct.pack("<IIQ", ARR, U8, length))
            f.seek(length, os.SEEK_CUR)
        f.truncate()
    return path


def test_numeric_arrays_longer_than_a_per_layer_one_are_not_kept(tmp_path):
    """Before, every numeric array of up to 65,536 items was kept as a Python list: a review's header of 2,048 such
    keys took 1.24 GB, 16,384 of them a MemoryError (exit 3). Now one longer than llama.cpp's per-layer arrays is
    skipped (its type and length kept): 64 arrays of 65,536 allocate nothing near their 32 MB of lists."""
    import tracemalloc

    path = _sparse_arrays(tmp_path / "long.gguf", 64, 1 << 16)
    tracemalloc.start()
    try:
        h = ggufs._read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # kept: 64 lists of 65,536 pointers, 32 MB
    assert h.metadata["k63"] is None and h.arrays["k63"] == ("UINT8", 1 << 16)
    per_layer = ggufs._read_header(_sparse_arrays(tmp_path / "short.gguf", 1, ggufs.MAX_KEPT_ARRAY))
    assert per_layer.metadata["k0"] == [0] * ggufs.MAX_KEPT_ARRAY  # a per-layer array of the most layers: kept


def test_kept_arrays_past_their_total_are_refused_where_they_pass_it(tmp_path, capsys):
    """Arrays short enough to keep, more of them than MAX_KEPT items in all: refused at the array that passes it,
    before the reader goes on (the header declares one entry more than it holds; before, it kept every list and
    then stopped on the truncation)."""
    keys = ggufs.MAX_KEPT // ggufs.MAX_KEPT_ARRAY + 1
    path = _sparse_arrays(tmp_path / "kept.gguf", keys, ggufs.MAX_KEPT_ARRAY, declared=keys + 1)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"metadata 'k{keys - 1}' brings its numeric arrays" in err and f"more than {ggufs.MAX_KEPT:,}" in err, err


def test_arrays_inside_arrays_past_their_cap_are_refused_before_the_walk(tmp_path, capsys):
    """One more array inside arrays than MAX_NESTED, then a truncated tensor info: refused for the count, not
    walked to the truncation."""
    n = ggufs.MAX_NESTED + 1
    raw = _preamble(1, 1) + _kv(b"k", ARR, struct.pack("<IQ", ARR, n)) + struct.pack("<IQ", U8, 0) * n
    path = tmp_path / "nested.gguf"
    path.write_bytes(raw + _string(b"t") + struct.pack("<I", 1))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"arrays inside arrays to {n:,}; more than {ggufs.MAX_NESTED:,}" in err, err


def test_every_truncation_of_a_written_gguf_is_exit_2(tmp_path, capsys):
    whole = llama(tmp_path / "m.gguf").read_bytes()
    for cut in sorted({*range(0, 200, 7), *range(200, len(whole), max(1, len(whole) // 60)), len(whole) - 1}):
        path = tmp_path / "cut.gguf"
        path.write_bytes(whole[:cut])
        start = time.perf_counter()
        assert main(["inspect", str(path)]) == 2, cut
        assert time.perf_counter() - start < 1.0
        err = capsys.readouterr().err
        assert "not a valid GGUF file" in err and "Traceback" not in err, (cut, err)


def _typed(path: Path, kind: str | None, arch: str = "llama") -> Path:
    """A GGUF of `general.type` `kind` (None: the key absent) with one tensor."""
    w = GGUFWriter(str(path), arch)
    if kind is not None:
        w.add_type(kind)
    w.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32), raw_dtype=T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("kind", "arch", "says"),
    [
        (gguf.GGUFType.ADAPTER, "llama", "a LoRA adapter"),
        (gguf.GGUFType.MMPROJ, "llama", "a multimodal projector"),
        (None, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ], "a multimodal projector"),
        (gguf.GGUFType.IMATRIX, "llama", "an importance matrix"),
        ("tokenizer", "llama", "Pass a model's GGUF"),
    ],
)
def test_a_gguf_that_is_no_model_is_refused_by_what_takes_a_model(tmp_path, capsys, kind, arch, says):
    """An adapter, a projector or an importance matrix is a GGUF file too: `eval` (before llama.cpp or anything
    else loads it), `cost` and a gguf recipe's source refuse it saying what it is and what to pass; `inspect` reads
    it. Before: llama.cpp's load stopped on it and the refusal blamed its vocabulary, with a traceback's lines."""
    from quantize.convert.gguf import source_gguf
    from quantize.evaluate.engine import gguf_to_score

    g = _typed(tmp_path / "x.gguf", kind, arch)
    for call in (lambda: gguf_to_score(g), lambda: source_gguf(str(g)), lambda: bounds.measured_checkpoint(g)):
        with pytest.raises(UsageError, match=says):
            call()
    assert main(["cost", "--checkpoint", str(g)]) == 2
    assert says in capsys.readouterr().err
    assert main(["inspect", str(g)]) == 0
    for model in (gguf.GGUFType.MODEL, None):  # what llama.cpp's converter writes, and a file without the key
        assert ggufs.check_model(ggufs.read_header(_typed(tmp_path / f"{model}.gguf", model))).tensors


def test_a_fifo_named_gguf_is_refused_unread(tmp_path, capsys):
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    start = time.perf_counter()
    assert main(["inspect", str(fifo)]) == 2
    assert main(["inspect", str(tmp_path)]) == 2  # the folder's one GGUF is the FIFO
    assert time.perf_counter() - start < 1.0
    err = capsys.readouterr().err
    assert err.count("is not a regular file") == 2


def test_the_gguf_package_constants_this_relies_on():
    """The names read from the library: a renamed key or a changed block layout fails here first."""
    assert gguf.Keys.LLM.BLOCK_COUNT == "{arch}.block_count"
    assert GGML_QUANT_SIZES[T.Q4_K] == (256, 144)
    assert int.from_bytes(ggufs.MAGIC, "little") == gguf.GGUF_MAGIC


def test_a_gguf_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    """A scoring run asks for a GGUF's identity several times: it is read once, and again once the file changes
    (a rewrite in place moves its ctime whatever else is put back)."""
    g = llama(tmp_path / "m.gguf")
    reads = []
    real = ggufs.sha256_user_file
    monkeypatch.setattr(ggufs, "sha256_user_file", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    first = ggufs.weights_sha256(g)
    assert ggufs.weights_sha256(g) == first == files.weights_sha256(g) and len(reads) == 1
    st = g.stat()
    with g.open("r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x02")
    os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back: the ctime still moves
    assert ggufs.weights_sha256(g) != first and len(reads) == 2


def test_a_gguf_header_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    """The engine's choice, the token check and the provenance each read the header: it is parsed once, again once
    the file is rewritten in place, and a refusal is never kept (a file mended in place reads)."""
    g = llama(tmp_path / "m.gguf")
    parses = []
    real = ggufs._parse
    monkeypatch.setattr(ggufs, "_parse", lambda *a, **k: parses.append(a[1]) or real(*a, **k))
    first = ggufs.read_header(g)
    assert ggufs.read_header(g) is first and ggufs.read_header(str(g)).tensors == first.tensors
    assert len(parses) <= 2  # the Path and the str spelling may each be parsed once, never again
    n = len(parses)
    good = g.read_bytes()
    g.write_bytes(b"GGUF" + b"\xff" * 20)  # forged in place
    with pytest.raises(UsageError):
        ggufs.read_header(g)
    g.write_bytes(good)
    again = ggufs.read_header(g)
    assert again is not first and again.tensors == first.tensors and len(parses) == n + 2


def test_the_vocabulary_probe_reaches_every_byte_utf8_text_can_hold():
    """checkpoint/llama_vocab.PROBE: 0x01-0x7F, every continuation byte 0x80-0xBF and every lead byte 0xC2-0xF4 (what
    a str's UTF-8 encoding can hold but NUL), so no suite or calibration text reaches a byte the probe did not."""
    from quantize.checkpoint.llama_vocab import PROBE

    assert set(PROBE.encode("utf-8")) == set(range(1, 0xC0)) | set(range(0xC2, 0xF5))


@pytest.mark.parametrize("output", [True, False], ids=["own-output", "tied"])
def test_a_ggufs_token_table_is_looked_up_where_an_output_layer_is_stored(tmp_path, output):
    """token_embd beside output.weight: a decode step reads one of its rows per token; with no output layer stored
    llama.cpp multiplies by token_embd itself every step, so the whole table is read (cost bounds, a review)."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256)), ("blk.0.attn_q.weight", T.Q8_0, (256, 256))]
    tensors += [("output.weight", T.Q8_0, (64, 256))] if output else []
    path = write_gguf(tmp_path / "e.gguf", tensors, block_count=1, embedding_length=256)
    r = bits_report(path)
    table = next(m.bytes for m in r.modules if m.module == "token_embd")
    assert r.gathered == ({"token_embd.weight": (table, 64)} if output else {})
    w = bounds.Weights(r.total_bytes, (), tuple(r.gathered.values()))
    assert w.read_bytes(1) == pytest.approx(r.total_bytes - (table - table / 64 if output else 0))


# --- multi-token-prediction blocks -------------------------------------------------------------------


def nextn_gguf(path: Path, arch: str, mtp: int) -> Path:
    """Two MoE decoder blocks, then `mtp` multi-token-prediction blocks as llama.cpp's converter keeps DeepSeek-V3's
    and GLM-4.5's (the last `{arch}.nextn_predict_layers` of `{arch}.block_count`: a decoder block's tensors and the
    nextn.* ones, gguf's NEXTN_* names); mtp 0 is the same GGUF without them. deepseek2 with a latent cache (which
    leaves the MTP blocks out: ggufs.latent_shape), glm4moe with one KV head count."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 64)), ("output.weight", T.Q8_0, (64, 64))]
    for i in range(2 + mtp):
        tensors += [(f"blk.{i}.attn_norm.weight", T.F32, (64,))]
        tensors += [(f"blk.{i}.attn_q.weight", T.Q8_0, (64, 64)), (f"blk.{i}.attn_kv_a_mqa.weight", T.Q8_0, (48, 64))]
        tensors += [(f"blk.{i}.ffn_gate_inp.weight", T.F32, (4, 64))]
        tensors += [(f"blk.{i}.ffn_{n}_exps.weight", T.Q4_0, (4, 32, 64)) for n in ("gate", "up", "down")]
        if i >= 2:
            tensors += [(f"blk.{i}.nextn.{n}.weight", T.F32, (64,)) for n in ("enorm", "hnorm", "shared_head_norm")]
            tensors += [(f"blk.{i}.nextn.eh_proj.weight", T.Q8_0, (64, 128))]
            tensors += [(f"blk.{i}.nextn.{n}.weight", T.Q8_0, (64, 64)) for n in ("embed_tokens", "shared_head_head")]
    meta = {"attention.head_count": 4, "attention.head_count_kv": 1, "expert_count": 4, "expert_used_count": 2}
    meta |= {"attention.kv_lora_rank": 32, "rope.dimension_count": 16} if arch == "deepseek2" else {}
    meta |= {"nextn_predict_layers": mtp} if mtp else {}
    return write_gguf(path, tensors, arch, block_count=2 + mtp, embedding_length=64, **meta)


@pytest.mark.parametrize("arch", ["deepseek2", "glm4moe"])
def test_a_ggufs_nextn_blocks_are_part_mtp_and_no_expert_layer(tmp_path, arch, capsys):
    """Every tensor of the MTP block (its experts, its nextn.* head and embedding) is part `mtp`, by hand from the
    gguf package's reader; every other part, the expert layers and the looked-up tables are the decoder's. The old
    code listed block 2 in expert_layers and its tensors among attention, router, routed experts and other."""
    decoder, mtp = nextn_gguf(tmp_path / "d.gguf", arch, 0), nextn_gguf(tmp_path / "m.gguf", arch, 1)
    d, m = api.inspect(decoder), api.inspect(mtp)
    block = [t for t in GGUFReader(mtp).tensors if t.name.startswith("blk.2.")]
    assert m.bytes_by_part["mtp"]["bytes"] == sum(int(t.n_bytes) for t in block)
    assert m.bytes_by_part["mtp"]["parameters"] == sum(int(t.n_elements) for t in block)
    assert {p: r for p, r in m.bytes_by_part.items() if p != "mtp"} == d.bytes_by_part
    assert m.expert_layers == d.expert_layers and [e.layer for e in m.expert_layers] == [0, 1]
    assert m.gathered == d.gathered and m.total_bytes == d.total_bytes + m.bytes_by_part["mtp"]["bytes"]
    assert main(["inspect", str(mtp), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [e["layer"] for e in shown["expert_layers"]] == [0, 1] and "mtp" in shown["bytes_by_part"]
    assert any(n.startswith(f"block 2: multi-token-prediction (MTP), as the header declares ({arch}.") for n in m.notes)


@pytest.mark.parametrize("arch", ["deepseek2", "glm4moe"])
def test_the_decode_cost_of_a_gguf_leaves_its_nextn_blocks_out_and_says_so(tmp_path, capsys, arch):
    """`quantize cost --checkpoint X.gguf` prices the GGUF with an MTP block as the same GGUF without it
    (parameters, active parameters, every format's bounds, the MoE layers, the KV cache: deepseek2's latent, glm4moe's
    one KV head count), and names what it left out. The old code priced block 2 as a third MoE layer (its experts
    k/E of them, the rest dense), and then glm4moe's block 2 as a third layer of KV cache (issue #58)."""
    decoder, mtp = nextn_gguf(tmp_path / "d.gguf", arch, 0), nextn_gguf(tmp_path / "m.gguf", arch, 1)
    assert_priced_as_its_decoder(decoder, mtp, 2, capsys)


LLAMA_KV = re.compile(
    r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([0-9.]+) MiB, "
    r"V \(f16\): +([0-9.]+) MiB"
)


def llama_cpp_kv(path: Path, context: int, flash_attn: bool = False) -> tuple[int, int, int, int, int]:
    """The KV cache llama.cpp allocates for `path` at `context` tokens, from its log: bytes (its MiB, printed to 2
    decimals: the tests choose sizes it prints exactly), cells, layers, K bytes, V bytes."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make gguf-env`")
    from quantize.quiet import llama_log

    with llama_log() as log:
        llama_cpp.Llama(str(path), n_ctx=context, n_threads=1, verbose=True, flash_attn=flash_attn).close()
        said = LLAMA_KV.findall(log.read_text())
    assert len(said) == 1, said
    mib, cells, layers, k, v = said[0]
    return round(float(mib) * 2**20), int(cells), int(layers), round(float(k) * 2**20), round(float(v) * 2**20)


@pytest.mark.parametrize("arch,stored", [("glm4moe", True), ("llama", False)], ids=["glm4moe", "llama-trunk"])
def test_a_ggufs_kv_cache_is_the_one_llama_cpp_allocates_without_its_nextn_blocks(tmp_path, arch, stored):
    """The KV cache cost prices for a GGUF of 2 decoder blocks and 1 multi-token-prediction block is the one
    llama.cpp itself allocates for a 2048-token context, layer count and bytes (its log: 2 layers of 2 KV heads ×
    (16 + 16) values a token at F16, 0.25 MiB each): GLM-4.5's form (the block stored), and a `llama` GGUF declaring
    the block without storing it (llama.cpp reads nextn_predict_layers for every architecture). The old code priced
    3 layers, 0.75 MiB."""
    from gguf_models import loadable_gguf

    path = loadable_gguf(tmp_path / "m.gguf", arch, mtp=1, stored=stored)
    context = 2048
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
    nbytes, cells, layers, _, _ = llama_cpp_kv(path, context)
    assert (cells, layers) == (context, c.kv_layout["kv_layers"]) == (context, 2)
    assert nbytes == c.kv_bytes_per_sequence


@pytest.mark.parametrize(
    "arch,heads,kv_heads",
    [
        # Nemotron-NAS: GQA of 2 and of 1 KV head, a linear-attention layer (no KV head) and one of no attention
        ("deci", [4, 4, 4, 0], [2, 0, 1, 0]),
        # query heads per layer and no head_count_kv: each layer's KV heads are its query heads
        ("deci", [4, 2, 0], None),
        # a plain llama GGUF with its KV heads given per layer (llama.cpp's llama takes them all as wide as layer 0's)
        ("llama", 4, [2, 2]),
    ],
    ids=["deci-kv-per-layer", "deci-heads-per-layer", "llama-kv-array"],
)
def test_a_ggufs_per_layer_heads_are_the_kv_cache_llama_cpp_allocates(tmp_path, arch, heads, kv_heads):
    """Heads given per layer (`{arch}.attention.head_count` / `head_count_kv` arrays) are priced as llama.cpp
    allocates them, layer l kv_heads[l] × (16 + 16) values a token at F16, 8192 tokens (0.25 MiB of K per KV head,
    sizes its log prints exactly): with flash attention, the bytes, K and V, and the layers (a layer of no KV head
    is one, of 0 bytes); without it, the same K and at least the bytes priced (llama.cpp then pads every layer's V
    to the widest layer's: the cost is the lower bound). Before, every one was refused (exit 2): transformers'
    config of deci and llama kept the array unread, and a head_count array was no positive whole number."""
    from gguf_models import loadable_gguf

    layers = len(heads if isinstance(heads, list) else kv_heads)
    path = loadable_gguf(tmp_path / "m.gguf", arch, layers=layers, heads=heads, kv_heads=kv_heads)
    context = 8192
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
    kv = kv_heads or heads
    assert c.kv_bytes_per_sequence == sum(kv) * (16 + 16) * context * 2
    nbytes, cells, n, k, v = llama_cpp_kv(path, context, flash_attn=True)
    assert (nbytes, k, v) == (c.kv_bytes_per_sequence, c.kv_bytes_per_sequence // 2, c.kv_bytes_per_sequence // 2)
    assert (cells, n) == (context, c.kv_layout["layers"]) == (context, layers)
    nbytes, _, _, k, v = llama_cpp_kv(path, context, flash_attn=False)
    assert k == c.kv_bytes_per_sequence // 2 and nbytes >= c.kv_bytes_per_sequence
    assert v == layers * max(kv) * 16 * context * 2


@pytest.mark.parametrize(
    "heads,kv_heads,meta,says",
    [
        ([0, 4], [0, 2], {}, "deci.attention.head_count is [0, 4], no head in layer 0"),
        (4, [2, 1], {"attention.key_length": [16, 16]}, "deci.attention.key_length is [16, 16]; llama.cpp reads one"),
    ],
    ids=["no-head-in-layer-0", "key-length-per-layer"],
)
def test_per_layer_heads_llama_cpp_does_not_load_are_refused(tmp_path, capsys, heads, kv_heads, meta, says):
    """Where llama.cpp refuses the file (no query head in layer 0: it takes every head as 0 values wide and refuses
    layer 1's attention weights; a head size given per layer: an array where it reads one number), cost refuses it
    too, exit 2 naming the key."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make gguf-env`")
    from gguf_models import loadable_gguf

    path = loadable_gguf(tmp_path / "m.gguf", "deci", heads=heads, kv_heads=kv_heads, **meta)
    with pytest.raises(ValueError, match="Failed to load model"):
        llama_cpp.Llama(str(path), n_ctx=256, n_threads=1, verbose=False)
    assert main(["cost", "--checkpoint", str(path)]) == 2
    assert says in capsys.readouterr().err


def test_the_reports_decode_bounds_leave_a_ggufs_nextn_blocks_out(tmp_path):
    """`quantize report`'s decode column prices the GGUF with an MTP block as the same GGUF without it, as
    `quantize cost` does (the old code read the MTP block's bytes every step)."""
    from quantize.report.collect import Entry, decode_bounds

    out = []
    for path in (nextn_gguf(tmp_path / "d.gguf", "deepseek2", 0), nextn_gguf(tmp_path / "m.gguf", "deepseek2", 1)):
        r = api.inspect(path)
        entry = Entry(str(path), "x", "-", "-", r.total_bytes, r.parameters, 16.0, None, r.bytes_by_role, "0" * 64)
        out.append(decode_bounds(entry, None, bounds.HARDWARE["seed"], batch=4, context=100))
    assert out[0].batch1_ms is not None and out[0] == out[1]


# --- what the tensors store -----------------------------------------------------------------------


def _forged(src: Path, dst: Path, name: str, change) -> Path:
    """A copy of `src` at `dst` with `change` applied to tensor `name`'s data (the gguf package's reader, in place)."""
    dst.write_bytes(src.read_bytes())
    r = GGUFReader(dst, "r+")
    change(next(t for t in r.tensors if t.name == name))
    r.data.flush()
    del r
    return dst


def _nan_scale(t) -> None:
    """The first block of the tensor's last row given a NaN f16 scale: ggml's K-quant and Q8_0 blocks start with it
    (block_q4_K's d, block_q8_0's d); the test checks with the gguf package's own dequantization that it is one."""
    t.data[-1, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    assert np.isnan(gguf.quants.dequantize(np.array(t.data[-1:]), t.tensor_type)).any()
    assert np.isfinite(gguf.quants.dequantize(np.array(t.data[:-1]), t.tensor_type)).all()


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("output_norm.weight", lambda t: t.data.__setitem__(5, np.nan)),  # F32
        ("blk.1.attn_k.weight", lambda t: t.data.__setitem__((0, 3), np.inf)),  # F16
        ("blk.0.attn_q.weight", _nan_scale),  # Q4_K: a block's scale, not an element
        ("token_embd.weight", _nan_scale),  # Q8_0: a row no text may ever read
        ("rope_freqs.weight", lambda t: t.data.__setitem__((0, 7), np.nan)),  # F64: gguf does not dequantize it (r5)
    ],
)
def test_a_tensor_storing_nan_or_infinity_is_named(tmp_path, isolated_cache, name, change):
    """ggufs.non_finite_tensors dequantizes every tensor with the gguf package (a Q4_K block whose scale is NaN is
    found as an F32 NaN is), names only the tensors that store a non-finite value, and keeps a file's result in the
    identity memo, scanned again once the file is written."""
    tensors = [("token_embd.weight", T.Q8_0, (64, 256)), ("output_norm.weight", T.F32, (256,))]
    tensors += [(f"blk.{i}.attn_q.weight", T.Q4_K, (256, 256)) for i in range(2)]
    tensors += [(f"blk.{i}.attn_k.weight", T.F16, (64, 256)) for i in range(2)]
    tensors += [("rope_freqs.weight", T.F64, (1, 32))]
    clean = write_gguf(tmp_path / "clean.gguf", tensors)
    (tmp_path / "bad").mkdir()
    bad = _forged(clean, tmp_path / "bad" / "m.gguf", name, change)
    assert ggufs.non_finite_tensors(clean) == []
    assert ggufs.non_finite_tensors(tmp_path / "bad") == [name]  # a folder holding it, as a checkpoint is named
    assert len(list((isolated_cache / "identity").glob("gguf-finite-*.json"))) == 2
    ggufs._kept_scan.cache_clear()
    assert ggufs.non_finite_tensors(bad) == [name]  # from the memo on disk
    _forged(clean, bad, name, lambda t: None)  # written again: clean bytes, a new ctime
    assert ggufs.non_finite_tensors(bad) == []


def test_the_scan_reads_a_chunk_of_rows_at_a_time(tmp_path, isolated_cache, monkeypatch):
    """A NaN in the last chunk of a tensor read in many chunks is found; memory does not grow with the tensor."""
    monkeypatch.setattr(ggufs, "SCAN_ELEMENTS", 256 * 3)  # 3 rows a chunk: 22 chunks of the 64-row embedding
    clean = write_gguf(tmp_path / "clean.gguf", [("token_embd.weight", T.Q8_0, (64, 256))])
    bad = _forged(clean, tmp_path / "bad.gguf", "token_embd.weight", _nan_scale)
    assert ggufs.non_finite_tensors(clean) == [] and ggufs.non_finite_tensors(bad) == ["token_embd.weight"]


def test_a_large_files_scan_is_a_progress_stage_counting_its_tensors(tmp_path, isolated_cache, monkeypatch):
    """A GGUF of at least SCAN_SHOWN_BYTES is scanned as a progress stage (minutes on an 8B file: nothing was shown
    before), its end line counting every tensor; a smaller one shows nothing."""
    import io

    from quantize import progress

    tensors = [("token_embd.weight", T.Q8_0, (64, 256)), ("output_norm.weight", T.F32, (256,))]
    path = write_gguf(tmp_path / "m.gguf", tensors)
    out = io.StringIO()
    with progress.shown(True, out, tty=False):
        assert ggufs.non_finite_tensors(path) == []
    assert out.getvalue() == ""
    monkeypatch.setattr(ggufs, "SCAN_SHOWN_BYTES", path.stat().st_size)
    path.write_bytes(path.read_bytes())  # written again: scanned again
    with progress.shown(True, out, tty=False):
        assert ggufs.non_finite_tensors(path) == []
    lines = out.getvalue().splitlines()
    assert lines[0] == "quantize: NaN scan of m.gguf (2 tensors) ..."
    assert re.match(r"quantize: NaN scan of m\.gguf: done, 2 tensors, ", lines[-1]), lines
