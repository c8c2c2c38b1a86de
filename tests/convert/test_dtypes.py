"""The source's dtype as transformers picks it, what a run records as saved (the output's headers), the refusal of a
cast to float16 that could overflow, and FP4 outputs of float32 and float16 sources reloaded in their own dtype."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from quantize import records
from quantize.checkpoint.files import safetensors_files
from quantize.checkpoint.headers import FLOATS, all_tensors
from quantize.cli import main
from quantize.convert import engine
from quantize.convert.dtypes import source_dtype
from quantize.records import RunRecord

NORMS = r"layernorm\.weight$"  # the tiny Llama's per-layer norms (model.norm.weight aside)


def variant(src: Path, dst: Path, config_dtype: str | None, cast: dict[str, str]) -> Path:
    """A copy of `src` whose config.json says `config_dtype` (None: no dtype at all) and whose tensors matching each
    pattern of `cast` are stored in that dtype."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    (f,) = safetensors_files(dst)
    tensors = load_file(str(f))
    for name, t in tensors.items():
        for pattern, dtype in cast.items():
            if re.search(pattern, name):
                tensors[name] = t.to(getattr(torch, dtype))
    save_file(tensors, str(f), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg.pop("dtype", None), cfg.pop("torch_dtype", None)
    if config_dtype is not None:
        cfg["dtype"] = config_dtype
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def run(tmp_path: Path, model: Path, name: str, **fields) -> int:
    rfile = tmp_path / f"{name}.yaml"
    out = tmp_path / "out" / name
    rfile.write_text(yaml.safe_dump({"name": name, "model": str(model), "output": str(out), **fields}))
    return main(["run", str(rfile), "--quiet"])


def record(tmp_path: Path, name: str) -> RunRecord:
    return records.read(RunRecord, tmp_path / "out" / name / "quantize.json")


def stored(folder: Path) -> dict[str, str]:
    found, _ = all_tensors(safetensors_files(folder))
    return {n: t.dtype for n, t in found.items()}


@pytest.mark.parametrize(
    ("config_dtype", "cast"),
    [
        (None, {}),  # no dtype in config.json, bf16 headers: the first floating tensor's
        (None, {r"^model\.embed_tokens": "float32"}),  # the first tensor in sorted order is float32, the rest bf16
        (None, {r"^lm_head|^model\.layers": "float32"}),  # sorted order, not the order the header lists them in
        ("float32", {}),  # config.json wins over the headers
    ],
)
def test_the_source_dtype_is_the_one_transformers_builds_the_model_in(tmp_path, tiny_model, config_dtype, cast):
    from transformers import AutoModelForCausalLM

    folder = variant(tiny_model, tmp_path / "m", config_dtype, cast)
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto")
    assert source_dtype(folder) == str(loaded.config.dtype).removeprefix("torch.")


def test_saved_dtype_is_read_from_the_output_where_config_json_names_no_dtype(tmp_path, tiny_model):
    """The old record said float32 (config.json's dtype, else float32) for outputs stored in bfloat16."""
    folder = variant(tiny_model, tmp_path / "nodtype", None, {})
    for streaming in ("on", "off"):
        name = f"nodtype-{streaming}"
        assert run(tmp_path, folder, name, method="fp8", scheme="FP8_DYNAMIC", streaming=streaming) == 0
        written = stored(tmp_path / "out" / name)
        assert record(tmp_path, name).engine.saved_dtype == FLOATS[written["model.embed_tokens.weight"]]


def test_a_mixed_dtype_source_is_saved_in_the_same_dtypes_on_every_path(tmp_path, tiny_model):
    """float32 norms in a bfloat16 checkpoint: the in-memory path's load (transformers' from_pretrained in the
    checkpoint's dtype) holds them in bfloat16 and saves them so, after a float32 calibration too (cast_saved_floats);
    the streamed path wrote each tensor in the dtype it is stored in, so they stayed float32 (issue 57; this test
    asserted that difference, then documented). Now every tensor's dtype in the headers is the same on the three,
    the streamed and in-memory files are the same bytes, and each record says bfloat16."""
    from test_streaming import tensors

    folder = variant(tiny_model, tmp_path / "mixed", "bfloat16", {NORMS: "float32"})
    fields = dict(method="fp8", scheme="FP8_DYNAMIC")
    assert run(tmp_path, folder, "on", streaming="on", **fields) == 0
    assert run(tmp_path, folder, "off", streaming="off", **fields) == 0
    assert run(tmp_path, folder, "f32", streaming="off", dtype="float32", **fields) == 0
    norms = {n for n, d in stored(folder).items() if d == "F32"}
    on, off, f32 = (stored(tmp_path / "out" / name) for name in ("on", "off", "f32"))
    assert norms and on == off == f32
    assert {off[n] for n in norms} == {"BF16"}  # what transformers' load made of them
    assert tensors(tmp_path / "out" / "on") == tensors(tmp_path / "out" / "off")
    assert {record(tmp_path, name).engine.saved_dtype for name in ("on", "off", "f32")} == {"bfloat16"}
    assert record(tmp_path, "f32").engine.calibration_dtype == "float32"


def test_a_float32_calibration_keeps_in_float32_what_the_model_keeps_in_float32(tmp_path):
    """DeepSeek-V3 keeps its router's e_score_correction_bias in float32 (its class's _keep_in_fp32_modules_strict):
    loaded in bf16 and saved, it is F32. After a float32 calibration (`dtype: float32`) cast_saved_floats cast every
    float32 tensor to bf16, that one too (issue 57); now it keeps what the bf16 run keeps, tensor for tensor."""
    import families

    src = families.build("deepseek_v3", tmp_path / "ds")
    fields = dict(method="fp8", scheme="FP8_DYNAMIC", streaming="off")
    assert run(tmp_path, src, "auto", **fields) == 0
    assert run(tmp_path, src, "f32", dtype="float32", **fields) == 0
    auto, f32 = stored(tmp_path / "out" / "auto"), stored(tmp_path / "out" / "f32")
    kept = {n for n, d in auto.items() if d == "F32"}
    assert kept and all(n.endswith("e_score_correction_bias") for n in kept)
    assert f32 == auto
    assert record(tmp_path, "f32").engine.saved_dtype == record(tmp_path, "auto").engine.saved_dtype


@pytest.mark.parametrize(
    ("config_dtype", "recipe_dtype", "says"),
    [
        ("float16", None, "config.json's `dtype`"),  # headers bf16: in memory every tensor was cast to float16
        (None, "float16", "dtype: float16 in the recipe"),  # a bf16 model the recipe asks to load in float16
    ],
)
def test_a_cast_to_float16_of_wider_stored_tensors_is_exit_2_before_anything_loads(
    tmp_path, tiny_model, monkeypatch, capsys, config_dtype, recipe_dtype, says
):
    def loaded(*_a, **_k):
        raise AssertionError("the conversion started")

    monkeypatch.setattr(engine, "_convert", loaded)
    monkeypatch.setattr(engine, "_convert_streamed", loaded)
    folder = variant(tiny_model, tmp_path / "m", config_dtype, {})
    extra = {"dtype": recipe_dtype} if recipe_dtype else {}
    for streaming in ("on", "off"):
        fields = dict(method="fp8", scheme="FP8_DYNAMIC", streaming=streaming, **extra)
        assert run(tmp_path, folder, f"x-{streaming}", **fields) == 2
        err = capsys.readouterr().err
        assert says in err and "model.embed_tokens.weight" in err and "65504" in err


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_fp4_output_of_a_float32_or_float16_source_reloads_in_its_own_dtype(tmp_path, tiny_model, dtype):
    """compressed-tensors decompresses FP4 weights into bfloat16 inside a model transformers built in the source's
    dtype: the reload check met "expected m1 and m2 to have the same dtype" (exit 3) after the whole conversion."""
    folder = variant(tiny_model, tmp_path / dtype, dtype, {".": dtype})
    assert run(tmp_path, folder, "fp4", method="rtn", scheme="NVFP4A16", calibration=None) == 0
    meta = record(tmp_path, "fp4")
    assert meta.engine.saved_dtype == dtype
    assert meta.finite_checks[-1].max_abs_logit is not None
