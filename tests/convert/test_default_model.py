"""Slow: every shipped recipe converts the embedded default model (SmolLM2-135M-Instruct).

Calibration is shrunk (4 × 64 tokens, a 3-point AWQ grid) so the target stays practical; the
full-size conversions are measured by benchmarks/recipes_default_model.py. Run with `make test-slow`.
"""

from __future__ import annotations

import pytest
import yaml

from quantize import records
from quantize.checkpoint.loader import default_model_dir
from quantize.cli import main
from quantize.convert.recipe import FILE_METHODS
from quantize.records import RunRecord

from conftest import ROOT

# the conversion recipes that transformers reloads (a search recipe, with `base:`, is `quantize search`'s; test_search
# covers it; a GGUF recipe writes a file llama.cpp reads: tests/convert/test_gguf_recipes.py)
GGUF = {m.value for m in FILE_METHODS}
RECIPES = sorted(
    p
    for p in (ROOT / "recipes").glob("*.yaml")
    if "base" not in (data := yaml.safe_load(p.read_text())) and data.get("method") not in GGUF
)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def default_model():
    if not (default_model_dir() / "weights.sha256").is_file():
        pytest.fail("the default model is not prepared: run `make model`")


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_shipped_recipe_converts_default_model(tmp_path, recipe, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.files import missing_packages
    from quantize.convert.backends import backend_named

    data = yaml.safe_load(recipe.read_text())
    if missing := missing_packages(backend_named(data.get("backend", "llmcompressor")).packages):
        pytest.skip(f"backend {data['backend']} needs {', '.join(missing)}: run it in .venv-gptq (make gptq-env)")
    data["output"] = str(tmp_path / recipe.stem)
    if data.get("calibration"):
        data["calibration"].update(samples=4, seq_len=64)
    if data["method"] == "awq":
        data["awq_grid"] = 3
    small = tmp_path / recipe.name
    small.write_text(yaml.safe_dump(data))
    assert main(["run", str(small), "--quiet"]) == 0, capsys.readouterr().err
    meta = records.read(RunRecord, tmp_path / recipe.stem / "quantize.json")
    assert meta.source_model.parameters == 134_515_008
    assert 4 < meta.bits.bits_per_weight < 16
    if data["method"] in ("gptq", "awq") and data.get("group_size") == 128:  # the FP4 forms fix their own groups
        # 576 input features: group 64 for q/k/v/o/gate/up, 128 for down_proj (1536)
        assert meta.layer_plan.by_group_size == {"128": 30, "64": 180}
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / recipe.stem))
    logits = model(input_ids=torch.tensor([[1, 504, 3458, 314, 260]])).logits
    assert torch.isfinite(logits).all()


def test_gate_on_default_model_rejects_3bit_rtn_and_passes_a_a(tmp_path, capsys, monkeypatch):
    """A planted regression (3-bit round-to-nearest) is rejected with evidence; the baseline against itself passes.
    Scores only core_prose and core_kv (a few minutes); agreement on 40 items per task."""
    base = str(default_model_dir())
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))  # scores and agreement start cold
    root = ROOT
    (tmp_path / "w3.yaml").write_text(
        (root / "benchmarks" / "references" / "rtn-w3a16-g128.yaml")
        .read_text()
        .replace("output: outputs/references/rtn-w3a16-g128", f"output: {tmp_path / 'w3'}\nmodel: {base}")
    )
    assert main(["run", str(tmp_path / "w3.yaml"), "--quiet"]) == 0
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"golden: {root / 'golden' / 'core' / 'v1'}\ntasks: [core_prose, core_kv]\nbatch_size: 16\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_kv, metric: acc, margin: 0.1}}\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.1}\n  - {agreement: kl, max: 0.1}\n"
    )
    capsys.readouterr()
    assert main(["gate", str(policy), "--baseline", base, "--candidate", str(tmp_path / "w3")]) == 1
    out = capsys.readouterr().out
    assert "REJECTED" in out and "[  REGRESSION] agreement kl" in out and "provenance:" in out
    assert main(["gate", str(policy), "--baseline", base, "--candidate", base]) == 0
    assert "PASS" in capsys.readouterr().out
