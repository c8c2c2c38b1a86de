"""`quantize run` on a checkpoint that stores multi-token-prediction (MTP) layers after its decoder's, as DeepSeek-V3
and GLM-4.5 publish them (tests/families.build_mtp): transformers' causal LM does not load them, so the conversion
writes the decoder alone, byte for byte the checkpoint its decoder-only twin converts to, and quantize.json names
the layers left out (layer_plan.not_converted: which, how many tensors, bytes and parameters, why), as do the run's
summary and the model card. The old code refused the folder (exit 2: "config.json says num_hidden_layers 2, but the
weights hold 3 decoder layers ... fix config.json")."""

from __future__ import annotations

import json

import pytest
import yaml
from families import build_mtp

from quantize import records
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import safetensors_files
from quantize.checkpoint.headers import all_tensors
from quantize.cli import main
from quantize.records import RunRecord

FP8 = dict(method="fp8", scheme="FP8_DYNAMIC", targets=["Linear"], ignore=["lm_head"], calibration=None)


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_an_mtp_checkpoint_converts_to_its_decoders_checkpoint_and_says_what_it_left_out(tmp_path, family, capsys):
    decoder, mtp = build_mtp(family, tmp_path / "src")
    out, meta, said = {}, {}, {}
    for name, src in (("decoder", decoder), ("mtp", mtp)):
        rfile = tmp_path / f"{name}.yaml"
        out[name] = tmp_path / "out" / name
        rfile.write_text(yaml.safe_dump({"name": name, "model": str(src), "output": str(out[name]), **FP8}))
        assert main(["run", str(rfile)]) == 0
        said[name] = capsys.readouterr().out
        meta[name] = records.read(RunRecord, out[name] / "quantize.json")
    for f in ("model.safetensors", "config.json"):
        assert (out["mtp"] / f).read_bytes() == (out["decoder"] / f).read_bytes(), f
    assert meta["decoder"].layer_plan.not_converted == []
    [left] = meta["mtp"].layer_plan.not_converted
    source = bits_report(mtp).bytes_by_part["mtp"]
    layer = [n for n in all_tensors(safetensors_files(mtp))[0] if ".layers.2." in n]
    assert (left.layers, left.tensors, left.bytes, left.parameters) == (
        ["model.layers.2"],
        len(layer),
        source["bytes"],
        source["parameters"],
    )
    assert "num_nextn_predict_layers 1" in left.why and "does not load" in left.why
    # bits per weight are per parameter of the source the checkpoint holds: the decoder's, on both
    assert meta["mtp"].bits == meta["decoder"].bits
    assert meta["mtp"].source_model.parameters == meta["decoder"].source_model.parameters + left.parameters
    assert "not converted: model.layers.2 (" in said["mtp"] and "not converted" not in said["decoder"]
    assert "not converted, not in this checkpoint | model.layers.2:" in (out["mtp"] / "README.md").read_text()


@pytest.mark.parametrize("declared", [True, False])
def test_a_prefixed_mtp_module_is_kept_as_copied_or_said_not_converted(tmp_path, declared, capsys):
    """Qwen3-Next's MTP module under `mtp.` (tests/families.build_mtp_prefixed), which transformers' model ignores.
    Declared (config.json's mtp_num_hidden_layers), llm-compressor's save copies it from the source into a shard of
    its own: the run exits 0 with one layout (the shard index, model.safetensors its first shard), the decoder's
    tensors are those its decoder-only twin converts to, and left_16bit lists the module's weights, the file's own
    bytes. Undeclared, nothing copies it: the checkpoint is the twin's byte for byte, and layer_plan.not_converted
    names it. The old code ended the declared run in exit 3 ("holds both model.safetensors and
    model.safetensors.index.json"), and said nothing of the module on either."""
    from families import build_mtp_prefixed

    decoder, mtp = build_mtp_prefixed("qwen3_next", tmp_path / "src", declared=declared)
    out, meta = {}, {}
    for name, src in (("decoder", decoder), ("mtp", mtp)):
        rfile = tmp_path / f"{name}.yaml"
        out[name] = tmp_path / "out" / name
        rfile.write_text(yaml.safe_dump({"name": name, "model": str(src), "output": str(out[name]), **FP8}))
        assert main(["run", str(rfile)]) == 0
        meta[name] = records.read(RunRecord, out[name] / "quantize.json")
    said = capsys.readouterr().out
    source = {n: t for n, t in all_tensors(safetensors_files(mtp))[0].items() if n.startswith("mtp.")}
    part = bits_report(mtp).bytes_by_part["mtp"]
    held = all_tensors(safetensors_files(out["mtp"]))[0]
    twin = all_tensors(safetensors_files(out["decoder"]))[0]
    assert meta["decoder"].layer_plan.not_converted == []
    assert not any("multi-token-prediction" in g.why for g in meta["decoder"].layer_plan.left_16bit)
    if declared:
        import torch
        from safetensors.torch import load_file

        assert not (out["mtp"] / "model.safetensors").exists()  # the index's layout alone
        mine = {k: v for f in safetensors_files(out["mtp"]) for k, v in load_file(f).items() if k in twin}
        theirs = load_file(out["decoder"] / "model.safetensors")
        assert set(held) - set(twin) == set(source) and mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert {n: (t.shape, t.dtype, t.nbytes) for n, t in held.items() if n.startswith("mtp.")} == {
            n: (t.shape, t.dtype, t.nbytes) for n, t in source.items()
        }
        [copied] = [g for g in meta["mtp"].layer_plan.left_16bit if "multi-token-prediction" in g.why]
        weights = {n: t for n, t in held.items() if n.startswith("mtp.") and n.endswith(".weight") and len(t.shape) > 1}
        assert (sorted(copied.tensors), copied.bytes) == (sorted(weights), sum(t.nbytes for t in weights.values()))
        assert meta["mtp"].layer_plan.not_converted == []
        assert bits_report(out["mtp"]).bytes_by_part["mtp"]["bytes"] == part["bytes"]
        assert "multi-token-prediction (MTP) module (part `mtp`)" in said
    else:
        for f in ("model.safetensors", "config.json"):
            assert (out["mtp"] / f).read_bytes() == (out["decoder"] / f).read_bytes(), f
        [left] = meta["mtp"].layer_plan.not_converted
        assert (left.layers, left.tensors, left.bytes, left.parameters) == (
            ["mtp"],
            len(source),
            part["bytes"],
            part["parameters"],
        )
        assert "does not load it" in left.why and "^mtp.*" in left.why
        assert meta["mtp"].bits == meta["decoder"].bits
        assert not any("multi-token-prediction" in g.why for g in meta["mtp"].layer_plan.left_16bit)


def test_the_streamed_path_keeps_a_prefixed_mtp_module_as_model_free_ptq_copies_it(tmp_path):
    """Streamed (model_free_ptq, shard by shard), a dense Qwen3.5's `mtp.*` module is copied as stored, no target
    naming it: the structure check lets it be (the old code ended in exit 3, "15 tensor(s) the model does not have,
    e.g. mtp.fc.weight"), and left_16bit lists its weights, the file's own bytes."""
    from families import build_mtp_prefixed

    _, mtp = build_mtp_prefixed("qwen3_5_text", tmp_path / "src")
    rfile, out = tmp_path / "r.yaml", tmp_path / "out"
    rfile.write_text(yaml.safe_dump({"name": "s", "model": str(mtp), "output": str(out), "streaming": "on", **FP8}))
    assert main(["run", str(rfile)]) == 0
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.memory_plan.path == "streamed"
    held = all_tensors(safetensors_files(out))[0]
    weights = {n: t for n, t in held.items() if n.startswith("mtp.") and n.endswith(".weight") and len(t.shape) > 1}
    [copied] = [g for g in meta.layer_plan.left_16bit if "multi-token-prediction" in g.why]
    assert weights and (sorted(copied.tensors), copied.bytes) == (
        sorted(weights),
        sum(t.nbytes for t in weights.values()),
    )
    assert meta.layer_plan.not_converted == []


def _mtp_sources(tmp_path, form: str):
    """The MTP checkpoint of each form: `declared`, a dense Qwen3.5's `mtp.*` module with mtp_num_hidden_layers;
    `undeclared`, the same module with no field declaring it; `layers`, an MTP layer after the decoder's
    (model.layers.2, num_nextn_predict_layers 1) as DeepSeek-V3 stores it, on a dense Llama: every family whose
    class declares that form is a mixture of experts, which the streamed path refuses, and config.json's field is
    read as written (architecture.mtp_layers)."""
    from families import build_mtp, build_mtp_prefixed

    if form == "layers":
        return build_mtp("llama", tmp_path / "src")[1]
    return build_mtp_prefixed("qwen3_5_text", tmp_path / "src", declared=form == "declared")[1]


@pytest.mark.parametrize("form", ["declared", "undeclared", "layers"])
def test_the_streamed_and_in_memory_paths_keep_the_same_mtp_tensors(tmp_path, form):
    """Both paths write the MTP tensors llm-compressor's save copies (a declared `mtp.*` module, in a shard of its
    own, `re:^mtp.*` in the ignore list) and drop the others with the same not_converted note: the streamed path's
    model_free_ptq copied every stored tensor, so it kept an undeclared `mtp.*` module and a `model.layers.2` MTP
    layer the in-memory path left out (issue 57). The outputs hold the same tensors, the same quantization_config
    and the same records of what was left at 16 bits or not converted."""
    src = _mtp_sources(tmp_path, form)
    out, meta = {}, {}
    for streaming in ("on", "off"):
        rfile = tmp_path / f"{streaming}.yaml"
        out[streaming] = tmp_path / "out" / streaming
        fields = {"name": form, "model": str(src), "output": str(out[streaming]), "streaming": streaming, **FP8}
        rfile.write_text(yaml.safe_dump(fields))
        assert main(["run", str(rfile), "--quiet"]) == 0
        meta[streaming] = records.read(RunRecord, out[streaming] / "quantize.json")
    assert meta["on"].memory_plan.path == "streamed" and meta["off"].memory_plan.path == "in-memory"
    held = {s: all_tensors(safetensors_files(out[s]))[0] for s in out}
    assert {n: (t.shape, t.dtype) for n, t in held["on"].items()} == {
        n: (t.shape, t.dtype) for n, t in held["off"].items()
    }
    assert sorted(p.name for p in out["on"].glob("*.safetensors*")) == sorted(
        p.name for p in out["off"].glob("*.safetensors*")
    )
    qc = {s: json.loads((out[s] / "config.json").read_text())["quantization_config"] for s in out}
    assert qc["on"] == qc["off"]
    assert meta["on"].layer_plan.left_16bit == meta["off"].layer_plan.left_16bit
    assert meta["on"].layer_plan.not_converted == meta["off"].layer_plan.not_converted
    kept = any(n.startswith("mtp.") for n in held["on"])
    assert kept == (form == "declared") and ("re:^mtp.*" in qc["on"]["ignore"]) == kept
    assert bool(meta["on"].layer_plan.not_converted) == (not kept)
