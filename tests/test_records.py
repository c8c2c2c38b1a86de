"""Every record round-trips through its JSON; a file of another schema version, from before versions,
or with an unknown key is refused (exit 2 through the CLI) with a message that says how to regenerate it."""

from __future__ import annotations

import copy
import json

import pytest

from quantize import records
from quantize.errors import UsageError
from quantize.records import AgreementResult, RunRecord, ScoreDoc, Verdict

from conftest import DATA, baseline, judge, result

AGREEMENT = {
    "schema_version": 2,
    "positions": 100,
    "items": 10,
    "clusters": 8,
    "kl_mean": 0.02,
    "kl_se": 0.001,
    "kl_p99": 0.2,
    "top1": 0.9,
    "top1_se": 0.01,
    "sum_min": 0.95,
    "sum_min_se": 0.002,
    "note": "lower bound",
    "baseline_identity": "a" * 64,
    "candidate_identity": "b" * 64,
    "top_k": 20,
    "per_task": 40,
    "tasks": ["t_acc"],
}


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, dict]:
    """One valid JSON document of each record, as the pipeline writes it."""
    from quantize.gates.policy import load_policy

    p = tmp_path_factory.mktemp("pol") / "p.yaml"
    p.write_text(
        "suite: evaluate/core.yaml\nrules:\n  - {task: t_acc, metric: acc, margin: 0.02}\n"
        "  - {task: t_prose, metric: perplexity, max_ratio: 1.05}\n  - {agreement: kl, max: 0.05}\n"
    )
    acc, prose = baseline(n=200)
    verdict = judge(load_policy(p), result(acc, prose), result(acc, prose, sha="b"), AGREEMENT)
    return {
        "RunRecord": json.loads((DATA / "quantize-efcadec-awq.json").read_text()),
        "ScoreDoc": result(acc, prose),
        "AgreementResult": AGREEMENT,
        "Verdict": verdict.model_dump(),
    }


MODELS = {"RunRecord": RunRecord, "ScoreDoc": ScoreDoc, "AgreementResult": AgreementResult, "Verdict": Verdict}


@pytest.mark.parametrize("name", MODELS)
def test_round_trip(samples, tmp_path, name):
    model = MODELS[name]
    first = records.parse(model, samples[name], name)
    records.write(tmp_path / "r.json", first)
    again = records.read(model, tmp_path / "r.json")
    assert again == first and json.loads((tmp_path / "r.json").read_text()) == first.model_dump()


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    "edit,msg",
    [
        (lambda d: d.pop("schema_version"), "no schema_version (it was written before records were versioned)"),
        (lambda d: d.update(schema_version=7), "schema_version 7; this quantize reads schema_version"),
        (lambda d: d.update(extra_field=True), "unknown key `extra_field`"),
    ],
)
def test_other_versions_and_unknown_keys_are_refused(samples, tmp_path, name, edit, msg):
    model = MODELS[name]
    data = copy.deepcopy(samples[name])
    edit(data)
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(UsageError) as e:
        records.read(model, tmp_path / "r.json")
    assert msg in str(e.value) and model.REGENERATE.split()[0].lower() in str(e.value).lower()


@pytest.mark.parametrize("name", ["ScoreDoc", "AgreementResult", "Verdict"])
def test_records_keyed_by_weights_only_are_refused_with_the_fix(samples, tmp_path, name):
    """Version 1 named a checkpoint by its weights alone; the files it was scored with are unknown, so
    it is regenerated rather than migrated."""
    model = MODELS[name]
    (tmp_path / "r.json").write_text(json.dumps({**samples[name], "schema_version": 1}))
    with pytest.raises(UsageError, match="schema_version 1; this quantize reads schema_version 2"):
        records.read(model, tmp_path / "r.json")


def test_not_json_and_not_an_object(tmp_path):
    (tmp_path / "a.json").write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="not valid JSON"):
        records.read(ScoreDoc, tmp_path / "a.json")
    (tmp_path / "b.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="holds a JSON list"):
        records.read(ScoreDoc, tmp_path / "b.json")


def test_a_quantize_json_written_before_this_change_still_reads():
    """Outputs of efcadec carry schema_version 1 with the same fields: they read through RunRecord unchanged."""
    meta = records.read(RunRecord, DATA / "quantize-efcadec-awq.json")
    assert meta.method == "awq" and meta.bits.bits_per_weight > 4 and meta.layer_plan.quantized_layers == 14


def test_a_baseline_top_k_from_before_versions_reads_and_a_newer_one_is_refused(tmp_path):
    import numpy as np

    from quantize.evaluate.agreement import BaselineTopK, load_baseline

    base = BaselineTopK(
        ["a", "b"], ["c", "c"], np.asarray([2, 1]), 2, np.zeros((3, 2), np.int32), np.full((3, 2), -1.0, np.float32)
    )
    base.save(tmp_path / "new.npz")
    np.savez_compressed(
        tmp_path / "old.npz",
        ids=np.asarray(base.ids),
        clusters=np.asarray(base.clusters),
        counts=base.counts,
        k=np.asarray(2),
        top_idx=base.top_idx,
        top_logp=base.top_logp,
    )
    for f in ("new.npz", "old.npz"):
        got = load_baseline(tmp_path / f)
        assert got.ids == ["a", "b"] and got.k == 2 and got.top_logp.shape == (3, 2)
        assert got.rows("b") == slice(2, 3) and got.rows("a") == slice(0, 2)
    np.savez_compressed(tmp_path / "future.npz", schema_version=np.asarray(9), ids=np.asarray(base.ids))
    with pytest.raises(UsageError, match="schema_version 9"):
        load_baseline(tmp_path / "future.npz")


def test_a_verdict_uses_one_vocabulary(samples):
    """A valid verdict with another word for its outcome: the one problem named, with the words it may use."""
    with pytest.raises(UsageError) as e:
        records.parse(Verdict, {**samples["Verdict"], "verdict": "ok"}, "v")
    problems = [line for line in str(e.value).splitlines() if line.startswith("  - ")]
    assert problems == ["  - verdict = \"ok\": Input should be 'pass', 'rejected' or 'inconclusive'"]


def test_peak_memory_is_this_process_s_not_the_one_that_started_it():
    """ru_maxrss survives execve: a run started by a process that had touched 400 MiB reported 400 MiB as its own
    peak (the recipes benchmark's rows all showed the benchmark's peak). The recorded peak is the run's."""
    import subprocess
    import sys

    child = "from quantize.convert.provenance import peak_rss_bytes; print(peak_rss_bytes())"
    parent = (
        "import os, sys\n"
        "held = b'x' * (400 * 2**20)\n"  # touched pages: resident
        f"os.execv(sys.executable, [sys.executable, '-c', {child!r}])\n"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True).stdout
    assert 10 * 2**20 < int(out) < 300 * 2**20
