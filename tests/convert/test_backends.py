"""A backend is its class: one registered in the registry alone (here, from this module) is what a recipe is checked
against, what the memory plan, the calibration dtype, the layer plan and the model card read, and what converts,
with no other module of quantize changed; a file-to-file backend (`file_to_file`) likewise, through the engine's
file seam (`source`, `convert_file`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from quantize import records
from quantize.checkpoint import accounting, ggufs
from quantize.cli import main
from quantize.convert import backends, engine
from quantize.convert.backends.base import CalibrationDtype, FileConversion, FileJob
from quantize.convert.backends.llmcompressor import LLMCompressorBackend
from quantize.convert.gguf import layer_plan
from quantize.convert.recipe import Method, Recipe, Scheme
from quantize.errors import UsageError
from quantize.records import EngineRecord, RunRecord


class RoundingBackend(LLMCompressorBackend):
    """llm-compressor's conversion under another name and with other capabilities: 8-bit round-to-nearest weights
    only, symmetric, rounded in float32, nothing streamed, offloaded or linearized, no KV cache."""

    name = "rounding"
    credit = "Rounding"
    card_tags = ("rounding",)
    formats: ClassVar[dict[str, str]] = {"*": "the rounding format"}
    schemes: ClassVar[dict[Method, frozenset[Scheme]] | None] = {Method.rtn: frozenset({Scheme.W8A16})}
    kv_cache: ClassVar[bool] = False
    streams: ClassVar[frozenset[tuple[Method, Scheme]]] = frozenset()
    offloads: ClassVar[bool] = False
    linearizes_experts: ClassVar[bool] = False
    calibration_dtypes: ClassVar[dict[Method, CalibrationDtype]] = {
        Method.rtn: CalibrationDtype(("float32",), "float32", "the rounding backend rounds in float32")
    }

    @classmethod
    def check(cls, recipe: Recipe) -> str | None:
        return None if recipe.symmetric else "backend rounding rounds symmetric weights only: remove symmetric"


@pytest.fixture
def rounding(monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "rounding", RoundingBackend)


def _recipe(tmp_path: Path, model: Path, **fields: Any) -> Path:
    data = {"name": "r", "model": str(model), "output": str(tmp_path / "out"), "backend": "rounding"}
    data |= {"method": "rtn", "scheme": "W8A16", "calibration": None, **fields}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_backend_registered_alone_converts_with_its_own_capabilities(rounding, tmp_path, tiny_model, monkeypatch):
    """The run takes its calibration dtype from the class (float32 for the bf16 tiny model, cast back on save), the
    engine plans layers with the class's `linearizes_experts`, and the record and the card name the backend."""
    planned = []
    plan_layers = engine.plan_layers

    def spy(model, recipe, linearize_experts):
        planned.append(linearize_experts)
        return plan_layers(model, recipe, linearize_experts)

    monkeypatch.setattr(engine, "plan_layers", spy)
    assert main(["run", str(_recipe(tmp_path, tiny_model)), "--quiet"]) == 0
    meta = records.read(RunRecord, tmp_path / "out" / "quantize.json")
    assert meta.engine.backend == "rounding" and planned == [False]
    assert (meta.engine.calibration_dtype, meta.engine.saved_dtype) == ("float32", "bfloat16")
    assert meta.engine.calibration_dtype_reason == "the rounding backend rounds in float32"
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    card = (tmp_path / "out" / "README.md").read_text()
    assert "- rounding" in card and "the rounding format" in card and "Rounding" in card


@pytest.mark.parametrize(
    "fields,why",
    [
        (  # a scheme the registry's other backend runs
            {"scheme": "W4A16", "group_size": 64},
            "backend rounding does not run method rtn with scheme W4A16; it runs method rtn with scheme W8A16. "
            "Use backend: llmcompressor for this method and scheme",
        ),
        ({"symmetric": False}, "backend rounding rounds symmetric weights only"),  # its own check
        (
            {"kv_cache": {"scheme": "FP8"}, "calibration": {"samples": 4, "seq_len": 32}},
            "backend rounding does not quantize the KV cache. Use backend: llmcompressor",
        ),
        ({"streaming": "on"}, "streaming: on, but this recipe cannot stream: backend rounding loads the whole model"),
        ({"offload": "on"}, "offload: on, but this recipe cannot offload its weights: backend rounding loads"),
    ],
)
def test_what_the_class_does_not_offer_is_exit_2_before_any_load(rounding, tmp_path, tiny_model, capsys, fields, why):
    assert main(["run", str(_recipe(tmp_path, tiny_model, **fields))]) == 2
    err = capsys.readouterr().err
    assert why in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_unregistered_backend_is_named_with_the_ones_that_are(tmp_path, tiny_model, capsys):
    assert main(["run", str(_recipe(tmp_path, tiny_model))]) == 2
    assert "backend 'rounding' is not one quantize runs; choose one of: gptqmodel, llamacpp, llmcompressor" in " ".join(
        capsys.readouterr().err.split()
    )


def test_its_missing_packages_are_named_with_where_to_get_them(rounding, tmp_path, tiny_model, capsys, monkeypatch):
    monkeypatch.setattr(RoundingBackend, "packages", ("quantize-no-such-package",))
    monkeypatch.setattr(RoundingBackend, "install", "build .venv-rounding with `make rounding-env`")
    assert main(["run", str(_recipe(tmp_path, tiny_model))]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "backend: rounding needs quantize-no-such-package, and quantize-no-such-package is not installed" in err
    assert "build .venv-rounding with `make rounding-env`" in err


class CopyingBackend:
    """A file-to-file backend that copies its source GGUF as it is: what the engine does around `convert_file`
    (the source's identity, the scratch folder, the accounting from the written file, the record, the card), with no
    llama.cpp."""

    name = "copying"
    packages: tuple[str, ...] = ()
    install = ""
    library = "gguf"
    credit = "Copying"
    card_tags = ("copying",)
    card_library = "gguf"
    formats: ClassVar[dict[str, str]] = {"*": "the source GGUF, copied"}
    load_note: ClassVar[dict[str, str]] = {"*": "Read it with any GGUF reader."}
    schemes: ClassVar[dict[Method, frozenset[Scheme]] | None] = {Method.gguf: frozenset()}
    kv_cache: ClassVar[bool] = False
    streams: ClassVar[frozenset[tuple[Method, Scheme]]] = frozenset()
    offloads: ClassVar[bool] = False
    linearizes_experts: ClassVar[bool] = False
    calibration_dtypes: ClassVar[dict[Method, CalibrationDtype]] = {}
    file_to_file: ClassVar[bool] = True

    @classmethod
    def check(cls, recipe: Recipe) -> str | None:
        return None

    @classmethod
    def source(cls, recipe: Recipe) -> Path:
        return Path(recipe.model)

    def convert_file(self, job: FileJob) -> FileConversion:
        with job.phases("copy"):
            shutil.copyfile(job.source, job.folder / "model.gguf")
            (job.scratch / "left.gguf").write_bytes(b"GGUF")  # the engine removes the scratch folder
        plan = layer_plan(ggufs.read_header(job.folder / "model.gguf"), job.recipe.type)
        engine_record = EngineRecord(backend=self.name, modifiers="copy", calibration_dtype="none", saved_dtype="gguf")
        return FileConversion(job.recipe.type, engine_record, plan, [], {})


def test_a_file_to_file_backend_registered_alone_converts_through_the_engines_file_seam(tmp_path, monkeypatch):
    from quantize.checkpoint.loader import find_gguf

    try:
        source = find_gguf()
    except UsageError as e:
        pytest.skip(f"the default model's GGUF is not installed: {e}")
    monkeypatch.setitem(backends.BACKENDS, "copying", CopyingBackend)
    assert backends.runs(CopyingBackend, Method.gguf, None) and not backends.runs(CopyingBackend, Method.rtn, None)
    data = {"method": "gguf", "backend": "copying", "type": "Q4_1", "model": str(source), "output": str(tmp_path / "o")}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    assert main(["run", str(tmp_path / "r.yaml"), "--quiet"]) == 0
    meta = records.read(RunRecord, tmp_path / "o" / "quantize.json")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["README.md", "model.gguf", "quantize.json"]
    assert meta.engine.backend == "copying" and meta.scheme == "Q4_1" and meta.memory_plan is None
    assert meta.bits.bits_per_weight == accounting.bits_report(source).bits_per_weight  # the same tensors
    assert meta.source_model.parameters == 134_515_008 and "copy" in meta.time_seconds
    card = (tmp_path / "o" / "README.md").read_text()
    assert "library_name: gguf" in card and "Copying" in card and "Read it with any GGUF reader." in card


@pytest.mark.parametrize(
    "stages,why",
    [
        ({"quant_stage": {"quant_modifiers": {"NoSuchModifier": {"targets": ["Linear"]}}}}, "NoSuchModifier"),
        (
            {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"targets": ["Linear"], "scheme": "NOPE"}}}},
            "scheme",
        ),
        (
            {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"targetz": ["Linear"], "scheme": "W8A16"}}}},
            "targetz",
        ),
        ({"quant_stage": {"quant_modifiers": {}}}, "holds no llm-compressor modifier"),
        ({"quant_stage": 5}, "'quant_stage', which llm-compressor skips"),
        ({"quant": {"quant_modifiers": {"QuantizationModifier": {}}}}, "'quant', which llm-compressor skips"),
        ({"quant_stage": {"quant": {"QuantizationModifier": {}}}}, "'quant_stage.quant', which llm-compressor skips"),
        ({"quant_stage": {"quant_modifiers": {"QuantizationModifier": 3}}}, "llm-compressor rejects"),
    ],
    ids=[
        "unknown-modifier",
        "unknown-scheme",
        "unknown-field",
        "no-modifier",
        "stage-not-a-mapping",
        "stage-name",
        "group-name",
        "modifier-not-a-mapping",
    ],
)
def test_a_verbatim_recipe_llm_compressor_rejects_is_exit_2_before_the_load(
    tmp_path, tiny_model, capsys, monkeypatch, stages, why
):
    """llm-compressor parsed `stages:` only inside oneshot, after the model loaded (exit 2 then); a recipe of no
    modifiers quantized nothing and exited 0."""

    def no_load(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the model loaded before the recipe was checked")

    monkeypatch.setattr(LLMCompressorBackend, "load", no_load)
    cal = {"source": "builtin:jargon", "samples": 2, "seq_len": 16}
    recipe = _recipe(tmp_path, tiny_model, backend="llmcompressor", method="llmcompressor", stages=stages)
    data = yaml.safe_load(recipe.read_text())
    del data["scheme"]
    recipe.write_text(yaml.safe_dump(data | {"calibration": cal}))
    assert main(["run", str(recipe)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert why in err and "`stages:`" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_verbatim_recipe_llm_compressor_parses_is_kept_as_given():
    from quantize.convert.backends.llmcompressor.modifiers import checked_verbatim

    stages = {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"targets": ["Linear"], "scheme": "FP8"}}}}
    assert yaml.safe_load(checked_verbatim(stages)) == stages


def test_llm_compressor_still_skips_the_keys_checked_verbatim_refuses():
    """checked_verbatim restates which keys llm-compressor's Recipe.from_dict reads: if it starts reading a stage
    or group named otherwise, this fails and the refusal must go."""
    from llmcompressor.recipe import Recipe as Parsed

    mod = {"QuantizationModifier": {"targets": ["Linear"], "scheme": "FP8"}}
    assert len(Parsed.create_instance(yaml.safe_dump({"quant_stage": {"quant_modifiers": mod}})).modifiers) == 1
    for skipped in ({"quant": {"quant_modifiers": mod}}, {"quant_stage": {"quant": mod}}):
        assert Parsed.create_instance(yaml.safe_dump(skipped)).modifiers == []
