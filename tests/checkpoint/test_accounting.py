"""Bits accounting from safetensors headers: closed forms on synthetic checkpoints, every format,
and the header parser's refusal of malformed files (including a fuzz test)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from quantize.checkpoint.accounting import _weight_args, bits_report, module_bits
from quantize.checkpoint.headers import read_header
from quantize.cli import main
from quantize.errors import UsageError

from conftest import DATA

OUT, IN = 256, 512  # one linear layer W: (OUT, IN)


def write_ckpt(folder: Path, tensors: dict[str, torch.Tensor], quant_config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    cfg = {"model_type": "llama"}
    if quant_config:
        cfg["quantization_config"] = quant_config
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def ct_config(bits: int, fmt: str = "pack-quantized", group: int | None = 128, sym: bool = True) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": bits,
                    "group_size": group,
                    "symmetric": sym,
                    "strategy": "group" if group else "channel",
                },
            }
        },
    }


def test_re_and_plain_targets_are_matched_as_compressed_tensors_matches_them():
    """A mixed-precision config's groups: the module's own name wins, then of the `re:` patterns that match it the
    first in sorted order (compressed-tensors' `match_targets`), whatever order the config lists them in; a
    pattern matches from the start of the name only. Checked against the library itself."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.utils.match import match_targets

    targets = [("re:.*mlp.*", 4), ("re:.*down_proj", 8), ("model.layers.0.mlp.down_proj", 2), ("re:head", 3)]
    cases = {
        "model.layers.0.mlp.down_proj": 2,  # its own name
        "model.layers.1.mlp.down_proj": 8,  # two patterns: ".*down_proj" sorts before ".*mlp.*"
        "model.layers.1.mlp.up_proj": 4,
        "lm_head": None,  # "re:head" does not match from the start
    }
    for module, bits in cases.items():
        library = match_targets(module, torch.nn.Module(), [t for t, _ in targets])
        assert module_bits(module, targets) == bits == (dict(targets)[library[0]] if library else None)
    args = [(t, {"num_bits": b, "type": "float" if b == 8 else "int"}) for t, b in targets]
    assert _weight_args(args, "model.layers.1.mlp.down_proj") == [{"num_bits": 8, "type": "float"}]


@pytest.mark.parametrize("g", [32, 64, 128])
def test_symmetric_int4_matches_closed_form(tmp_path, g):
    """Symmetric int4 with bf16 group scales: 4 + 16/g bits per weight."""
    t = {
        "l.weight_packed": torch.zeros(OUT, IN * 4 // 32, dtype=torch.int32),
        "l.weight_scale": torch.zeros(OUT, IN // g, dtype=torch.bfloat16),
    }
    r = bits_report(write_ckpt(tmp_path, t, ct_config(4, group=g)))
    assert r.parameters == OUT * IN
    assert r.quantized_linear_bits_per_weight == pytest.approx(4 + 16 / g, abs=1e-12)
    assert r.bits_per_weight == pytest.approx(4 + 16 / g, abs=1e-12)
    assert r.modules[0].format == f"int4 g{g}"


@pytest.mark.parametrize(
    "group,says",
    [
        ({"targets": 5}, "config_groups.group_0.targets is 5;"),
        ({"weights": {"num_bits": 4, "type": ["int"]}}, 'group_0.weights.type is ["int"], not a string'),
        ({"weights": {"num_bits": 4, "strategy": "block", "block_structure": ["a", "b"]}}, "block_structure is"),
    ],
    ids=["targets-int", "type-list", "block-strings"],
)
def test_a_malformed_config_group_is_a_usage_error_naming_it(tmp_path, capsys, group, says):
    """Fields of a compressed-tensors config group accounting reads, of the wrong kind: TypeError or ValueError,
    exit 3 (a review's repros); exit 2 naming the group and field now."""
    qc = ct_config(4)
    qc["config_groups"]["group_0"] |= group
    t = {
        "l.weight_packed": torch.zeros(OUT, IN * 4 // 32, dtype=torch.int32),
        "l.weight_scale": torch.zeros(OUT, IN // 128, dtype=torch.bfloat16),
    }
    assert main(["inspect", str(write_ckpt(tmp_path, t, qc))]) == 2
    assert says in capsys.readouterr().err


def test_gpt_oss_mxfp4_experts_count_two_values_a_byte_and_their_scales_as_scales(tmp_path):
    """gpt-oss as published (transformers' MXFP4: `*_blocks` of FP4 values two a byte, 16 bytes a block of 32, and an
    E8M0 `*_scales` byte a block): the blocks counted one parameter a byte and the scales as parameters, 10.1
    bits per weight where the file holds 6.1 (a review)."""
    e, out, inp = 4, 128, 64
    t = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.zeros(e, out, inp // 32, 16, dtype=torch.uint8),
        "model.layers.0.mlp.experts.gate_up_proj_scales": torch.zeros(e, out, inp // 32, dtype=torch.uint8),
        "model.layers.0.mlp.experts.gate_up_proj_bias": torch.zeros(e, out, dtype=torch.bfloat16),
    }
    r = bits_report(write_ckpt(tmp_path, t, {"quant_method": "mxfp4"}))
    assert r.parameters == e * out * inp + e * out and not r.notes
    (row,) = r.modules
    assert row.format == "mxfp4 g32"
    # 4 bits a value and 8 bits of scale a block of 32: 4.25, with the 16-bit biases beside them
    assert r.bytes_by_part["routed_experts"]["bits_per_weight"] == pytest.approx(
        (e * out * inp * 4.25 + e * out * 16) / (e * out * inp + e * out)
    )


def test_a_biased_grouped_linear_is_labelled_by_its_group(tmp_path):
    """A W4A16 g128 linear with a bias was labelled "int4 per-channel": its bias's parameters broke the division
    that finds the group (a review)."""
    t = {
        "l.weight_packed": torch.zeros(OUT, IN * 4 // 32, dtype=torch.int32),
        "l.weight_scale": torch.zeros(OUT, IN // 128, dtype=torch.bfloat16),
        "l.bias": torch.zeros(OUT, dtype=torch.bfloat16),
    }
    (row,) = bits_report(write_ckpt(tmp_path, t, ct_config(4))).modules
    assert row.format == "int4 g128" and row.parameters == OUT * IN + OUT


def test_asymmetric_int4_adds_zero_point_bits(tmp_path):
    """Asymmetric int4: 4 + 16/g (scale) + 4/g (packed int4 zero point) bits per weight."""
    g = 128
    t = {
        "l.weight_packed": torch.zeros(OUT, IN // 8, dtype=torch.int32),
        "l.weight_scale": torch.zeros(OUT, IN // g, dtype=torch.bfloat16),
        "l.weight_zero_point": torch.zeros(OUT // 8, IN // g, dtype=torch.int32),
    }
    r = bits_report(write_ckpt(tmp_path, t, ct_config(4, group=g, sym=False)))
    assert r.quantized_linear_bits_per_weight == pytest.approx(4 + 16 / g + 4 / g)
    assert r.bytes_by_role["zero_point"] == OUT // 8 * IN // g * 4


def test_unquantized_layers_count_at_their_width(tmp_path):
    """Embeddings and norms kept in bf16 raise whole-model bits above the linear-only figure."""
    g, V = 128, 1000
    t = {
        "model.embed_tokens.weight": torch.zeros(V, IN, dtype=torch.bfloat16),
        "model.norm.weight": torch.zeros(IN, dtype=torch.bfloat16),
        "model.l.weight_packed": torch.zeros(OUT, IN // 8, dtype=torch.int32),
        "model.l.weight_scale": torch.zeros(OUT, IN // g, dtype=torch.bfloat16),
    }
    r = bits_report(write_ckpt(tmp_path, t, ct_config(4, group=g)))
    params = V * IN + IN + OUT * IN
    assert r.parameters == params
    assert r.bits_per_weight == pytest.approx((16 * (V * IN + IN) + (4 + 16 / g) * OUT * IN) / params)
    assert r.bytes_by_role["embedding"] == V * IN * 2 and r.bytes_by_role["norm"] == IN * 2


def test_plain_bf16_is_16_bits(tmp_path):
    t = {"a.weight": torch.zeros(OUT, IN, dtype=torch.bfloat16), "a.bias": torch.zeros(OUT, dtype=torch.bfloat16)}
    r = bits_report(write_ckpt(tmp_path, t))
    assert r.format == "unquantized" and r.bits_per_weight == 16
    assert r.quantized_linear_parameters == 0 and r.quantized_linear_bits_per_weight is None
    assert set(r.bytes_by_role) == {"linear_kept", "bias"}


def test_int8_channel_quantized(tmp_path):
    """int-quantized W8A8: int8 payload + one bf16 scale per output row: 8 + 16/IN bits."""
    t = {
        "l.weight": torch.zeros(OUT, IN, dtype=torch.int8),
        "l.weight_scale": torch.zeros(OUT, 1, dtype=torch.bfloat16),
    }
    r = bits_report(write_ckpt(tmp_path, t, ct_config(8, fmt="int-quantized", group=None)))
    assert r.quantized_linear_bits_per_weight == pytest.approx(8 + 16 / IN)
    assert r.modules[0].format == "i8 per-channel"


def test_fp8_with_weight_scale(tmp_path):
    """FP8 E4M3 per-tensor: 8 bits + one fp32 scale, plus a static input scale counted as metadata."""
    t = {
        "l.weight": torch.zeros(OUT, IN, dtype=torch.float8_e4m3fn),
        "l.weight_scale": torch.zeros(1, dtype=torch.float32),
        "l.input_scale": torch.zeros(1, dtype=torch.float32),
    }
    r = bits_report(write_ckpt(tmp_path, t, {"quant_method": "fp8"}))
    assert r.parameters == OUT * IN
    assert r.quantized_linear_bits_per_weight == pytest.approx(8 + 64 / (OUT * IN))
    assert r.bytes_by_role == {"payload": OUT * IN, "scale": 4, "quant_meta": 4}


def test_gptq_format(tmp_path):
    """AutoGPTQ layout: qweight (IN/8, OUT), qzeros (IN/g, OUT/8), fp16 scales (IN/g, OUT), g_idx (IN,)."""
    g = 128
    t = {
        "l.qweight": torch.zeros(IN // 8, OUT, dtype=torch.int32),
        "l.qzeros": torch.zeros(IN // g, OUT // 8, dtype=torch.int32),
        "l.scales": torch.zeros(IN // g, OUT, dtype=torch.float16),
        "l.g_idx": torch.zeros(IN, dtype=torch.int32),
    }
    r = bits_report(write_ckpt(tmp_path, t, {"quant_method": "gptq", "bits": 4, "group_size": g}))
    assert r.parameters == OUT * IN
    assert r.quantized_linear_bits_per_weight == pytest.approx(4 + 16 / g + 4 / g + 32 / OUT)
    assert r.bytes_by_role["group_index"] == IN * 4
    assert r.modules[0].format == f"int4 g{g}"


def test_awq_format(tmp_path):
    """AutoAWQ GEMM layout: qweight (IN, OUT/8), qzeros (IN/g, OUT/8), scales (IN/g, OUT)."""
    g = 128
    t = {
        "l.qweight": torch.zeros(IN, OUT // 8, dtype=torch.int32),
        "l.qzeros": torch.zeros(IN // g, OUT // 8, dtype=torch.int32),
        "l.scales": torch.zeros(IN // g, OUT, dtype=torch.float16),
    }
    r = bits_report(write_ckpt(tmp_path, t, {"quant_method": "awq", "w_bit": 4, "q_group_size": g, "version": "gemm"}))
    assert r.parameters == OUT * IN
    assert r.quantized_linear_bits_per_weight == pytest.approx(4 + 16 / g + 4 / g)


def test_packed_without_bit_width_says_so(tmp_path):
    t = {
        "l.qweight": torch.zeros(IN // 8, OUT, dtype=torch.int32),
        "l.scales": torch.zeros(4, OUT, dtype=torch.float16),
    }
    r = bits_report(write_ckpt(tmp_path, t))
    assert r.parameters is None and r.bits_per_weight is None
    assert any("cannot unpack l.qweight" in n for n in r.notes)


def test_sharded_checkpoint_via_index(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    save_file({"a.weight": torch.zeros(4, 8, dtype=torch.bfloat16)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": torch.zeros(2, 8, dtype=torch.bfloat16)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a.weight": "model-00001-of-00002.safetensors",
                    "b.weight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    r = bits_report(tmp_path)
    assert len(r.files) == 2 and r.parameters == 48 and r.total_bytes == 96


def test_a_stored_tensor_the_index_leaves_out_is_refused_as_run_refuses_it(tmp_path):
    """A review: inspect counted a tensor no loader reads (the index does not name it) where `quantize run` refused
    the folder (files.index_and_experts_match_headers): one reading of the index for both."""
    save_file({"a.weight": torch.zeros(4, 8, dtype=torch.bfloat16)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": torch.zeros(2, 8, dtype=torch.bfloat16)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {"a.weight": "model-00001-of-00002.safetensors", "x.weight": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(UsageError, match="names tensor 'x.weight' in model-00002-of-00002.safetensors, but no shard"):
        bits_report(tmp_path)
    weight_map = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    save_file(
        {"a.weight": torch.zeros(4, 8, dtype=torch.bfloat16), "x.weight": torch.zeros(1, dtype=torch.bfloat16)},
        str(tmp_path / "model-00001-of-00002.safetensors"),
    )
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(UsageError, match="holds tensor 'x.weight', which .* does not name"):
        bits_report(tmp_path)


def test_reads_only_headers(tmp_path):
    t = {"a.weight": torch.zeros(1024, 1024, dtype=torch.bfloat16)}
    r = bits_report(write_ckpt(tmp_path, t))
    assert r.header_bytes_read < 200 < r.file_bytes


def test_folder_without_safetensors(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="no .safetensors file"):
        bits_report(tmp_path)


def test_a_pickle_beside_safetensors_is_refused(tmp_path):
    """A decoy .safetensors next to pytorch_model.bin: the folder is refused, the pickle never read."""
    write_ckpt(tmp_path, {"w": torch.zeros(2, 2)})
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match=r"pickle files \(pytorch_model.bin\)"):
        bits_report(tmp_path)


# --- malformed headers --------------------------------------------------------------------------


def raw_file(tmp_path: Path, header: bytes | dict, data: bytes = b"", length: int | None = None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return p


@pytest.mark.parametrize(
    "header,data,length,why",
    [
        ({}, b"", 5000, "past the end"),
        ({}, b"", 200_000_000, "100 MB"),
        (b"{not json", b"", None, "not valid JSON"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        ({"t": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0", None, "unknown dtype"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, None, "outside"),
        ({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "needs 12 bytes"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "non-negative"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            b"\0" * 8,
            None,
            "overlaps",
        ),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None, "gap"),
        ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, None, "exactly dtype, shape and data_offsets"),
    ],
)
def test_malformed_header_is_refused(tmp_path, header, data, length, why):
    with pytest.raises(UsageError, match=why):
        read_header(raw_file(tmp_path, header, data, length))


def test_short_file(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"abc")
    with pytest.raises(UsageError, match="shorter than the 8-byte"):
        read_header(p)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=256), length=st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_fuzz_header_never_crashes(tmp_path, blob, length):
    """Any bytes: either a parsed header or a UsageError; never another exception, never a huge read."""
    p = raw_file(tmp_path, blob, b"", length)
    try:
        tensors, _, nread = read_header(p)
    except UsageError:
        return
    assert nread <= p.stat().st_size
    assert all(t.nbytes >= 0 for t in tensors.values())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.text(max_size=8),
        st.fixed_dictionaries(
            {
                "dtype": st.sampled_from(["F32", "BF16", "I8", "X"]),
                "shape": st.lists(st.integers(-2, 6), max_size=3),
                "data_offsets": st.lists(st.integers(-4, 64), min_size=0, max_size=3),
            }
        ),
        max_size=4,
    ),
    st.integers(0, 64),
)
def test_fuzz_structured_headers(tmp_path, header, data_len):
    p = raw_file(tmp_path, header, b"\0" * data_len)
    try:
        tensors, _, _ = read_header(p)
    except UsageError:
        return
    assert sum(t.nbytes for t in tensors.values()) == data_len


@pytest.mark.parametrize(
    "side,settings,method",
    [
        ("quantize_config.json", {"bits": 4, "group_size": 128, "desc_act": False}, "gptq"),
        ("quant_config.json", {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}, "awq"),
    ],
)
def test_pre_integration_layouts_read_the_bit_width_beside_config(tmp_path, side, settings, method):
    """AutoGPTQ and AutoAWQ kept their settings in a side file; config.json has no quantization_config."""
    g = 128
    t = {
        "l.qweight": torch.zeros(IN // 8, OUT, dtype=torch.int32),
        "l.scales": torch.zeros(IN // g, OUT, dtype=torch.float16),
    }
    d = write_ckpt(tmp_path, t)
    (d / side).write_text(json.dumps(settings))
    r = bits_report(d)
    assert r.parameters == OUT * IN and r.format == f"{method} ({side})"
    assert r.quantized_linear_bits_per_weight == pytest.approx(4 + 16 / g)
    assert any(side in n for n in r.notes) and not any("cannot unpack" in n for n in r.notes)


def test_a_stored_copy_of_a_tied_output_layer_is_called_out(tmp_path):
    """AutoGPTQ 0.7.1 stores lm_head although the source model ties it: every byte counts, and bits per
    source parameter leave the copy's parameters out."""
    V, H = 64, 32
    t = {
        "model.embed_tokens.weight": torch.zeros(V, H, dtype=torch.float16),
        "lm_head.weight": torch.zeros(V, H, dtype=torch.float16),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(H, H, dtype=torch.float16),
    }
    d = write_ckpt(tmp_path, t)
    (d / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    r = bits_report(d)
    total_params = 2 * V * H + H * H
    assert r.parameters == total_params and r.tied_copy_parameters == V * H
    assert r.bits_per_weight == pytest.approx(16.0)
    assert r.bits_per_source_parameter == pytest.approx(8 * r.total_bytes / (total_params - V * H))
    assert any("ties the output layer" in n for n in r.notes)
    (d / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    assert bits_report(d).tied_copy_parameters == 0 and bits_report(d).bits_per_source_parameter is None


# --- read_header against the safetensors library ---------------------------------------------------------------

ST_DTYPES = {  # torch dtype -> the safetensors name read_header reports
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int32: "I32",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int64: "I64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.bool: "BOOL",
}


def same_as_safe_open(path: Path) -> int:
    """read_header's tensors and metadata equal what safetensors' own reader sees in the file; returns the count."""
    from safetensors import safe_open

    tensors, meta, _ = read_header(path)
    with safe_open(str(path), framework="numpy") as f:
        assert set(tensors) == set(f.keys())
        for name in f.keys():  # noqa: SIM118 (a safe_open handle is no dict)
            sl = f.get_slice(name)
            assert (tensors[name].dtype, tensors[name].shape) == (sl.get_dtype(), list(sl.get_shape())), name
        assert meta == (f.metadata() or {})
    return len(tensors)


@pytest.mark.parametrize("path", sorted(DATA.glob("*/*.safetensors")), ids=lambda p: p.parent.name)
def test_read_header_agrees_with_safetensors_on_every_fixture(path):
    assert same_as_safe_open(path) > 0


def test_read_header_agrees_with_safetensors_on_our_conversions(tmp_path, tiny_model, capsys):
    """A tiny conversion of each format we write (packed int4, int8 with activations, FP8)."""
    import yaml

    from quantize.cli import main

    for name, fields in {
        "w4": dict(method="rtn", scheme="W4A16", group_size=64),
        "w8a8": dict(method="rtn", scheme="W8A8"),
        "fp8": dict(method="fp8", scheme="FP8_DYNAMIC"),
    }.items():
        r = tmp_path / f"{name}.yaml"
        r.write_text(
            yaml.safe_dump({"model": str(tiny_model), "output": str(tmp_path / name), "calibration": None, **fields})
        )
        assert main(["run", str(r), "--quiet"]) == 0, capsys.readouterr().err
        assert same_as_safe_open(tmp_path / name / "model.safetensors") > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12),
        st.tuples(st.sampled_from(list(ST_DTYPES)), st.lists(st.integers(0, 5), max_size=3)),
        max_size=6,
    ),
    meta=st.one_of(st.none(), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)),
)
def test_read_header_agrees_with_safetensors_on_generated_files(tmp_path, spec, meta):
    """What safetensors writes, read both ways: the same tensors, or a refusal from both (safetensors 0.8.0 writes
    an invalid header for no tensors with empty metadata, and cannot open it either)."""
    from safetensors import SafetensorError, safe_open

    tensors = {name: torch.zeros(shape, dtype=dtype) for name, (dtype, shape) in spec.items()}
    path = tmp_path / "g.safetensors"
    save_file(tensors, str(path), metadata=meta)
    try:
        safe_open(str(path), framework="numpy")
    except SafetensorError:
        with pytest.raises(UsageError, match="not a valid safetensors file"):
            read_header(path)
        return
    assert same_as_safe_open(path) == len(tensors)
    found, _, _ = read_header(path)
    for name, t in tensors.items():
        assert found[name].dtype == ST_DTYPES[t.dtype] and found[name].nbytes == t.numel() * t.element_size()


# --- bytes by part of the model: experts, router, attention -------------------------------------------------------


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    from conftest import make_tiny_arch

    root = tmp_path_factory.mktemp("moe")
    return {f: make_tiny_arch(root / f, f) for f in ("qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss")}


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss"])
def test_parts_sum_to_the_total_and_experts_are_classified(moe_models, family):
    """Every byte lands in exactly one part; routed experts (experts.N.* per expert in Qwen/DeepSeek/Mixtral,
    fused experts.gate_up_proj/down_proj with biases in gpt-oss) are counted layer by layer with their number;
    DeepSeek's shared expert and the routers (mlp.gate, block_sparse_moe.gate, mlp.router) have their own part."""
    r = bits_report(moe_models[family])
    parts = r.bytes_by_part
    assert sum(p["bytes"] for p in parts.values()) == r.total_bytes
    assert sum(p["parameters"] for p in parts.values()) == r.parameters
    assert "other" not in parts or family == "gpt_oss"  # gpt-oss's attention sinks
    experts = 8 if family in ("qwen3_moe", "deepseek_v3") else 4
    layers = [1, 2] if family in ("qwen3_moe", "deepseek_v3") else [0, 1, 2]
    assert [(e.layer, e.experts_stored) for e in r.expert_layers] == [(i, experts) for i in layers]
    assert sum(e.bytes for e in r.expert_layers) == parts["routed_experts"]["bytes"]
    moe_intermediate = 32
    per_layer = experts * 3 * 64 * moe_intermediate + (experts * (2 * 32 + 64) if family == "gpt_oss" else 0)
    assert parts["routed_experts"]["parameters"] == len(layers) * per_layer  # gpt-oss: + its fused biases
    assert parts["router"]["parameters"] == len(layers) * experts * (
        64 + (1 if family in ("deepseek_v3", "gpt_oss") else 0)
    )
    assert ("shared_experts" in parts) == (family == "deepseek_v3")
    assert r.routed_expert_share == pytest.approx(parts["routed_experts"]["bytes"] / r.total_bytes)


def test_quantized_experts_carry_their_scales(tmp_path):
    """NVFP4-style experts: packed payload and scales stay in the routed-experts part (their bits per weight
    include the scales); the part's metadata bytes are the scales; a dense model has no expert share."""
    t = {}
    for layer in range(2):
        for e in range(4):
            m = f"model.layers.{layer}.mlp.experts.{e}.down_proj"
            t[f"{m}.weight_packed"] = torch.zeros(OUT, IN // 2, dtype=torch.uint8)
            t[f"{m}.weight_scale"] = torch.zeros(OUT, IN // 16, dtype=torch.float8_e4m3fn)
            t[f"{m}.weight_global_scale"] = torch.zeros(1, dtype=torch.float32)
        t[f"model.layers.{layer}.mlp.gate.weight"] = torch.zeros(4, IN, dtype=torch.bfloat16)
        t[f"model.layers.{layer}.self_attn.q_proj.weight"] = torch.zeros(IN, IN, dtype=torch.bfloat16)
    qc = ct_config(4, fmt="nvfp4-pack-quantized", group=16)
    qc["config_groups"]["group_0"]["weights"]["type"] = "float"
    r = bits_report(write_ckpt(tmp_path, t, qc))
    experts = r.bytes_by_part["routed_experts"]
    assert experts["parameters"] == 2 * 4 * OUT * IN
    assert experts["metadata_bytes"] == 2 * 4 * (OUT * IN // 16 + 4)
    assert experts["bits_per_weight"] == pytest.approx(4 + 8 / 16 + 32 / (OUT * IN))
    assert r.bytes_by_part["router"]["bytes"] == 2 * 4 * IN * 2
    assert sum(p["bytes"] for p in r.bytes_by_part.values()) == r.total_bytes


def test_dense_model_parts_and_inspect_json(tiny_model, capsys):
    """A dense Llama: attention, MLP, embedding, norms; no experts, no expert share; `inspect --json` carries
    the parts and the share, and the text names them."""
    from quantize.cli import main

    r = bits_report(tiny_model)
    assert set(r.bytes_by_part) == {"attention", "mlp", "embedding", "norm"}
    assert r.routed_expert_share is None and r.expert_layers == []
    assert main(["inspect", str(tiny_model), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_by_part"] == r.bytes_by_part and out["routed_expert_share"] is None
    assert main(["inspect", str(tiny_model)]) == 0
    assert "bytes by part" in capsys.readouterr().out


def test_inspect_states_the_experts_share(moe_models, capsys):
    from quantize.cli import main

    assert main(["inspect", str(moe_models["qwen3_moe"])]) == 0
    text = capsys.readouterr().out
    share = bits_report(moe_models["qwen3_moe"]).routed_expert_share
    assert f"routed experts hold {100 * share:.2f}% of the bytes (2 MoE layer(s), 8 experts each)" in text


def test_each_torch_name_is_the_dtype_safetensors_writes_under_that_stored_name(tmp_path):
    """headers.TORCH_NAMES (the meta tensors of the source check, the floating dtypes a model is built in) against
    safetensors itself: a tensor of each torch dtype is stored under the name the table maps to it, read back."""
    from quantize.checkpoint.headers import FLOATS, TORCH_NAMES

    tensors = {stored: torch.zeros(2, dtype=getattr(torch, name)) for stored, name in TORCH_NAMES.items()}
    save_file(tensors, str(tmp_path / "t.safetensors"))
    found, _, _ = read_header(tmp_path / "t.safetensors")
    assert {n: t.dtype for n, t in found.items()} == {stored: stored for stored in TORCH_NAMES}
    wide = {s for s, n in TORCH_NAMES.items() if getattr(torch, n).is_floating_point and getattr(torch, n).itemsize > 1}
    assert {s: TORCH_NAMES[s] for s in wide} == FLOATS
