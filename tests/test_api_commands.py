"""The API functions behind `quantize eval`, `gate`, `agree`, `report`, `cost`, `cache-key` and `golden new/verify`
(quantize/api.py), called as functions: each returns what its command prints from, with the command's messages,
and the commands that find results by identity check Hub blob names as the gate does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import quantize
from quantize.cli import main
from quantize.records import ScoreDoc, Verdict

from conftest import small_golden, suite_file


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-api-commands"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("api-commands")
    golden = small_golden(base)
    suite = suite_file(base / "suite.yaml", golden)
    policy = base / "gate.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n")
    return base, suite, policy


def test_scored_says_whether_the_scores_came_from_the_cache(world, tiny_model):
    _, suite, _ = world
    doc, cached = quantize.scored(suite, tiny_model, refresh=True)
    assert isinstance(doc, ScoreDoc) and cached is False
    again, cached = quantize.scored(suite, tiny_model)
    assert cached is True and again.tasks.keys() == doc.tasks.keys()
    assert quantize.score(suite, tiny_model) == again


def test_gate_shows_the_verdict_before_any_file_is_written(world, tiny_model, tmp_path):
    _, _, policy = world
    junit, seen = tmp_path / "gate.xml", []

    def on_verdict(v: Verdict) -> None:
        seen.append((v.verdict, junit.exists()))

    v = quantize.gate(policy, tiny_model, tiny_model, junit=junit, on_verdict=on_verdict)
    assert seen == [("pass", False)] and junit.is_file() and v.exit_code == 0


def test_gate_names_the_flags_as_the_command_line_does(world, tiny_model, tmp_path):
    """The API's message is the CLI's: a JUnit path that is a folder names --junit, before anything is scored."""
    _, _, policy = world
    with pytest.raises(quantize.UsageError, match=f"--junit {tmp_path} is a folder"):
        quantize.gate(policy, tiny_model, tiny_model, junit=tmp_path)
    with pytest.raises(quantize.UsageError, match="--hardware 'tpu' is unknown"):
        quantize.token_cost(7e9, {"bf16": 16}, _kv(), hardware="tpu")


def _kv():
    from quantize.cost.bounds import KVLayout

    return KVLayout(32, 8, 128, 2)


def test_token_cost_is_what_cost_json_prints(capsys):
    from quantize.cost.bounds import Workload

    argv = ["cost", "--params", "7e9", "--formats", "bf16=16,int4=4.15", "--layers", "32", "--batch", "8", "--sweep"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    got = quantize.token_cost(7e9, {"bf16": 16, "int4": 4.15}, _kv(), workload=Workload(batch=8), sweeps=True)
    assert json.loads(json.dumps(got.to_data(), default=str)) == printed
    assert got.sweeps is not None and got.formats["int4"].bits_per_weight == 4.15


def test_decode_cost_projects_like_the_command(tiny_model, capsys):
    argv = ["cost", "--checkpoint", str(tiny_model), "--project-params", "7e9", "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    got = quantize.decode_cost(tiny_model, project_params=7e9)
    assert got.projection is not None and json.loads(json.dumps(got.to_data(), default=str)) == printed


def test_cache_key_is_what_cache_key_prints(world, capsys):
    _, _, policy = world
    assert main(["cache-key", str(policy), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    key = quantize.cache_key(policy)
    assert {"key": key.key, "parts": json.loads(json.dumps(key.parts, default=str))} == printed


def test_golden_new_and_verify(tmp_path):
    src = tmp_path / "faq.jsonl"
    items = [
        {"question": "2+2?", "choices": ["3", "4"], "answer": 1},
        {"question": "1+2?", "choices": ["3", "4"], "answer": "3"},
    ]
    src.write_text("".join(json.dumps(i) + "\n" for i in items))
    out = tmp_path / "golden" / "faq" / "v1"
    manifest = quantize.golden_new(out, src, "multiple_choice", task="faq")
    assert quantize.golden_verify(out).manifest == manifest
    with pytest.raises(quantize.UsageError, match="immutable"):
        quantize.golden_new(out, src, "multiple_choice")


def test_agreement_returns_the_suite_and_what_it_left_out(world, tiny_model, tmp_path):
    _, suite, _ = world
    a = quantize.agreement(suite, tiny_model, [tiny_model])  # the baseline itself is no candidate
    assert a.results == [] and a.skipped == [] and a.suite.golden.path == (Path(suite).parent / "golden" / "v1")


# --- identities from names: eval, agree and report check Hub blob names as the gate does ------------------------


def _hub_snapshot(root: Path, checkpoint: Path, repo: str, weights_blob: str | None = None) -> Path:
    """snapshot_download's layout (models--ORG--NAME/{blobs/NAME, snapshots/REV/FILE -> ../../blobs/NAME}), the
    weights' blob named `weights_blob` (default: their sha256, as on the Hub)."""
    from quantize.io import sha256_file

    repo_dir = root / f"models--{repo}"
    snap = repo_dir / "snapshots" / ("ab" * 20)
    (repo_dir / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(checkpoint.iterdir()):
        name = (weights_blob or sha256_file(f)) if f.suffix == ".safetensors" else sha256_file(f)[:40]
        shutil.copyfile(f, repo_dir / "blobs" / name)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / name)
    return snap


def _other_bytes(src: Path, dst: Path) -> Path:
    """The same tensors under another header (one more metadata key): other bytes, a loadable checkpoint."""
    import struct

    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"] = {**header.get("__metadata__", {}), "note": "not the baseline"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    f.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return dst


@pytest.fixture(scope="module")
def lying(tmp_path_factory, tiny_model):
    """A true Hub snapshot of the tiny model, and one of other bytes whose blob is named with its sha256."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.io import sha256_file

    root = tmp_path_factory.mktemp("hub")
    claimed = sha256_file(tiny_model / "model.safetensors")
    base = _hub_snapshot(root, tiny_model, "org--base")
    liar = _hub_snapshot(root, _other_bytes(tiny_model, root / "other"), "org--liar", weights_blob=claimed)
    assert identity_sha256(liar) == identity_sha256(base)  # the borrowed identity
    return base, liar, liar.parent.parent / "blobs" / claimed


def test_eval_refuses_a_blob_whose_name_lies_and_caches_nothing_under_it(world, lying):
    """Before, `eval` of the liar returned the baseline's cached scores as its own, and scored fresh (refresh) it
    stored its scores under the baseline's identity, where a later gate read them as the baseline's."""
    _, suite, _ = world
    base, liar, blob = lying
    quantize.score(suite, base)
    for refresh in (False, True):  # from the cache, and scored now
        with pytest.raises(quantize.UsageError, match="do not hash to its name") as e:
            quantize.score(suite, liar, refresh=refresh)
        assert str(blob) in str(e.value)
    doc, cached = quantize.scored(suite, base)
    # the cache entry is still the baseline's (scored from this snapshot, or from the plain folder of the same files,
    # which is one identity since a folder and a Hub snapshot hash alike), never the liar's
    assert cached and doc.provenance.checkpoint.path != str(liar)


def test_eval_command_refuses_it_with_exit_2(world, lying, capsys):
    _, suite, _ = world
    _, liar, blob = lying
    assert main(["eval", str(suite), str(liar), "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and str(blob) in err


def test_agree_and_report_refuse_a_blob_whose_name_lies(world, lying, tiny_model, tmp_path):
    _, suite, _ = world
    base, liar, blob = lying
    with pytest.raises(quantize.UsageError, match=str(blob)):
        quantize.agreement(suite, tiny_model, [liar])
    with pytest.raises(quantize.UsageError, match="do not hash to its name"):
        quantize.write_report([base, liar], tmp_path / "report", suite=suite)
    assert not (tmp_path / "report").exists()
    data = quantize.write_report([base], tmp_path / "ok", suite=suite)  # a snapshot whose names hold is reported
    assert len(data["entries"]) == 1


def test_a_gate_on_a_lying_baseline_caches_nothing_under_the_identity_it_borrowed(world, lying, tmp_path, monkeypatch):
    """The gate scores a baseline it has no scores for and reads its blobs back beside it; before, the fresh
    baseline's scores were cached before the blob check was waited for, so they stayed under the borrowed identity
    (the true baseline's) after the exit 2, where a later gate read them as the true baseline's."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "fresh-cache"))
    _, _, policy = world
    base, liar, blob = lying
    with pytest.raises(quantize.UsageError, match="do not hash to its name") as e:
        quantize.gate(policy, liar, base)
    assert str(blob) in str(e.value)
    scores = tmp_path / "fresh-cache" / "scores"
    assert not scores.exists() or not list(scores.glob("*.json")), "the liar's scores were cached"


def test_default_model_is_what_model_path_prints(capsys):
    assert main(["model", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(quantize.default_model())


def test_card_refuses_a_verdict_file_that_is_not_one(tiny_model, tmp_path):
    bad = tmp_path / "gate.json"
    bad.write_text('{"not": "a verdict"}')
    with pytest.raises(quantize.UsageError):
        quantize.card(tiny_model, bad)
