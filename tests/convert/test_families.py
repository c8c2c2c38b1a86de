"""The shipped recipes on tiny seeded models of the dense families people quantize (tests/families.py: Llama,
Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, Phi-3), built from transformers' config classes: each converts, its
checkpoint reloads in plain transformers with finite logits, and its quantized linears carry the format's bits
per weight. The fast test runs one data-free recipe per family; the whole matrix is `slow`
(benchmarks/families.py writes the same matrix, MoE families included, as a table: docs/families.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from families import DENSE, build

from quantize import records
from quantize.checkpoint.accounting import bits_report
from quantize.cli import main
from quantize.convert.recipe import FILE_METHODS
from quantize.records import RunRecord

from conftest import ROOT

# bits per weight of the quantized linears, (above, at most): every linear of these models has 128 or 256 input
# features and 128 to 512 outputs, so each format's scales cost what the format says (recipes/*.yaml)
LINEAR_BITS = {
    "fp8-e4m3": (8.0, 8.125),  # E4M3 + one bf16 scale per output row (16 / 128 input features at most)
    "fp8-kv": (8.0, 8.125),  # the same weights; the KV scales are not weights
    "fp8-e4m3-static": (8.0, 8.126),  # + one input scale per tensor
    "smoothquant-w8a8": (8.0, 8.125),  # int8 + one scale per output row
    "fp8-block": (8.0, 8.002),  # one bf16 scale per 128 × 128 block (8.001)
    "w4afp8": (8.0, 8.126),  # int4 stored one a byte (compressed-tensors' int-quantized) + a scale per 128
    "gptq-w4a16-g128": (4.0, 4.14),  # int4 + a bf16 scale per 128, symmetric (+ each layer's int weight_shape)
    "awq-g128": (4.0, 4.25),  # + a zero point per 128 (asymmetric)
    "nvfp4a16": (4.5, 4.51),  # E2M1 + an E4M3 scale per 16 + one FP32 global scale per tensor
    "gptq-nvfp4a16": (4.5, 4.51),
    "nvfp4": (4.5, 4.52),  # + the activations' global scale
    "mxfp4a16": (4.24, 4.25),  # E2M1 + an E8M0 scale per 32: 4.25 exactly (no global scale)
    "mxfp4": (4.24, 4.25),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: build(f, root / f) for f in DENSE}


def convert(tmp_path: Path, source: Path, recipe: str, capsys) -> tuple[Path, RunRecord]:
    """The shipped recipe, pointed at `source`; its output folder and quantize.json."""
    data = yaml.safe_load((ROOT / "recipes" / f"{recipe}.yaml").read_text())
    out = tmp_path / recipe
    path = tmp_path / f"{recipe}.yaml"
    path.write_text(yaml.safe_dump(data | {"model": str(source), "output": str(out)}))
    assert main(["run", str(path), "--quiet"]) == 0, capsys.readouterr().err
    return out, records.read(RunRecord, out / "quantize.json")


def check(out: Path, meta: RunRecord, source: Path, recipe: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import meta_model

    # every linear of the decoder is quantized (lm_head is ignored by the recipes that say so, kept by the format
    # otherwise); none was left at 16 bits
    linears = [n for n, m in meta_model(source, False).named_modules() if isinstance(m, torch.nn.Linear)]
    decoder = [n for n in linears if n != "lm_head"]
    assert meta.layer_plan.quantized_layers in (len(decoder), len(linears))
    assert meta.layer_plan.kept_16bit == {}
    lo, hi = LINEAR_BITS[recipe]
    report = bits_report(out)
    assert lo < report.quantized_linear_bits_per_weight <= hi, report.quantized_linear_bits_per_weight
    assert meta.bits.bits_per_weight == pytest.approx(8 * report.total_bytes / bits_report(source).parameters)
    # the run's own reload check, and an independent reload in plain transformers
    assert [c.finite for c in meta.finite_checks] == [True]
    model = AutoModelForCausalLM.from_pretrained(str(out))
    logits = model(input_ids=torch.tensor([[1, 5, 9, 2, 7]])).logits
    assert logits.shape[-1] == 256 and torch.isfinite(logits).all()


@pytest.mark.parametrize("family", list(DENSE))
def test_each_dense_family_converts_with_fp8_and_reloads(tmp_path, sources, capsys, family):
    out, meta = convert(tmp_path, sources[family], "fp8-e4m3", capsys)
    check(out, meta, sources[family], "fp8-e4m3")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(LINEAR_BITS))
@pytest.mark.parametrize("family", list(DENSE))
def test_every_shipped_recipe_on_every_dense_family(tmp_path, sources, capsys, family, recipe):
    if (family, recipe) in REFUSED:  # exit 2 before loading, by design (docs/families.md)
        data = yaml.safe_load((ROOT / "recipes" / f"{recipe}.yaml").read_text())
        path = tmp_path / f"{recipe}.yaml"
        path.write_text(yaml.safe_dump(data | {"model": str(sources[family]), "output": str(tmp_path / recipe)}))
        assert main(["run", str(path), "--quiet"]) == 2
        assert REFUSED[(family, recipe)] in capsys.readouterr().err
        return
    out, meta = convert(tmp_path, sources[family], recipe, capsys)
    check(out, meta, sources[family], recipe)


# (family, recipe) refused before loading: llm-compressor 0.14's SmoothQuant mapping for Gemma 2 and 3 smooths a norm
# into linears that do not read it (docs/families.md, "Methods that cannot apply to a family")
REFUSED = {
    ("gemma2", "smoothquant-w8a8"): "SmoothQuant mapping for Gemma2ForCausalLM does not fit this model",
    ("gemma3_text", "smoothquant-w8a8"): "SmoothQuant mapping for Gemma3ForCausalLM does not fit this model",
}


def test_the_matrix_covers_every_shipped_recipe():
    """A recipe added to recipes/ joins the matrix (or says here why it cannot run in the core environment)."""
    other_env = {"gptqmodel-w4a16-g64"}  # needs the GPTQ environment (make gptq-env)
    # a GGUF recipe converts a GGUF, not a safetensors family (tests/convert/test_gguf_recipes.py)
    gguf = {m.value for m in FILE_METHODS}
    shipped = {
        p.stem
        for p in (ROOT / "recipes").glob("*.yaml")
        if "base" not in (data := yaml.safe_load(p.read_text())) and data.get("method") not in gguf
    }
    assert shipped - other_env == set(LINEAR_BITS)
