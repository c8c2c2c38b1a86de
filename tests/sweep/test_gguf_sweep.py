"""`quantize sweep` with a GGUF recipe (issue #58): a local Ray cluster converts the default model's own GGUF with
llama.cpp's quantizer and gates it, scored in llama.cpp, against the prepared default model scored in transformers;
the verdict is the one `quantize gate` gives the same candidate alone. A GGUF recipe runs in a sweep only where
both the recipe's source and the sweep's baseline are the default model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from quantize import records
from quantize.checkpoint.accounting import bits_report
from quantize.cli import main as cli
from quantize.errors import UsageError
from quantize.records import RunRecord, SweepRecord, Verdict
from quantize.sweep.tasks import prepare_recipe

from conftest import small_golden, suite_file

RULES = "rules:\n  - {task: core_facts, metric: acc, margin: 0.5}\n  - {agreement: kl, max: 0.5}\n"
Q8 = "name: q8\nmethod: gguf\nbackend: llamacpp\ntype: Q8_0\n"  # no model: the default model's own GGUF


def test_a_gguf_recipe_of_another_model_than_the_default_is_refused_in_a_sweep(tmp_path, tiny_model, monkeypatch):
    """The sweep's model is compared with the default model's folder before the default model is resolved: where
    it is not prepared, the refusal of another model says so, not that the default model is unprepared (before, a
    review's repro: the sweep's refusal was about `make model`, which would not have let it run)."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "empty-cache"))  # the default model not prepared
    recipe = tmp_path / "q8.yaml"
    recipe.write_text(Q8)
    with pytest.raises(UsageError, match="only where both are the default model .* the sweep's .*tiny"):
        prepare_recipe(str(recipe), str(tiny_model))
    with pytest.raises(UsageError, match="the default model .* is not prepared"):  # the sweep's model the default
        prepare_recipe(str(recipe), None)
    recipe.write_text(Q8 + f"model: {tmp_path / 'other.gguf'}\n")
    with pytest.raises(UsageError, match="this recipe's `model:` is .*other.gguf"):
        prepare_recipe(str(recipe), None)


def test_a_sweep_converts_and_gates_a_gguf_recipe_as_the_gate_does_alone(tmp_path, default_folder, monkeypatch):
    pytest.importorskip("ray", reason="quantize sweep needs Ray: pip install 'quantize[cluster]' (make setup does)")
    pytest.importorskip("llama_cpp", reason="GGUF recipes need llama-cpp-python: make gguf-env")
    from quantize.flows.gate import run_gate

    cache = tmp_path / "cache"  # a cache of this test's own, the default model in it (hard links: no copy)
    shutil.copytree(default_folder, cache / "models" / default_folder.name, copy_function=os.link)
    monkeypatch.setenv("QUANTIZE_CACHE", str(cache))
    suite = suite_file(tmp_path / "suite.yaml", small_golden(tmp_path), extra="tasks: [core_facts]\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"name: p\nsuite: {suite}\n{RULES}")
    recipe = tmp_path / "q8.yaml"
    recipe.write_text(Q8)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(  # the sweep's model named as a path: the default model's folder
        f"name: g\nmodel: {cache / 'models' / default_folder.name}\nrecipes: ['{recipe}']\npolicy: {policy}\n"
        f"output: {tmp_path / 'out'}\ncluster: {{address: local, num_cpus: 2}}\n"
    )
    code = cli(["sweep", str(sweep)])
    rec = records.read(SweepRecord, tmp_path / "out" / "sweep-g" / "sweep.json")
    assert code == 0 == rec.exit_code, [(t.task, t.state) for t in rec.tasks]
    [candidate] = rec.candidates
    assert candidate.name == "q8" and candidate.verdict == "pass"
    folder = Path(candidate.checkpoint)
    run = records.read(RunRecord, folder / "quantize.json")
    gguf = run.engine.gguf
    assert gguf is not None and gguf.ftype.endswith("MOSTLY_Q8_0") and (folder / "model.gguf").is_file()
    got = records.read(Verdict, folder / "gate.json")
    alone = run_gate(policy, default_folder, folder / "model.gguf")
    assert got.verdict == alone.verdict and [r.verdict for r in got.rules] == [r.verdict for r in alone.rules]
    kl = [r.evidence.value for r in got.rules if r.kind == "agreement"]
    assert kl == pytest.approx([r.evidence.value for r in alone.rules if r.kind == "agreement"], rel=1e-6)
    assert 0 < kl[0] < 0.5  # llama.cpp's Q8_0 of the Q4_1 weights against transformers' bfloat16: close, not equal
    # its bits and bytes, read from the GGUF's header as `quantize inspect` reads them, and the report lists it
    # (before, both looked for config.json, which a GGUF's folder does not hold: "-" and a report without it)
    bits = bits_report(folder)
    assert candidate.total_bytes == bits.total_bytes > 0 and candidate.bits_per_weight == bits.bits_per_weight
    assert rec.report is not None
    assert f"| {candidate.name} | gguf | Q8\\_0 |" in (Path(rec.report) / "report.md").read_text()


def test_a_gguf_output_folder_records_the_bits_of_its_header(tmp_path):
    """A `method: gguf` output folder (model.gguf beside its card and quantize.json, no config.json): the sweep
    records its bytes and bits per weight as the gguf package's own reader counts the file's tensors. Before, the
    sweep looked for config.json: no bits ("-" in its table; its report's row: the end-to-end test above)."""
    from gguf import GGUFReader
    from gguf_models import loadable_gguf

    from quantize.sweep import run

    folder = tmp_path / "q"
    folder.mkdir()
    loadable_gguf(folder / "model.gguf", "llama")
    (folder / "README.md").write_text("a card")
    (folder / "quantize.json").write_text("{}")
    tensors = GGUFReader(folder / "model.gguf").tensors
    total, params = sum(int(t.n_bytes) for t in tensors), sum(int(t.n_elements) for t in tensors)
    bits = run._bits(folder)
    assert bits is not None and bits.total_bytes == total and bits.bits_per_weight == pytest.approx(8 * total / params)
    assert run._bits(tmp_path) is None  # a folder of no checkpoint
