"""`quantize run` on a checkpoint that stores multi-token-prediction (MTP) layers after its decoder's, as DeepSeek-V3
and GLM-4.5 publish them (tests/families.build_mtp): transformers' causal LM does not load them, so the conversion
writes the decoder alone, byte for byte the checkpoint its decoder-only twin converts to, and quantize.json names
the layers left out (layer_plan.not_converted: which, how many tensors, bytes and parameters, why), as do the run's
summary and the model card. The old code refused the folder (exit 2: "config.json says num_hidden_layers 2, but the
weights hold 3 decoder layers ... fix config.json")."""

from __future__ import annotations

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
