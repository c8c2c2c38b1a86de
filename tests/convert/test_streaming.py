"""Data-free recipes streamed shard by shard (llm-compressor's model_free_ptq, engine._convert_streamed): the same
bytes as the in-memory path, sharded sources in and sharded outputs out, and checks that read one tensor at a time."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantize import records
from quantize.checkpoint.files import safetensors_files
from quantize.cli import main
from quantize.convert.checks import streamed_finite_check, structure_check
from quantize.errors import RuntimeFailure
from quantize.records import RunRecord

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scale", ROOT / "benchmarks" / "scale.py")
scale = importlib.util.module_from_spec(_spec)
sys.modules["scale"] = scale  # dataclasses look their module up
_spec.loader.exec_module(scale)

SCHEMES = {
    "fp8-dynamic": dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None),
    "nvfp4a16": dict(method="rtn", scheme="NVFP4A16", calibration=None),
    "w4a16-g64": dict(method="rtn", scheme="W4A16", group_size=64, calibration=None),
}


def run(tmp_path: Path, model: Path, name: str, *flags: str, **fields) -> tuple[Path, RunRecord]:
    out = tmp_path / "out" / name
    rfile = tmp_path / f"{name}.yaml"
    rfile.write_text(yaml.safe_dump({"name": name, "model": str(model), "output": str(out), **fields}))
    assert main(["run", str(rfile), "--quiet", *flags]) == 0
    return out, records.read(RunRecord, out / "quantize.json")


def tensors(folder: Path) -> dict[str, bytes]:
    import torch
    from safetensors import safe_open

    got = {}
    for f in safetensors_files(folder):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118
                t = st.get_tensor(k)
                got[k] = (str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return got


@pytest.mark.parametrize("name", list(SCHEMES))
def test_a_streamed_recipe_writes_the_in_memory_paths_bytes(tmp_path, tiny_model, name):
    streamed, rs = run(tmp_path, tiny_model, f"{name}-on", streaming="on", **SCHEMES[name])
    loaded, rm = run(tmp_path, tiny_model, f"{name}-off", streaming="off", **SCHEMES[name])
    assert rs.memory_plan.path == "streamed" and rm.memory_plan.path == "in-memory"
    for f in ("model.safetensors", "config.json", "recipe.yaml"):
        assert (streamed / f).read_bytes() == (loaded / f).read_bytes(), f
    assert rs.weights_sha256 == rm.weights_sha256
    assert rs.bits == rm.bits
    assert rs.engine.modifiers == rm.engine.modifiers and rs.layer_plan == rm.layer_plan
    # the streamed checks: every tensor read one at a time, then (the model fits) a reload with logits
    first, reload = rs.finite_checks
    assert first.tensors_read == len(tensors(streamed)) and first.max_abs_logit is None
    assert reload.max_abs_logit is not None and rs.memory_plan.reload == "full"


def test_a_sharded_source_streams_to_a_sharded_output(tmp_path):
    """Six decoder layers, one a shard; --max-memory leaves room for a shard (the plan's streamed need) but not for
    the whole model, so `auto` streams and the reload is left out."""
    from quantize.convert import memory
    from quantize.convert.recipe import parse_recipe

    src = scale.write_llama(tmp_path / "sharded", scale.Shape(hidden=512, intermediate=1024, vocab=256), 6)
    fp8 = SCHEMES["fp8-dynamic"]
    need = memory.plan(parse_recipe({"streaming": "on", **fp8}), src).need_bytes
    streamed, rs = run(tmp_path, src, "on", "--max-memory", str(need + 2**20), **fp8)
    loaded, _ = run(tmp_path, src, "off", streaming="off", **fp8)
    names = sorted(p.name for p in streamed.glob("*.safetensors"))
    assert names == sorted(p.name for p in src.glob("*.safetensors")) and len(names) == 6
    index = json.loads((streamed / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(names)
    # tensor for tensor (the in-memory path writes one file): the same bytes except the sign of a zero. The source
    # holds one weight stored as -0.0 (layers.5 q_proj, from write_llama's bf16 truncation): model_free_ptq keeps
    # it as FP8 -0 (0x80), the in-memory path writes +0 (0x00); the values are equal, the bytes are not
    got, want, src = tensors(streamed), tensors(loaded), tensors(src)
    assert got.keys() == want.keys()
    differ = {k for k in got if got[k] != want[k]}
    assert differ == {"model.layers.5.self_attn.q_proj.weight"}
    (_, _, a), (_, _, b) = got[differ.pop()], want["model.layers.5.self_attn.q_proj.weight"]
    flips = [(i, a[i], b[i]) for i in range(len(a)) if a[i] != b[i]]
    assert [(x, y) for _, x, y in flips] == [(0x80, 0x00)]
    assert src["model.layers.5.self_attn.q_proj.weight"][2][2 * flips[0][0] : 2 * flips[0][0] + 2] == b"\x00\x80"
    plan = rs.memory_plan
    assert plan.path == "streamed" and plan.reload == "streamed" and plan.available_from == "--max-memory"
    assert [c.max_abs_logit for c in rs.finite_checks] == [None]  # no reload: the plan said it does not fit
    # a record written before the plan existed (no memory_plan, no tensors_read) still reads
    old = rs.model_dump()
    del old["memory_plan"]
    for c in old["finite_checks"]:
        del c["tensors_read"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert records.read(RunRecord, tmp_path / "old.json").memory_plan is None


def test_the_streamed_checks_find_a_non_finite_tensor_and_a_structure_that_differs(tmp_path, tiny_model):
    import torch
    from safetensors.torch import load_file, save_file

    out, _ = run(tmp_path, tiny_model, "fp8", streaming="on", **SCHEMES["fp8-dynamic"])
    quantized = {n.rsplit(".", 1)[0] for n in tensors(out) if n.endswith(".weight_scale")}
    structure_check(out, tiny_model, quantized, False)
    with pytest.raises(
        RuntimeFailure, match=r"the model does not have, e\.g\. model\.layers\.0\.mlp\.up_proj\.weight_s"
    ):
        structure_check(out, tiny_model, quantized - {"model.layers.0.mlp.up_proj"}, False)
    t = load_file(out / "model.safetensors")
    t["model.norm.weight"] = t["model.norm.weight"].clone()
    t["model.norm.weight"][3] = torch.nan
    save_file(t, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeFailure, match=r"tensor model\.norm\.weight \(in model\.safetensors\) holds NaN"):
        streamed_finite_check(out)
    del t["model.layers.1.self_attn.k_proj.weight_scale"]
    save_file(t, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeFailure, match=r"k_proj was to be quantized but stores \['weight'\]"):
        structure_check(out, tiny_model, quantized, False)


SHAPE = scale.Shape(hidden=512, intermediate=2048, heads=8, kv_heads=4, vocab=256)  # 7.3 MiB a layer


def peak_of_streamed_run(tmp_path: Path, depth: int, max_memory: int) -> int:
    """Peak RSS (VmHWM) of a child `quantize run` streaming a checkpoint of `depth` layers, one a shard."""
    src = scale.write_llama(tmp_path / f"d{depth}", SHAPE, depth)
    rfile = tmp_path / f"d{depth}.yaml"
    out = tmp_path / "out" / f"d{depth}"
    rfile.write_text(
        yaml.safe_dump({"model": str(src), "output": str(out), "streaming": "on", **SCHEMES["fp8-dynamic"]})
    )
    # --max-memory keeps the full reload out (it would load the whole model, which does grow with depth)
    cmd = [sys.executable, "-m", "quantize.cli", "run", str(rfile), "--quiet", "--max-memory", str(max_memory)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.memory_plan.reload == "streamed"
    return meta.memory.peak_rss_bytes


@pytest.mark.slow  # two child conversions: about 2 minutes on the shared 2-core CPU machine (import-bound)
def test_the_streamed_paths_peak_memory_does_not_grow_with_depth(tmp_path):
    """4 layers (29 MiB) against 16 (117 MiB): the in-memory path would hold twice the difference more (~175 MiB);
    the streamed path holds one shard at a time, so its peak may differ by noise only (48 MiB allowed). The
    memory given is what the plan says the streamed path needs (the same at every depth: one shard), so the full
    reload, which loads the whole model, is planned out at both depths."""
    from quantize.convert import memory
    from quantize.convert.recipe import parse_recipe

    probe = scale.write_llama(tmp_path / "probe", SHAPE, 2, sparse=True)
    need = memory.plan(parse_recipe({"streaming": "on", **SCHEMES["fp8-dynamic"]}), probe).need_bytes
    shallow, deep = peak_of_streamed_run(tmp_path, 4, need + 2**20), peak_of_streamed_run(tmp_path, 16, need + 2**20)
    assert deep - shallow < 48 * 2**20, (shallow, deep)


GPTQ_SHAPE = scale.Shape(hidden=512, intermediate=1024, heads=8, kv_heads=2, vocab=2048)  # 4.5 MiB a layer


def peak_of_offloaded_gptq(tmp_path: Path, depth: int) -> tuple[int, RunRecord]:
    """Peak RSS (VmHWM) of a child `quantize run` of GPTQ W4A16 with `offload: on` (benchmarks/scale.py's GPTQ
    recipe: 8 × 128 calibration tokens)."""
    src = scale.write_llama(tmp_path / f"g{depth}", GPTQ_SHAPE, depth)
    rfile = tmp_path / f"g{depth}.yaml"
    out = tmp_path / "out" / f"g{depth}"
    rfile.write_text(yaml.safe_dump({"model": str(src), "output": str(out), "offload": "on", **scale.GPTQ}))
    cmd = [sys.executable, "-m", "quantize.cli", "run", str(rfile), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = records.read(RunRecord, out / "quantize.json")
    assert not list(out.parent.glob(".g*.offload-*"))  # the offload folder went with the run
    return meta.memory.peak_rss_bytes, meta


@pytest.mark.slow  # GPTQ of 2 and then 8 decoder layers on the CPU: minutes
def test_the_offloaded_gptq_peak_memory_does_not_grow_with_depth(tmp_path):
    """2 layers against 8 (9 against 36 MiB of bf16): the in-memory path holds the model and a second copy, about
    54 MiB more at 8 layers; with the weights offloaded to disk the sequential pipeline holds one layer at a time, so
    the peak grows by the full reload of the small 4-bit output only (about 8 MiB; 24 MiB allowed for noise)."""
    shallow, meta = peak_of_offloaded_gptq(tmp_path, 2)
    deep, _ = peak_of_offloaded_gptq(tmp_path, 8)
    assert meta.memory_plan.path == "offloaded" and meta.bits.quantized_linear_parameters > 0
    assert deep - shallow < 24 * 2**20, (shallow, deep)
