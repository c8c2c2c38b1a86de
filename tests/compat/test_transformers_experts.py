"""What transformers' own loader makes of a per-expert compressed-tensors MoE checkpoint, by format, pinned on the
installed version (compat.transformers.expert_reading runs its DecompressExperts on one stored expert). On 5.17 it
reads FP8 and symmetric packed experts as stored, drops an NVFP4 expert's global scale (reported unexpected: the
weights come out thousands of times too large) and fails on an asymmetric one's zero point ("Asymmetric quant
requires zero-point values"). docs/moe.md's loaders table, the model card and quantize.json's reload stage say
so; when a release reads them, this test fails and those are to be revisited. quantize's own loader reads every
one of them as stored (its logits near the source's, transformers' not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from moe_models import make_tiny_moe

from quantize.checkpoint.decompressed import transformers_reading
from quantize.cli import main

# recipe fields -> the stored expert tensor transformers' loader does not read (None: it reads them all)
SCHEMES = {
    "fp8": (dict(method="fp8", scheme="FP8_DYNAMIC"), None),
    "nvfp4a16": (dict(method="rtn", scheme="NVFP4A16"), "weight_global_scale"),
    "w4a16-asym": (dict(method="rtn", scheme="W4A16", group_size=64, symmetric=False), "weight_zero_point"),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_tiny_moe(tmp_path_factory.mktemp("src") / "qwen3_moe", "qwen3_moe")


def _kl(p, q) -> float:
    import torch

    return float(torch.nn.functional.kl_div(q.log_softmax(-1), p.log_softmax(-1), log_target=True, reduction="sum"))


@pytest.mark.parametrize("name", list(SCHEMES))
def test_transformers_reads_fp8_experts_and_misreads_nvfp4_and_asymmetric_ones(tmp_path, source, capsys, name):
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import load_model

    fields, dropped = SCHEMES[name]
    out = tmp_path / name
    recipe = tmp_path / f"{name}.yaml"
    data = {"name": name, "model": str(source), "output": str(out), "targets": ["Linear"], "ignore": ["lm_head"]}
    recipe.write_text(yaml.safe_dump(data | fields | {"calibration": None}))
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    why = transformers_reading(out)
    stage = json.loads((out / "quantize.json").read_text())["finite_checks"][0]["stage"]
    card = (out / "README.md").read_text()
    ids = torch.tensor([[1, 5, 9, 2, 17, 33, 4, 8, 40, 3]])
    ours, _ = load_model(out, False)  # in config.json's dtype (bf16), as `eval` loads it
    with torch.no_grad():
        src = AutoModelForCausalLM.from_pretrained(str(source))(input_ids=ids).logits.float()
        mine = ours(input_ids=ids).logits.float()
    if dropped is None:  # the control: read as stored, no key missing or unexpected, and the card sends users to it
        assert why is None
        _, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"]
        assert "reads its expert weights as stored" in stage and "Load with `transformers." in card
        assert "\nlibrary_name: transformers\n" in card
        return
    assert why is not None and dropped in why, why
    assert "misreads its routed experts" in stage and dropped in stage
    assert "misreads this checkpoint's routed experts" in card and "Load with `transformers." not in card
    assert "library_name" not in card.split("\n---\n")[0]  # no Hub snippet loading it with transformers
    if name == "w4a16-asym":
        assert "Asymmetric quant requires zero-point values" in why  # what its DecompressExperts raises
        with pytest.raises(RuntimeError, match="conversion of the weights"):  # the load stops, reporting it
            AutoModelForCausalLM.from_pretrained(str(out))
        return
    theirs, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert any(k.endswith(dropped) for k in info["unexpected_keys"]) and not info["missing_keys"]
    with torch.no_grad():
        wrong = theirs(input_ids=ids).logits.float()
    # ours is the format's rounding of the source; transformers' is far off it
    print(f"KL from the source: ours {_kl(src, mine):.3g}, transformers' {_kl(src, wrong):.3g}")
    assert 100 * _kl(src, mine) < _kl(src, wrong), (_kl(src, mine), _kl(src, wrong))


def test_a_checkpoint_without_quantized_experts_is_read_by_transformers(tmp_path, source, capsys):
    """Experts in `ignore` (stored per expert at 16 bits): nothing for transformers to dequantize, nothing said."""
    out = tmp_path / "ign"
    recipe = tmp_path / "ign.yaml"
    data = {"name": "ign", "model": str(source), "output": str(out), "targets": ["Linear"]}
    data |= {"ignore": ["lm_head", "re:.*\\.experts\\..*"], **SCHEMES["nvfp4a16"][0], "calibration": None}
    recipe.write_text(yaml.safe_dump(data))
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    assert transformers_reading(Path(out)) is None
