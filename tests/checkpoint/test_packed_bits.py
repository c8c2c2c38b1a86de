"""A packed weight's num_bits (config.json) held to its storage (quantize/checkpoint/accounting.py, _Count._unpacked):
a width its words cannot hold, or one that does not pack the weight's own shape (its weight_shape, or its scales ×
group_size) into the words stored, is exit 2 naming the tensor, config.json's num_bits and what the storage holds.
Before, `quantize inspect` trusted num_bits: on an int4 output, 64 gave "int64" at 66 bits per quantized weight, 3
gave 43,690 parameters for a tensor, 8 "int8 g64" at group_size 128; on NVFP4, 16 gave 18 bits (a review). The bad
cases are a real tiny conversion with config.json edited, or payloads packed by compressed-tensors itself.

With it, config.json's other readings the review found: a quantization_config that is not an object ([] and 0
were "unquantized"), a config.json that is not a regular file (read as absent), a shape past the sizes the
safetensors library computes with (accepted)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.headers import read_header
from quantize.cli import main
from quantize.errors import UsageError

OUT = 8  # rows of a hand-written payload


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, tiny_model):
    """The tiny model converted once to int4 (W4A16 g64, int32 words) and once to NVFP4A16 (uint8 bytes)."""
    root = tmp_path_factory.mktemp("packed")
    made = {}
    for name, fields in {
        "w4": dict(method="rtn", scheme="W4A16", group_size=64),
        "nvfp4": dict(method="rtn", scheme="NVFP4A16"),
    }.items():
        recipe = root / f"{name}.yaml"
        recipe.write_text(
            yaml.safe_dump({"model": str(tiny_model), "output": str(root / name), "calibration": None, **fields})
        )
        assert main(["run", str(recipe), "--quiet"]) == 0
        made[name] = root / name
    return made


def with_num_bits(src: Path, dst: Path, bits: int) -> Path:
    """A copy of the output `src` whose config.json declares `bits` for every config group's weights."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for group in cfg["quantization_config"]["config_groups"].values():
        group["weights"]["num_bits"] = bits
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_genuine_outputs_count_the_weights_the_library_stored(outputs):
    """The conversions as written: every packed weight counts the values its weight_shape says (int4) or two a
    byte (NVFP4), so the quantized linears' parameters are the source linears' own."""
    w4 = bits_report(outputs["w4"])
    with safe_open(str(outputs["w4"] / "model.safetensors"), framework="pt") as f:
        shapes = [f.get_tensor(n).tolist() for n in f.keys() if n.endswith(".weight_shape")]  # noqa: SIM118
    assert shapes and w4.quantized_linear_parameters == sum(a * b for a, b in shapes)
    nv = bits_report(outputs["nvfp4"])
    with safe_open(str(outputs["nvfp4"] / "model.safetensors"), framework="pt") as f:
        packed = [f.get_slice(n).get_shape() for n in f.keys() if n.endswith(".weight_packed")]  # noqa: SIM118
    assert packed and nv.quantized_linear_parameters == sum(a * b * 2 for a, b in packed)


@pytest.mark.parametrize(
    "fmt,bits,says",
    [
        ("w4", 64, "compressed-tensors packs 1 to 8 bits a value into int32 words (pack_to_int32), never 64"),
        ("w4", 3, "the storage holds num_bits 4"),
        ("w4", 8, "the storage holds num_bits 4"),
        ("w4", 2, "the storage holds num_bits 4"),
        ("nvfp4", 16, "compressed-tensors packs 4 bits a value into uint8 bytes (pack_fp4_to_uint8), never 16"),
        ("nvfp4", 8, "never 8"),
        ("nvfp4", 2, "never 2"),
    ],
)
def test_a_num_bits_the_storage_does_not_hold_is_refused(outputs, tmp_path, capsys, fmt, bits, says):
    bad = with_num_bits(outputs[fmt], tmp_path / "bad", bits)
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert ".weight_packed is " in err and f"num_bits {bits}" in err and says in err, err
    assert "Fix num_bits in config.json's quantization_config" in err
    if fmt == "w4" and bits != 64:
        assert "its weight_shape [" in err  # the evidence named: the shape compressed-tensors stored


def write(folder: Path, tensors: dict[str, torch.Tensor], qc: dict) -> Path:
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qc}))
    return folder


def ct(bits: int, group: int | None) -> dict:
    strategy = {"strategy": "group", "group_size": group} if group else {"strategy": "channel"}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": bits, "type": "int", **strategy}}},
    }


def packed(cols: int, bits: int) -> torch.Tensor:
    """OUT rows of `cols` values of `bits`, packed by compressed-tensors itself."""
    from compressed_tensors.compressors import pack_to_int32

    return pack_to_int32(torch.zeros(OUT, cols, dtype=torch.int8), bits).contiguous()


@pytest.mark.parametrize("cols,bits", [(100, 3), (100, 5), (100, 4), (7, 6)])
def test_a_dense_row_counts_its_weight_shape_exactly(tmp_path, cols, bits):
    """compressed-tensors packs densely, a value split across words (3 bits: a row of 100 in 10 words): the count
    is the weight_shape's, where words × 32 / bits (106 a row) counted values that are not there."""
    pytest.importorskip("compressed_tensors")
    t = {
        "l.weight_packed": packed(cols, bits),
        "l.weight_shape": torch.tensor([OUT, cols]),
        "l.weight_scale": torch.ones(OUT, 1, dtype=torch.bfloat16),
    }
    r = bits_report(write(tmp_path / "ok", t, ct(bits, None)))
    assert r.quantized_linear_parameters == OUT * cols
    assert r.modules[0].format == f"int{bits} per-channel"


def test_a_dense_row_at_another_num_bits_names_the_one_that_fits(tmp_path, capsys):
    pytest.importorskip("compressed_tensors")
    t = {
        "l.weight_packed": packed(100, 3),
        "l.weight_shape": torch.tensor([OUT, 100]),
        "l.weight_scale": torch.ones(OUT, 1, dtype=torch.bfloat16),
    }
    assert main(["inspect", str(write(tmp_path / "bad", t, ct(4, None)))]) == 2
    err = capsys.readouterr().err
    assert "l.weight_packed is I32 [8, 10]" in err and "num_bits 4" in err
    assert "its weight_shape [8, 100] says a row holds 100 values, which pack at 4 bits into 13 int32 words" in err
    assert "the storage holds num_bits 3" in err


def test_without_a_weight_shape_the_scales_and_group_size_bound_the_row(tmp_path, capsys):
    """No weight_shape (a layout that leaves it out): G scale columns of group_size g hold (G−1)·g+1 to G·g values
    a row, and num_bits must pack those into the words stored."""
    pytest.importorskip("compressed_tensors")
    t = {"l.weight_packed": packed(512, 4), "l.weight_scale": torch.ones(OUT, 4, dtype=torch.bfloat16)}
    assert bits_report(write(tmp_path / "ok", t, ct(4, 128))).quantized_linear_parameters == OUT * 512
    assert main(["inspect", str(write(tmp_path / "bad", t, ct(8, 128)))]) == 2
    err = capsys.readouterr().err
    assert "its weight_scale [8, 4] × group_size 128 says a row holds 385 to 512 values" in err
    assert "which pack at 8 bits into 97 to 128 int32 words, not 64: the storage holds num_bits 4 or 5" in err


def test_a_weight_shape_whose_rows_differ_from_its_words_is_refused(tmp_path):
    pytest.importorskip("compressed_tensors")
    t = {"l.weight_packed": packed(64, 4), "l.weight_shape": torch.tensor([OUT + 1, 64])}
    with pytest.raises(UsageError, match=r"weight_shape stored beside it is \[9, 64\]: their rows differ"):
        bits_report(write(tmp_path / "bad", t, ct(4, None)))


@pytest.mark.parametrize("bits", [64, 5])
def test_gptq_words_that_hold_no_whole_number_of_values_are_refused(tmp_path, capsys, bits):
    """AutoGPTQ's qweight (IN·bits/32, OUT) int32: 64 bits a value is more than a word, and 5 leaves 2^19 words'
    bits, not a multiple of 5; exit 0 at 128 and 6.4 bits a weight before."""
    t = {
        "l.qweight": torch.zeros(64, 256, dtype=torch.int32),
        "l.scales": torch.zeros(4, 256, dtype=torch.float16),
    }
    folder = write(tmp_path / "gptq", t, {"quant_method": "gptq", "bits": bits, "group_size": 128})
    assert main(["inspect", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"l.qweight is I32 [64, 256]: its 16,384 32-bit words hold no whole number of {bits}-bit values" in err


# --- config.json ---------------------------------------------------------------------------------


def plain(folder: Path, cfg: object = None) -> Path:
    folder.mkdir()
    save_file({"l.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}, str(folder / "model.safetensors"))
    if cfg is not None:
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("key", ["quantization_config", "compression_config"])
@pytest.mark.parametrize("value", [[], 0, False, "", "fp8", 5, True, [1]])
def test_a_quantization_config_that_is_not_an_object_is_refused(tmp_path, capsys, key, value):
    """[], 0, false and "" were read as "unquantized" (an `or` chain), while "fp8", 5 and true were refused."""
    folder = plain(tmp_path / "m", {"model_type": "llama", key: value})
    assert main(["inspect", str(folder)]) == 2
    assert f"config.json's {key} is {json.dumps(value)}, not an object" in capsys.readouterr().err


def test_a_null_or_empty_quantization_config_is_unquantized(tmp_path):
    for i, value in enumerate([None, {}]):
        folder = plain(tmp_path / str(i), {"model_type": "llama", "quantization_config": value})
        assert bits_report(folder).format == "unquantized"


@pytest.mark.parametrize("kind", ["fifo", "folder", "dev-zero", "broken-link"])
def test_a_config_json_that_is_not_a_regular_file_is_refused(tmp_path, capsys, kind):
    """Read as absent before: inspect called the checkpoint unquantized (a FIFO is never opened: no hang)."""
    folder = plain(tmp_path / "m")
    cfg = folder / "config.json"
    {
        "fifo": lambda: os.mkfifo(cfg),
        "folder": cfg.mkdir,
        "dev-zero": lambda: cfg.symlink_to("/dev/zero"),
        "broken-link": lambda: cfg.symlink_to(tmp_path / "nowhere"),
    }[kind]()
    assert main(["inspect", str(folder)]) == 2
    assert "config.json is not a regular file" in capsys.readouterr().err
    assert bits_report(plain(tmp_path / "none")).format == "unquantized"  # absent is still unquantized


# --- shapes past the library's sizes --------------------------------------------------------------


def header_file(path: Path, dtype: str, shape: list[int]) -> Path:
    body = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}}).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    return path


@pytest.mark.parametrize(
    "dtype,shape",
    [
        ("F16", [2**64, 2**64, 0]),
        ("F16", [2**64 - 1, 2, 0]),
        ("F16", [2**63, 2, 0]),
        ("F16", [2**61, 1]),  # 2**61 elements of 16 bits: 2**65 bits
        ("F64", [2**58, 1]),
        ("F16", [2**62, 2, 0]),
        ("F16", [0, 2**62, 4]),
        ("F64", [2**57, 0]),
        ("F4", [2**62 - 1, 1, 0]),
    ],
)
def test_a_shape_is_refused_where_the_safetensors_library_refuses_it(tmp_path, dtype, shape):
    """The library sizes a tensor in 64-bit usize, multiplying checked (dimension by dimension, then by the dtype's
    bits) and refusing an overflow; read_header refuses the same shapes, accepts the others."""
    path = header_file(tmp_path / "t.safetensors", dtype, shape)
    try:
        with safe_open(str(path), framework="numpy"):
            library = True
    except Exception:  # whatever the library raises: it refused
        library = False
    try:
        read_header(path)
        ours = True
    except UsageError as e:
        assert "past the 64-bit sizes the safetensors library computes with" in str(e)
        ours = False
    assert ours == library


def test_a_dimension_torch_cannot_make_is_refused_though_the_library_reads_it(tmp_path):
    """[2**63, 0] holds no bytes and the library reads it, but torch's sizes are signed 64-bit: no tensor it can
    make. Refused, where [2**63 − 1, 0] is read."""
    with pytest.raises(UsageError, match="each dimension below 2"):
        read_header(header_file(tmp_path / "a.safetensors", "F16", [2**63, 0]))
    assert read_header(header_file(tmp_path / "b.safetensors", "F16", [2**63 - 1, 0]))[0]["t"].shape == [2**63 - 1, 0]
