"""Slow: every shipped recipe converts the embedded default model (SmolLM2-135M-Instruct).

Calibration is shrunk (4 × 64 tokens, a 3-point AWQ grid) so the target stays practical; the
full-size conversions are measured by benchmarks/recipes_default_model.py. Run with `make test-slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from quantize.cli import main
from quantize.models import default_model_dir

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.yaml"))
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def default_model():
    if not (default_model_dir() / "weights.sha256").is_file():
        pytest.fail("the default model is not prepared: run `make model`")


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_shipped_recipe_converts_default_model(tmp_path, recipe, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    data = yaml.safe_load(recipe.read_text())
    data["output"] = str(tmp_path / recipe.stem)
    if data.get("calibration"):
        data["calibration"].update(samples=4, seq_len=64)
    if data["method"] == "awq":
        data["awq_grid"] = 3
    small = tmp_path / recipe.name
    small.write_text(yaml.safe_dump(data))
    assert main(["run", str(small), "--quiet"]) == 0, capsys.readouterr().err
    meta = json.loads((tmp_path / recipe.stem / "quantize.json").read_text())
    assert meta["source_model"]["parameters"] == 134_515_008
    assert 4 < meta["bits"]["bits_per_weight"] < 16
    if data["method"] in ("gptq", "awq"):
        # 576 input features: group 64 for q/k/v/o/gate/up, 128 for down_proj (1536)
        assert meta["layer_plan"]["by_group_size"] == {"128": 30, "64": 180}
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / recipe.stem))
    logits = model(input_ids=torch.tensor([[1, 504, 3458, 314, 260]])).logits
    assert torch.isfinite(logits).all()
