"""`quantize search` with a `method: gguf` base (search/gguf.py): llama.cpp's tensor types per layer group, bytes
measured in the files llama.cpp writes, sensitivities and tries in llama.cpp. The spec's refusals need nothing; the
search needs llama-cpp-python (`make gguf-env`) and the default model's GGUF (SmolLM2's vocabulary for a tiny Llama
written as a BF16 GGUF by a gguf recipe), and is skipped without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from quantize import records
from quantize.checkpoint import ggufs
from quantize.cli import main
from quantize.errors import UsageError
from quantize.search.spec import SearchRecipe

from conftest import make_tiny_llama, tiny_gate


def spec_of(**over) -> SearchRecipe:
    doc = {
        "base": {"method": "gguf", "type": "Q4_K_M"},
        "options": ["q4_k", "Q8_0", "keep"],
        "budget": 8,
        "policy": "p",
    }
    return SearchRecipe.model_validate(doc | over)


@pytest.mark.parametrize(
    "over,says",
    [
        ({"options": ["Q8_0", "keep"]}, "base type Q4_K_M gives its tensors Q4_K, which must be one of the options"),
        ({"options": ["Q4_K", "W8A16"]}, "options of a `method: gguf` base are llama.cpp's tensor types"),
        ({"base": {"method": "gguf", "type": "Q4_K_M", "tensor_types": {"ffn": "Q8_0"}}}, "base.tensor_types"),
        ({"options": ["Q4_K", "q4_k"]}, "options repeat a choice"),
        # llama.cpp applies per-tensor types only in a quantized file type (a review: an F16 base ignored them)
        ({"base": {"method": "gguf", "type": "F16"}, "options": ["F16", "Q8_0"]}, "base type F16 is a float file"),
        # and writes these types only with an importance matrix, which needs the base's calibration
        ({"options": ["Q4_K", "IQ2_XXS", "keep"]}, "options ['IQ2_XXS']: llama.cpp quantizes a tensor"),
    ],
)
def test_a_gguf_base_takes_tensor_types_as_options(over, says):
    assert spec_of().options == ["Q4_K", "Q8_0", "keep"]
    with pytest.raises(ValueError, match="validation error") as e:
        spec_of(**over)
    assert says in str(e.value)


def test_a_gguf_base_may_take_a_calibration_for_its_importance_matrix():
    spec = spec_of(base={"method": "gguf", "type": "Q4_K_M", "calibration": {"samples": 4}})
    assert spec.base.calibration is not None and spec.base.calibration.samples == 4


def test_an_int_base_still_refuses_gguf_types():
    with pytest.raises(ValueError, match="options must be weight-only int schemes"):
        spec_of(base={"method": "rtn", "scheme": "W4A16", "calibration": None}, options=["W4A16", "Q8_0"])


# --- in llama.cpp -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2):
    """A tiny Llama (hidden 256: whole K-quant blocks) with SmolLM2's tokenizer, its weights scaled so that its
    logits move, written as a BF16 GGUF; a small golden set and a policy."""
    pytest.importorskip("llama_cpp")
    import torch
    from gguf_models import smollm2_tokenizer_files
    from safetensors.torch import load_file, save_file

    base = tmp_path_factory.mktemp("gguf-search")
    folder = make_tiny_llama(base / "hf", vocab_size=49152, hidden_size=256, intermediate_size=512, head_dim=64)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            f.unlink()
    smollm2_tokenizer_files(smollm2, folder)
    tensors = load_file(folder / "model.safetensors")
    for k, v in tensors.items():
        if k.endswith(("proj.weight", "embed_tokens.weight")):
            tensors[k] = (v.float() * 10).to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    recipe = base / "bf16.yaml"
    recipe.write_text(
        yaml.safe_dump({"method": "gguf", "type": "BF16", "model": str(folder), "output": str(base / "g")})
    )
    assert main(["run", str(recipe), "--quiet"]) == 0
    _, policy = tiny_gate(base)
    return base / "g" / "model.gguf", policy


CAL = {"source": "builtin:jargon", "samples": 4, "seq_len": 64, "seed": 0}


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))


def search_file(tmp_path: Path, model: Path, policy: Path, **over) -> Path:
    doc = {
        "model": str(model),
        "base": {"method": "gguf", "type": "Q4_K_M"},
        "options": ["Q4_K", "Q8_0", "keep"],
        "budget": 10.0,
        "policy": str(policy),
        "measure": {"per_task": 2, "holdout_per_task": 2, "top_k": 5, "random_allocations": 1},
        "max_gates": 1,
        "output": str(tmp_path / "out"),
    } | over
    path = tmp_path / "search.yaml"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("calibration", [None, "imatrix"])
def test_each_layer_group_is_measured_alone_and_the_result_has_the_bytes_it_was_chosen_for(
    world, tmp_path, capsys, calibration
):
    """With a base calibration, the same, every file quantized with its importance matrix and the tries too."""
    gguf, policy = world
    base = {"method": "gguf", "type": "Q4_K_M"} | ({"calibration": CAL} if calibration else {})
    spec = search_file(tmp_path, gguf, policy, base=base)
    assert main(["search", str(spec), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    report = records.read(records.SearchReport, out / "search.json")
    assert [u.name for u in report.units] == ["blk.0.attn", "blk.0.ffn", "blk.1.attn", "blk.1.ffn"]
    for u in report.units:  # quantizing a group moves the output; the finer type less; keep not at all
        assert u.kl["keep"] == 0.0 and 0 < u.kl["Q8_0"] < u.kl["Q4_K"], u
    [gated] = [t for t in report.tries if t.verdict is not None]
    left = {t.note for t in report.tries if not t.gated}  # the largest passed; max_gates 1 stopped it there
    assert left == {"not gated: max_gates (1) were spent before the bisection reached it"}
    assert gated.true_bytes == gated.allocation.bytes  # the measured layout is the written file's
    types = {t.name: t.ggml_type for t in ggufs.read_header(out / "model.gguf").tensors if len(t.dims) == 2}
    keep = {t.name: t.ggml_type for t in ggufs.read_header(gguf).tensors}
    for unit, option in gated.allocation.allocation.items():
        grouped = [n for n in types if n.startswith(unit + "_")]
        assert grouped and {types[n] for n in grouped} == {keep[grouped[0]] if option == "keep" else option}
    run = records.read(records.RunRecord, out / "quantize.json")
    assert run.search is not None and run.engine.gguf is not None and run.engine.gguf.ftype.endswith("Q4_K_M")
    assert (run.engine.gguf.imatrix is not None) == bool(calibration)
    assert not list(tmp_path.glob(".out.gguf-search*"))  # the scratch folder went with the search


def test_the_sensitivity_file_holds_one_group_at_its_option_and_every_other_weight_at_16_bits(world, tmp_path):
    from quantize.search.gguf import Files

    gguf, _ = world
    files = Files(gguf, tmp_path, 2, "Q4_K_M", "block-part")
    assert [t.name for t in files.groups["blk.1.ffn"]] == [f"blk.1.ffn_{p}.weight" for p in ("down", "gate", "up")]
    alone = {t.name: t.ggml_type for t in ggufs.read_header(files.write({"blk.1.ffn": "Q8_0"}, alone=True)).tensors}
    assert {alone[f"blk.1.ffn_{p}.weight"] for p in ("down", "gate", "up")} == {"Q8_0"}
    others = [n for n in alone if n.endswith(".weight") and "norm" not in n and not n.startswith("blk.1.ffn_")]
    assert others and {alone[n] for n in others} == {"BF16"}
    mixed = {t.name: t.ggml_type for t in ggufs.read_header(files.write({"blk.1.ffn": "Q8_0"})).tensors}
    assert mixed["blk.1.ffn_down.weight"] == "Q8_0" and mixed["blk.0.ffn_up.weight"] != "BF16"  # the file type's


def test_with_a_calibration_every_file_is_quantized_with_the_importance_matrix_the_tries_compute(world, tmp_path):
    """A base with `calibration:`: the search's files are quantized with the importance matrix llama.cpp computes
    on the 16-bit GGUF from it (a group's Q4_K bytes differ from those written without one), the very matrix each
    try, a gguf recipe with that calibration, computes for itself (its record's digest)."""
    from gguf import GGUFReader

    from quantize.convert.backends.llamacpp import importance_matrix
    from quantize.convert.recipe import Calibration
    from quantize.search.gguf import Files

    gguf, _ = world
    matrix = importance_matrix(gguf, Calibration.model_validate(CAL), 2)
    (tmp_path / "plain").mkdir(), (tmp_path / "weighed").mkdir()
    plain = Files(gguf, tmp_path / "plain", 2, "Q4_K_M", "block-part")
    weighed = Files(gguf, tmp_path / "weighed", 2, "Q4_K_M", "block-part", matrix)
    a, b = plain.write({"blk.1.ffn": "Q4_K"}, alone=True), weighed.write({"blk.1.ffn": "Q4_K"}, alone=True)
    assert ggufs.read_header(a).tensors == ggufs.read_header(b).tensors  # the same types and shapes
    da, db = ({t.name: t.data.tobytes() for t in GGUFReader(p).tensors} for p in (a, b))
    assert all(da[f"blk.1.ffn_{p}.weight"] != db[f"blk.1.ffn_{p}.weight"] for p in ("down", "gate", "up"))
    assert da["blk.0.ffn_down.weight"] == db["blk.0.ffn_down.weight"]  # kept at 16 bits in both
    recipe = tmp_path / "try.yaml"
    doc = {"method": "gguf", "type": "Q4_K_M", "model": str(gguf), "output": str(tmp_path / "t"), "calibration": CAL}
    recipe.write_text(yaml.safe_dump(doc))
    assert main(["run", str(recipe), "--quiet"]) == 0
    run = records.read(records.RunRecord, tmp_path / "t" / "quantize.json")
    assert run.engine.gguf is not None and run.engine.gguf.imatrix is not None
    assert run.engine.gguf.imatrix.values_sha256 == matrix.record("x").values_sha256


def test_an_option_llama_cpp_does_not_write_is_exit_2_before_anything_is_quantized(world, tmp_path, capsys):
    gguf, policy = world
    assert main(["search", str(search_file(tmp_path, gguf, policy, options=["Q4_K", "Q9_9", "keep"]))]) == 2
    err = capsys.readouterr().err
    assert "options: Q9_9 is no tensor type llama.cpp writes" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_budget_below_the_smallest_measured_model_is_exit_2_and_leaves_no_scratch(world, tmp_path, capsys):
    gguf, policy = world
    assert main(["search", str(search_file(tmp_path, gguf, policy, budget=2.0))]) == 2
    err = capsys.readouterr().err
    assert "below the smallest model these options make" in err and not list(tmp_path.glob(".out*"))


def test_a_leftover_scratch_folder_is_named(world, tmp_path):
    from quantize.search.gguf import workspace

    (tmp_path / ".out.gguf-search").mkdir()
    with pytest.raises(UsageError, match="a search killed before it cleaned up"), workspace(tmp_path / "out"):
        pass
