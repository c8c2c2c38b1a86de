"""Checkpoints other tools wrote: GPTQModel's GPTQ and AWQ (GEMM) output (tests/data/gptqmodel-tiny and
gptqmodel-awq-tiny, made by tests/data/make_gptqmodel_fixture.py), AutoGPTQ 0.7.1's output (tests/data/autogptq-tiny,
made by tests/data/make_autogptq_fixture.py: legacy file name, an untied lm_head copy, zero biases), AutoAWQ
0.2.9's output (tests/data/autoawq-tiny: `benchmarks/autoawq_cost.py /tmp/tiny-512 --save tests/data/autoawq-tiny`
in AutoAWQ's environment, from the same tiny model as tests/data/make_autogptq_fixture.py builds), and the
pre-integration layout (the bit width only in quantize_config.json), derived from GPTQModel's here. All four were
quantized from the same tiny seeded model, which the gate tests rebuild as their baseline.

Without the GPTQ loader packages (the core environment): exact bytes from the headers, an exit-2 message naming
what to install, the view transformers loads a legacy layout through. With them (`make test-gptq` runs these in
.venv-gptq): the checkpoint reloads, scores on the smoke suite and is gated against the source it was made from.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from quantize.checkpoint.files import identity_sha256, loadable_view, side_quantization_config
from quantize.cli import main

from conftest import DATA

FIXTURE = DATA / "gptqmodel-tiny"
AWQ = DATA / "gptqmodel-awq-tiny"
AUTOGPTQ = DATA / "autogptq-tiny"
AUTOAWQ = DATA / "autoawq-tiny"
# fixture -> (format inspect names, the weight file, the tensors of a quantized linear)
FOREIGN = {
    FIXTURE: ("gptq", "model.safetensors", ("qweight", "qzeros", "scales", "g_idx")),
    AWQ: ("awq", "model.safetensors", ("qweight", "qzeros", "scales")),
    AUTOGPTQ: ("gptq", "gptq_model-4bit-64g.safetensors", ("qweight", "qzeros", "scales", "g_idx")),
    AUTOAWQ: ("awq", "model.safetensors", ("qweight", "qzeros", "scales")),
}
HAVE_GPTQ = all(importlib.util.find_spec(m) for m in ("gptqmodel", "optimum"))


def legacy(tmp_path: Path) -> Path:
    """The fixture as AutoGPTQ lays a checkpoint out: no quantization_config in config.json, the settings in
    quantize_config.json, the weights in gptq_model-4bit-64g.safetensors."""
    out = tmp_path / "legacy"
    shutil.copytree(FIXTURE, out)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["quantization_config"]
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "model.safetensors").rename(out / "gptq_model-4bit-64g.safetensors")
    return out


@pytest.mark.parametrize("ckpt", list(FOREIGN), ids=lambda p: p.name)
def test_inspect_counts_foreign_bytes_exactly(capsys, ckpt):
    """Against the safetensors library's own reading of the same file: every tensor's bytes, and the quantized
    linears' bits per weight over their unpacked weights (GPTQ qweight int32 (in/8, out), AWQ's GEMM qweight
    (in, out/8): 8 weights a word either way; AutoGPTQ's zero biases are no quantized weight)."""
    from safetensors import safe_open

    fmt, weights, quant_tensors = FOREIGN[ckpt]
    assert main(["inspect", str(ckpt), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    total = quant_bytes = quant_params = 0
    with safe_open(ckpt / weights, "pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
            t = f.get_tensor(name)
            nbytes = t.numel() * t.element_size()
            total += nbytes
            if name.rsplit(".", 1)[-1] in quant_tensors:
                quant_bytes += nbytes
            if name.endswith(".qweight"):
                quant_params += t.shape[0] * 8 * t.shape[1]
    assert got["format"] == fmt and got["total_bytes"] == total
    assert got["quantized_linear_parameters"] == quant_params == 245_760  # 2 layers × (q, k, v, o, gate, up, down)
    assert got["quantized_linear_bits_per_weight"] == pytest.approx(8 * quant_bytes / quant_params)


def test_inspect_calls_out_an_untied_lm_head_copy(capsys):
    """AutoGPTQ stores lm_head although config.json ties it to the embeddings: the copy counts in the bytes, and
    bits per source parameter divide them by the source model's parameters (the copy's left out)."""
    assert main(["inspect", str(AUTOGPTQ), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    head = 512 * 128  # vocab × hidden of the tiny model
    assert got["tied_copy_parameters"] == head and got["bytes_by_role"]["lm_head"] == 2 * head  # float16
    assert got["bits_per_source_parameter"] == pytest.approx(8 * got["total_bytes"] / (got["parameters"] - head))
    assert any("lm_head is stored too" in n for n in got["notes"])
    assert main(["inspect", str(FIXTURE), "--json"]) == 0  # GPTQModel keeps the tie: nothing to call out
    assert json.loads(capsys.readouterr().out)["bits_per_source_parameter"] is None


def test_inspect_reads_the_bit_width_of_a_legacy_layout(tmp_path, capsys):
    assert main(["inspect", str(legacy(tmp_path)), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["format"] == "gptq (quantize_config.json)"
    assert got["quantized_linear_bits_per_weight"] == pytest.approx(4.5625)


@pytest.mark.skipif(HAVE_GPTQ, reason="the GPTQ loader packages are installed here")
@pytest.mark.parametrize("layout", ["integrated", "legacy", "autogptq", "awq", "autoawq"])
def test_scoring_without_the_loader_packages_is_exit_2_naming_them(tmp_path, capsys, layout):
    ckpt = {"integrated": FIXTURE, "autogptq": AUTOGPTQ, "awq": AWQ, "autoawq": AUTOAWQ}.get(layout) or legacy(tmp_path)
    code = main(["eval", "evaluate/core.yaml", str(ckpt)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "gptqmodel" in err and "make gptq-env" in err
    assert ("optimum" in err) == ("awq" not in layout)  # transformers loads AWQ through gptqmodel alone
    assert ("quantize_config.json" in err) == (layout == "legacy")


def test_a_legacy_layout_loads_through_a_view(tmp_path):
    """The view holds what transformers reads: config.json with the side file's settings as quantization_config,
    the legacy weight file as model.safetensors; the checkpoint is untouched and the view goes away."""
    ckpt = legacy(tmp_path)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    with loadable_view(ckpt) as view:
        assert view != ckpt
        cfg = json.loads((view / "config.json").read_text())
        assert cfg["quantization_config"]["bits"] == 4 and cfg["quantization_config"]["quant_method"] == "gptq"
        assert (view / "model.safetensors").resolve() == (ckpt / "gptq_model-4bit-64g.safetensors").resolve()
        assert (view / "tokenizer.json").is_file()
    assert not view.exists() and {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    with loadable_view(FIXTURE) as view:  # an integrated layout is loaded as it is
        assert view == FIXTURE


def test_autoawq_side_settings_become_transformers_awq_config(tmp_path):
    d = tmp_path / "awq"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "quant_config.json").write_text(
        json.dumps({"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"})
    )
    name, qc = side_quantization_config(d)
    assert name == "quant_config.json"
    assert qc == {"zero_point": True, "group_size": 128, "bits": 4, "version": "gemm", "quant_method": "awq"}


def test_the_side_file_is_part_of_the_identity(tmp_path):
    ckpt = legacy(tmp_path)
    before = identity_sha256(ckpt)
    qc = json.loads((ckpt / "quantize_config.json").read_text())
    (ckpt / "quantize_config.json").write_text(json.dumps({**qc, "group_size": 128}))
    assert identity_sha256(ckpt) != before  # other settings, other computation: not the same cached scores


# --- with the GPTQ loader packages (.venv-gptq) ---------------------------------------------------------------

gptq = pytest.mark.skipif(not HAVE_GPTQ, reason="needs optimum and gptqmodel: make gptq-env, then make test-gptq")


@pytest.fixture
def small_suite(tmp_path, monkeypatch):
    from conftest import small_golden, suite_file

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
    return suite_file(tmp_path / "suite.yaml", small_golden(tmp_path))


def _gate(tmp_path: Path, suite: Path, baseline: Path, candidate: Path, capsys):
    """`quantize gate` with loose limits (a 4-bit tiny model is far from its source): exit code and verdict."""
    from quantize.records import Verdict, parse

    policy = tmp_path / "gate.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 2.0}\n  - {agreement: kl, max: 0.5}\n"
    )
    code = main(["gate", str(policy), "--baseline", str(baseline), "--candidate", str(candidate), "--json"])
    return code, parse(Verdict, json.loads(capsys.readouterr().out), "stdout")


@gptq
def test_both_layouts_score_the_same(tmp_path, small_suite, capsys):
    from quantize.records import ScoreDoc, parse

    docs = []
    for ckpt in (FIXTURE, legacy(tmp_path)):
        assert main(["eval", str(small_suite), str(ckpt), "--json", "--items"]) == 0
        docs.append(parse(ScoreDoc, json.loads(capsys.readouterr().out), "stdout"))
    a, b = ({t: [(i.id, i.score, round(i.ll, 4)) for i in ts.items] for t, ts in d.tasks.items()} for d in docs)
    assert a == b and sum(len(v) for v in a.values()) == 24 + 12 + 6 + 9 + 4


@gptq
@pytest.mark.parametrize("ckpt", list(FOREIGN), ids=lambda p: p.name)
def test_a_foreign_checkpoint_is_gated_against_its_source(tmp_path, small_suite, capsys, ckpt):
    from conftest import make_tiny_llama

    source = make_tiny_llama(tmp_path / "source", seed=0, vocab_size=512)  # what the fixtures were quantized from
    code, v = _gate(tmp_path, small_suite, source, ckpt, capsys)
    assert code == v.exit_code and v.provenance.candidate.checkpoint.identity_sha256 == identity_sha256(ckpt)
    kl = next(r for r in v.rules if r.rule == "agreement kl").evidence
    ppl = next(r for r in v.rules if r.rule == "core_prose perplexity").evidence
    assert kl.value > 0 and ppl.ratio != 1.0  # 4-bit weights: the candidate is not its source


# --- producing GPTQModel's format: `backend: gptqmodel` ----------------------------------------------------------


def _recipe(tmp_path: Path, source: Path, body: str) -> Path:
    r = tmp_path / "r.yaml"
    r.write_text(
        f"model: {source}\nbackend: gptqmodel\n{body}\n"
        "calibration: {source: builtin:jargon, samples: 8, seq_len: 64}\n"
        f"output: {tmp_path / 'out'}\n"
    )
    return r


@pytest.mark.parametrize(
    "body,why",
    [
        ("method: awq\nscheme: W8A16\ngroup_size: 64", "does not run method awq with scheme W8A16"),
        ("method: awq\nscheme: W4A16\ngroup_size: 64\nawq_grid: 10", "fixed grid of 20 points"),
        ("method: awq\nscheme: W4A16\ngroup_size: 64\ndtype: float32", "dtype float32 cannot be used"),
        ("method: gptq\nscheme: W8A8", "does not run method gptq with scheme W8A8"),
        ("method: gptq\nscheme: W4A16\nignore: [lm_head, 're:.*down_proj']", "remove targets, ignore and overrides"),
    ],
)
def test_what_gptqmodel_does_not_run_is_exit_2_before_any_load(tmp_path, capsys, body, why):
    code = main(["run", str(_recipe(tmp_path, tmp_path / "nowhere", body))])
    err = capsys.readouterr().err
    assert code == 2 and why in err and "backend: llmcompressor" in err and "Traceback" not in err


@pytest.mark.parametrize("backend,successor", [("auto-gptq", "gptqmodel"), ("autoawq", "llmcompressor")])
def test_a_retired_backend_is_exit_2_naming_what_writes_its_format(tmp_path, capsys, backend, successor):
    r = _recipe(tmp_path, tmp_path / "nowhere", "method: gptq\nscheme: W4A16\ngroup_size: 64")
    r.write_text(r.read_text().replace("backend: gptqmodel", f"backend: {backend}"))
    code = main(["run", str(r)])
    err = capsys.readouterr().err
    assert code == 2 and "retired upstream" in err and f"backend: {successor}" in err and "Traceback" not in err


@gptq
def test_backend_gptqmodel_writes_awq_in_autoawq_gemm_layout(tmp_path, capsys):
    """GPTQModel's AWQ through a recipe, on a CPU (its default AWQ kernel asks for CUDA): AutoAWQ's GEMM layout,
    4 + 16/64 + 4/64 bits per weight (float16 scale and 4-bit zero point per group of 64), records and card."""
    from quantize import records
    from quantize.records import RunRecord

    from conftest import make_tiny_llama

    source = make_tiny_llama(tmp_path / "source", seed=0, vocab_size=512)
    assert (
        main(["run", str(_recipe(tmp_path, source, "method: awq\nscheme: W4A16\ngroup_size: 64\nsymmetric: false"))])
        == 0
    )
    out = tmp_path / "out"
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.engine.backend == "gptqmodel" and meta.bits.format == "awq"
    assert json.loads((out / "config.json").read_text())["quantization_config"]["zero_point"] is True
    assert meta.bits.quantized_linear_bits_per_weight == pytest.approx(4 + 16 / 64 + 4 / 64)
    assert "AutoAWQ's GEMM" in (out / "README.md").read_text() and all(c.finite for c in meta.finite_checks)


@pytest.mark.skipif(HAVE_GPTQ, reason="the GPTQ packages are installed here")
def test_backend_gptqmodel_without_its_packages_is_exit_2(tmp_path, capsys, tiny_model):
    code = main(["run", str(_recipe(tmp_path, tiny_model, "method: gptq\nscheme: W4A16\ngroup_size: 64"))])
    err = capsys.readouterr().err
    assert code == 2 and "make gptq-env" in err and not (tmp_path / "out").exists()


@gptq
def test_backend_gptqmodel_writes_gptq_with_our_records_and_gates(tmp_path, small_suite, capsys):
    """GPTQModel's GPTQ through a recipe: its native format, quantize.json with true bits read back from the
    stored tensors, a model card, and a checkpoint that scores and gates like any other."""
    from quantize import records
    from quantize.records import RunRecord

    from conftest import make_tiny_llama

    source = make_tiny_llama(tmp_path / "source", seed=0, vocab_size=512)
    recipe = _recipe(tmp_path, source, "method: gptq\nscheme: W4A16\ngroup_size: 64\nsymmetric: false")
    assert main(["run", str(recipe)]) == 0
    out = tmp_path / "out"
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.engine.backend == "gptqmodel" and meta.bits.format == "gptq"
    assert meta.bits.quantized_linear_parameters == 245_760
    assert meta.bits.quantized_linear_bits_per_weight == pytest.approx(4.5625)  # 4 + fp16 scale, 4-bit zero, g_idx
    assert "gptqmodel" in (out / "README.md").read_text() and all(c.finite for c in meta.finite_checks)
    capsys.readouterr()
    code, v = _gate(tmp_path, small_suite, source, out, capsys)
    assert code == v.exit_code and next(r for r in v.rules if r.rule == "agreement kl").evidence.value > 0


@gptq
def test_a_group_that_does_not_divide_every_layer_is_exit_2_before_calibration(tmp_path, capsys):
    """GPTQModel would write those layers' smaller group as a `dynamic` override that transformers cannot load
    (measured: the reload check failed after the whole calibration); refused from the layer plan instead."""
    from conftest import make_tiny_llama

    source = make_tiny_llama(
        tmp_path / "src", seed=0, vocab_size=512, hidden_size=96, intermediate_size=192,
        num_attention_heads=3, num_key_value_heads=1, head_dim=32,
    )  # fmt: skip
    code = main(["run", str(_recipe(tmp_path, source, "method: gptq\nscheme: W4A16\ngroup_size: 64"))])
    err = capsys.readouterr().err
    assert code == 2 and "does not divide" in err and "dynamic" in err and not (tmp_path / "out").exists()


@pytest.mark.skipif(HAVE_GPTQ, reason="the GPTQ loader packages are installed here")
def test_agree_over_a_folder_skips_a_checkpoint_it_cannot_load(tmp_path, capsys, tiny_model, monkeypatch):
    """`make demo` runs `agree` over outputs/: a GPTQModel output there (made in .venv-gptq) is named and skipped,
    not the end of the run; asked for alone, it is exit 2 as before."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
    outs = tmp_path / "outputs"
    outs.mkdir()
    shutil.copytree(FIXTURE, outs / "gptqmodel-tiny")
    shutil.copytree(tiny_model, outs / "same")
    code = main(["agree", "evaluate/core.yaml", str(outs), "--baseline", str(tiny_model), "--json"])
    out = capsys.readouterr()
    assert code == 0 and [r["checkpoint"] for r in json.loads(out.out)] == [str(outs / "same")]
    assert "gptqmodel-tiny: not measured here" in out.err and "make gptq-env" in out.err
    code = main(["agree", "evaluate/core.yaml", str(outs / "gptqmodel-tiny"), "--baseline", str(tiny_model)])
    assert code == 2 and "make gptq-env" in capsys.readouterr().err


@gptq
def test_gptqmodel_compat_assumptions_hold_and_a_broken_one_is_found(monkeypatch):
    """quantize/compat/gptqmodel.py: the versions, defuser's registry and GPTQModel's RoPE initializer as read.
    Fails loudly on an upgrade: read that module, check the new version, then widen CHECKED."""
    from quantize.compat import gptqmodel as compat

    assert compat.problems() == []
    assert compat.defused("phi3") and not compat.defused("llama") and not compat.defused("gemma3_text")
    monkeypatch.setattr(compat, "version", lambda _name: "9.0.0")
    assert any("outside the checked range" in p for p in compat.problems())


@gptq
def test_gptqmodel_converts_gemma3_with_its_own_rope_parameters(tmp_path, capsys):
    """GPTQModel 7.6's RoPE initializer adds keys to Gemma 3's per-layer-type rope_parameters, and its save then
    stopped (exit 3, AttributeError): the source's parameters go back before saving, and the checkpoint reloads."""
    from families import build

    from quantize import records
    from quantize.records import RunRecord

    source = build("gemma3_text", tmp_path / "source")
    assert main(["run", str(_recipe(tmp_path, source, "method: gptq\nscheme: W4A16\ngroup_size: 64"))]) == 0
    out = tmp_path / "out"
    saved, own = (json.loads((d / "config.json").read_text())["rope_parameters"] for d in (out, source))
    assert saved == own and set(saved) == {"full_attention", "sliding_attention"}
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.bits.format == "gptq" and all(c.finite for c in meta.finite_checks)


@gptq
def test_gptqmodel_refuses_a_family_it_writes_defused_before_loading(tmp_path, capsys):
    """Phi-3: GPTQModel writes its fused gate_up_proj as gate_proj and up_proj, which transformers' Phi-3 does not
    load (measured: the reload check refused it, exit 3, after the whole calibration); exit 2 before loading."""
    from families import build

    source = build("phi3", tmp_path / "source")
    code = main(["run", str(_recipe(tmp_path, source, "method: gptq\nscheme: W4A16\ngroup_size: 64"))])
    err = capsys.readouterr().err
    assert code == 2 and "phi3 model" in err and "gate_up_proj" in err and "backend: llmcompressor" in err
    assert not (tmp_path / "out").exists()
