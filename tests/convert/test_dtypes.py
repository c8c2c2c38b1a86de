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


def test_a_mixed_dtype_source_differs_between_the_paths_only_where_the_docs_say(tmp_path, tiny_model):
    """float32 norms in a bfloat16 checkpoint: in memory (transformers' load) they are cast to bfloat16, streamed
    they stay float32 (docs/recipes.md); each record says what its output stores, and every other tensor is the
    same bytes on both paths."""
    from test_streaming import tensors

    folder = variant(tiny_model, tmp_path / "mixed", "bfloat16", {NORMS: "float32"})
    fields = dict(method="fp8", scheme="FP8_DYNAMIC")
    assert run(tmp_path, folder, "on", streaming="on", **fields) == 0
    assert run(tmp_path, folder, "off", streaming="off", **fields) == 0
    on, off = tensors(tmp_path / "out" / "on"), tensors(tmp_path / "out" / "off")
    norms = {n for n, d in stored(folder).items() if d == "F32"}
    assert norms and set(on) == set(off)
    assert {n for n in on if on[n] != off[n]} == norms
    assert {stored(tmp_path / "out" / "on")[n] for n in norms} == {"F32"}
    assert {stored(tmp_path / "out" / "off")[n] for n in norms} == {"BF16"}
    assert record(tmp_path, "off").engine.saved_dtype == "bfloat16"
    first = sorted(norms)[0]
    assert record(tmp_path, "on").engine.saved_dtype == f"bfloat16 (float32: {len(norms)} tensors, e.g. {first})"


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
