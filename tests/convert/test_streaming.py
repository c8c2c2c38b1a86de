"""Data-free recipes streamed shard by shard (llm-compressor's model_free_ptq, engine._convert_streamed): the same
bytes as the in-memory path, sharded sources in and sharded outputs out, and checks that read one tensor at a time."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
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

from conftest import quantize_child

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


WIDE = "model.layers.1.self_attn.q_proj.weight"  # the one Linear weight a bf16 checkpoint stores in float32


def _float32_weight(t):
    """WIDE in float32, with values bf16 cannot hold (the bf16 weight nudged by a seeded relative 1e-3)."""
    import torch

    g = torch.Generator().manual_seed(0)
    w = t[WIDE].float()
    t[WIDE] = w * (1 + 1e-3 * torch.randn(w.shape, generator=g))


@pytest.mark.parametrize("name", list(SCHEMES))
def test_a_float32_weight_in_a_bf16_checkpoint_is_quantized_from_the_same_values_on_both_paths(
    tmp_path, tiny_model, name
):
    """The in-memory load (from_pretrained in the checkpoint's dtype) holds a float32-stored weight in bf16 and
    quantizes that; the streamed path quantized the float32 values as stored, so its integers and scales differed
    in the last bit (issue 57). Now it casts each tensor to the dtype the load holds it in (dtypes.held_dtypes)
    before quantizing: every tensor, this one's packed values and scales too, is the same dtype, shape and bytes."""
    import torch
    from safetensors import safe_open

    src = edited_copy(tiny_model, tmp_path / "wide", _float32_weight)
    with safe_open(str(src / "model.safetensors"), framework="pt") as st:
        w = st.get_tensor(WIDE)
    assert w.dtype == torch.float32 and not torch.equal(w, w.bfloat16().float())  # bf16 cannot hold it
    streamed, rs = run(tmp_path, src, f"{name}-on", streaming="on", **SCHEMES[name])
    loaded, rm = run(tmp_path, src, f"{name}-off", streaming="off", **SCHEMES[name])
    assert rs.memory_plan.path == "streamed" and rm.memory_plan.path == "in-memory"
    got, want = tensors(streamed), tensors(loaded)
    assert got.keys() == want.keys()
    assert {k for k in got if got[k] != want[k]} == set()
    assert (streamed / "model.safetensors").read_bytes() == (loaded / "model.safetensors").read_bytes()
    assert rs.weights_sha256 == rm.weights_sha256


def test_a_streamed_config_json_ignores_what_the_in_memory_save_lists(tmp_path, tiny_model):
    """An ignore of `lm_head` and a pattern: the in-memory path's save (compressed-tensors' QuantizationConfig.
    from_pretrained) lists every Linear left unquantized by name, layer by layer; the streamed output wrote the
    recipe's list as given (issue 57), so vLLM, compressed-tensors and inspect read two lists from one recipe. Now
    the two config.json files are the same bytes, and the list is compressed-tensors' own reading of the in-memory
    model (every module of a quantized type no config group holds)."""
    fp8 = dict(SCHEMES["fp8-dynamic"], ignore=["lm_head", "re:.*layers.0.*"])
    streamed, rs = run(tmp_path, tiny_model, "on", streaming="on", **fp8)
    loaded, rm = run(tmp_path, tiny_model, "off", streaming="off", **fp8)
    assert rs.memory_plan.path == "streamed" and rm.memory_plan.path == "in-memory"
    assert (streamed / "config.json").read_bytes() == (loaded / "config.json").read_bytes()
    ignore = json.loads((streamed / "config.json").read_text())["quantization_config"]["ignore"]
    held = tensors(loaded)
    unquantized = {n.removesuffix(".weight") for n in held if n.endswith(".weight") and f"{n}_scale" not in held}
    layer0 = {n for n in unquantized if n.startswith("model.layers.0.") and "layernorm" not in n}
    assert set(ignore) == layer0 | {"lm_head"} and len(layer0) == 7  # q, k, v, o, gate, up, down
    assert rs.bits == rm.bits and rs.layer_plan == rm.layer_plan


def test_a_sharded_source_streams_to_a_sharded_output(tmp_path):
    """Six decoder layers, one a shard; --max-memory leaves room for a shard (the plan's streamed conversion) but not
    for the whole model, so `auto` streams and the reload is left out."""
    from quantize.convert import memory
    from quantize.convert.recipe import parse_recipe

    src = scale.write_llama(tmp_path / "sharded", scale.Shape(hidden=512, intermediate=1024, vocab=256), 6)
    fp8 = SCHEMES["fp8-dynamic"]
    need = memory.plan(parse_recipe({"streaming": "on", **fp8}), src).phases["conversion"]
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
    done = quantize_child("run", str(rfile), "--quiet", "--max-memory", str(max_memory), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.memory_plan.reload == "streamed"
    return meta.memory.peak_rss_bytes


@pytest.mark.slow  # two child conversions: about 2 minutes on the shared 2-core CPU machine (import-bound)
def test_the_streamed_paths_peak_memory_does_not_grow_with_depth(tmp_path):
    """4 layers (29 MiB) against 16 (117 MiB): the in-memory path would hold twice the difference more (~175 MiB);
    the streamed path holds one shard at a time, so its peak may differ by noise only (48 MiB allowed). The
    memory given is what the plan says the streamed path needs (the same at every depth: one shard), so the full
    reload, which loads the whole model, is planned out at both depths (its own phase needs more)."""
    from quantize.convert import memory
    from quantize.convert.recipe import parse_recipe

    probe = scale.write_llama(tmp_path / "probe", SHAPE, 2, sparse=True)
    need = memory.plan(parse_recipe({"streaming": "on", **SCHEMES["fp8-dynamic"]}), probe).phases["conversion"]
    shallow, deep = peak_of_streamed_run(tmp_path, 4, need + 2**20), peak_of_streamed_run(tmp_path, 16, need + 2**20)
    assert deep - shallow < 48 * 2**20, (shallow, deep)


GPTQ_SHAPE = scale.Shape(hidden=512, intermediate=1024, heads=8, kv_heads=2, vocab=2048)  # 4.5 MiB a layer


def peak_of_offloaded_gptq(tmp_path: Path, depth: int, max_memory: int) -> tuple[int, RunRecord]:
    """Peak RSS (VmHWM) of a child `quantize run` of GPTQ W4A16 with `offload: on` (benchmarks/scale.py's GPTQ
    recipe: 8 × 128 calibration tokens) under `--max-memory`."""
    src = scale.write_llama(tmp_path / f"g{depth}", GPTQ_SHAPE, depth)
    rfile = tmp_path / f"g{depth}.yaml"
    out = tmp_path / "out" / f"g{depth}"
    rfile.write_text(yaml.safe_dump({"model": str(src), "output": str(out), "offload": "on", **scale.GPTQ}))
    done = quantize_child("run", str(rfile), "--quiet", "--max-memory", str(max_memory), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = records.read(RunRecord, out / "quantize.json")
    assert not list(out.parent.glob(".g*.offload-*"))  # the offload folder went with the run
    return meta.memory.peak_rss_bytes, meta


@pytest.mark.slow  # GPTQ of 2 and then 8 decoder layers on the CPU: minutes
def test_the_offloaded_gptq_peak_memory_does_not_grow_with_depth(tmp_path):
    """2 layers against 8 (9 against 36 MiB of bf16), each under the memory the plan gives the conversion (the
    same at both depths: one decoder layer at a time) and 1 MiB: the full reload check, which decompresses the
    whole model and so grows with depth (measured: 27-31 MiB from 2 to 8 layers), fits at 2 layers and is planned
    out at 8 (the streamed checks instead). The peak stays under the budget and grows by the save's 4-bit output
    (about 7 MiB more at 8 layers; 24 MiB allowed for noise)."""
    from quantize.convert import memory
    from quantize.convert.recipe import parse_recipe

    probe = scale.write_llama(tmp_path / "probe", GPTQ_SHAPE, 8, sparse=True)
    budget = memory.plan(parse_recipe({"offload": "on", **scale.GPTQ}), probe).phases["conversion"] + 2**20
    shallow, meta = peak_of_offloaded_gptq(tmp_path, 2, budget)
    deep, deep_meta = peak_of_offloaded_gptq(tmp_path, 8, budget)
    assert meta.memory_plan.path == "offloaded" and meta.bits.quantized_linear_parameters > 0
    assert deep_meta.memory_plan.reload == "streamed"
    assert deep <= budget, (deep, budget)
    assert deep - shallow < 24 * 2**20, (shallow, deep)


# --- the one pre-load check of every path (checks.check_source, files.check_model_dir) -------------------------


def edited_copy(src: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint `src` at `dst` whose tensors `edit(tensors)` changes in place."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _extra(t):
    import torch

    t["model.layers.0.mlp.extra.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)


def _missing(t):
    del t["model.layers.1.self_attn.k_proj.weight"]


def _misshapen(t):
    import torch

    t["model.layers.1.mlp.down_proj.weight"] = torch.zeros(128, 96, dtype=torch.bfloat16)  # config.json: [128, 192]


MISMATCHES = {
    "extra": (_extra, "model.layers.0.mlp.extra.weight"),
    "missing": (_missing, "model.layers.1.self_attn.k_proj.weight"),
    "misshapen": (_misshapen, r"model.layers.1.mlp.down_proj.weight has shape [128, 96]"),
}


def untouched(monkeypatch) -> None:
    """The backend's load and stream fail the test if called: a refusal must come before either."""
    from quantize.convert.backends.llmcompressor import LLMCompressorBackend

    def called(*_a, **_k):
        raise AssertionError("the source was loaded or converted")

    monkeypatch.setattr(LLMCompressorBackend, "load", called)
    monkeypatch.setattr(LLMCompressorBackend, "stream", called)


def refused(tmp_path: Path, model: Path, capsys, *flags: str, **fields) -> str:
    """`quantize run` of FP8 dynamic on `model`: exit 2, nothing written; its message."""
    out = tmp_path / "out" / "refused"
    rfile = tmp_path / "refused.yaml"
    rfile.write_text(yaml.safe_dump({"model": str(model), "output": str(out), **SCHEMES["fp8-dynamic"], **fields}))
    assert main(["run", str(rfile), "--quiet", *flags]) == 2
    assert not out.exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("streaming", ["on", "off"])
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_a_source_that_does_not_match_config_json_is_exit_2_before_converting_on_every_path(
    tmp_path, tiny_model, capsys, monkeypatch, case, streaming
):
    """A stored tensor the model has no place for, a weight the checkpoint lacks, a weight of another shape than
    config.json implies: exit 2 naming it, before the backend loads or streams anything, streamed as in memory
    (one check, checks.check_source, before either path). Before: the in-memory path found them in or after its
    load (exit 2 once the model was in memory), the streamed path converted the whole model, then exit 3."""
    edit, named = MISMATCHES[case]
    untouched(monkeypatch)
    err = refused(tmp_path, edited_copy(tiny_model, tmp_path / case, edit), capsys, streaming=streaming)
    assert named in err and "config.json" in err


def sharded_with_index(src: Path, dst: Path, weight_map_edit) -> Path:
    """`src`'s tensors in two shards with a shard index, whose weight_map `weight_map_edit(weight_map)` changes."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2]}
    shards["model-00002-of-00002.safetensors"] = names[len(names) // 2 :]
    for shard, held in shards.items():
        save_file({n: tensors[n] for n in held}, dst / shard, metadata={"format": "pt"})
    weight_map = {n: shard for shard, held in shards.items() for n in held}
    weight_map_edit(weight_map)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


@pytest.mark.parametrize("streaming", ["on", "off"])
def test_a_shard_index_that_names_a_tensor_no_shard_holds_is_exit_2_on_every_path(
    tmp_path, tiny_model, capsys, monkeypatch, streaming
):
    """A shard index naming a tensor no shard holds: exit 2 naming the tensor and the index, on both paths and in
    the check eval and gate make (files.check_model_dir); so is a stored tensor the index leaves out. Before: the
    streamed path stopped in model_free_ptq with an UnboundLocalError (exit 3), the in-memory one converted it."""
    from quantize.checkpoint.files import check_model_dir
    from quantize.errors import UsageError

    ghost = "model.layers.0.mlp.ghost.weight"
    src = sharded_with_index(tiny_model, tmp_path / "ghost", lambda m: m.update({ghost: next(iter(m.values()))}))
    untouched(monkeypatch)
    err = refused(tmp_path, src, capsys, streaming=streaming)
    assert f"model.safetensors.index.json names tensor '{ghost}'" in err and "no shard holds it" in err
    with pytest.raises(UsageError, match=f"names tensor '{ghost}'"):
        check_model_dir(src)
    left_out = sharded_with_index(tiny_model, tmp_path / "left-out", lambda m: m.pop("model.norm.weight"))
    with pytest.raises(UsageError, match=r"holds tensor 'model\.norm\.weight', which .*index\.json does not name"):
        check_model_dir(left_out)


def test_a_failing_streamed_conversion_says_one_paragraph_and_no_library_traceback(tmp_path, tiny_model):
    """Without --quiet, a shard model_free_ptq cannot read (planted in a child process: its reader fails) ends in
    our one message, exit 3 naming the library's reason, and no traceback: compressed-tensors' TensorProfiler, which
    validates each shard, printed the exception's traceback to stderr and swallowed it, and model_free_ptq then
    stopped on an UnboundLocalError that named nothing."""
    rfile = tmp_path / "fails.yaml"
    out = tmp_path / "out" / "fails"
    fields = {"model": str(tiny_model), "output": str(out), "streaming": "on", **SCHEMES["fp8-dynamic"]}
    rfile.write_text(yaml.safe_dump(fields))
    code = (
        "import sys; import llmcompressor.entrypoints.model_free as m; "
        "m.load_tensors_from_inverse_weight_map = lambda *a, **k: (_ for _ in ()).throw("
        "ValueError('planted: this shard does not read')); "
        "from quantize.cli import main; sys.exit(main(['run', sys.argv[1]]))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(rfile)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "UnboundLocalError" not in done.stderr, done.stderr[-3000:]
    assert "model_free_ptq failed: ValueError: planted: this shard does not read" in done.stderr
    assert not out.exists()


def test_a_streamed_run_copies_nothing_of_the_source_folder_but_what_its_identity_covers(tmp_path, tiny_model):
    """model_free_ptq copies every other file of the folder it reads into its output, through links: a link to a
    secret arrived as a file holding it, a .git folder was copied, the source's weights.sha256 came along, and a
    FIFO was exit 3 (a review's repros). It reads a view of the weights and the identity's files now."""
    model = shutil.copytree(tiny_model, tmp_path / "model")
    (tmp_path / "secret.txt").write_text("HF_TOKEN=hf_secret\n")
    (model / "notes.txt").symlink_to(tmp_path / "secret.txt")
    (model / ".git" / "objects").mkdir(parents=True)
    (model / ".git" / "objects" / "pack").write_bytes(b"x" * 1000)
    (model / "weights.sha256").write_text("0" * 64 + "\n")
    os.mkfifo(model / "pipe")
    out, record = run(tmp_path, model, "viewed", streaming="on", **SCHEMES[next(iter(SCHEMES))])
    assert record.memory_plan.path == "streamed"
    names = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert not names & {"notes.txt", ".git", ".git/objects/pack", "weights.sha256", "pipe"}, names
    assert "HF_TOKEN" not in "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names


def test_a_family_transformers_renames_on_load_is_refused_before_streaming(tmp_path, capsys):
    """A dense Nemotron-H stores `backbone.*`, which transformers renames `model.*` on load: the streamed path wrote
    the stored names and its own structure check failed after the whole conversion, exit 3 (a review); in memory it
    converts."""
    import families

    src = tmp_path / "nemotron"
    cfg = families.config("nemotron_h", layers_block_type=["mamba", "attention", "mlp", "mlp"])
    families.save_random(cfg, src)
    data = json.loads((src / "config.json").read_text())
    dense = {k: v for k, v in data.items() if "expert" not in k and k not in ("moe_intermediate_size", "n_group")}
    (src / "config.json").write_text(json.dumps(dense))
    rfile = tmp_path / "r.yaml"
    fields = {"model": str(src), "output": str(tmp_path / "out" / "on"), "streaming": "on", **SCHEMES["fp8-dynamic"]}
    rfile.write_text(yaml.safe_dump(fields))
    assert main(["run", str(rfile), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "stores backbone." in err and "under names transformers renames" in err, err
    assert not (tmp_path / "out" / "on").exists()
    _, meta = run(tmp_path, src, "off", streaming="off", **SCHEMES["fp8-dynamic"])
    assert meta.memory_plan.path == "in-memory"
