"""`quantize eval` and `quantize gate` end to end on a tiny seeded model and a tiny golden set:
per-item records, the cache, agreement, A/A passes (also at another batch size), and a
too-small set yields 'inconclusive', never a pass."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from quantize import records
from quantize.cli import main
from quantize.compat.lm_eval import sandboxed_metrics
from quantize.evaluate import cache
from quantize.evaluate.cache import ran
from quantize.evaluate.score import runtime, score
from quantize.evaluate.suite import open_suite
from quantize.golden.build import Sizes
from quantize.io import sha256_file
from quantize.records import AgreementResult, ScoreDoc, Verdict

from conftest import lm_eval_direct, nan_copy, small_golden, suite_file

SIZES = Sizes(facts=24, cloze=12, analogy=6, kv=9, prose=4, smoke=3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("eval")
    golden = small_golden(base, SIZES)
    suite = suite_file(base / "suite.yaml", golden)
    suite_b2 = suite_file(base / "suite-b2.yaml", golden, batch_size=2)
    policy = base / "gate.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.1}}\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n  - {agreement: kl, max: 0.5}\n"
        "  - {agreement: top1, min: 0.5}\n"
    )
    return base, suite, suite_b2, policy


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache"))


def test_eval_records_items_and_caches(setup, tiny_model):
    _, suite, _, _ = setup
    first, cached = score(open_suite(suite), tiny_model)
    assert cached is False
    tasks = first.tasks
    assert set(tasks) == {"core_facts", "core_cloze", "core_analogy", "core_kv", "core_prose"}
    facts = tasks["core_facts"]
    assert facts.n == len(facts.items) == 24 and facts.chance == pytest.approx(0.25)
    assert all(len(i.lls) == 4 and i.score in (0.0, 1.0) for i in facts.items)
    assert all(i.ll < 0 and i.words > 100 for i in tasks["core_prose"].items)
    p = first.provenance
    assert p.golden.version == "v1" and len(p.golden.manifest_sha256) == 64
    assert p.task_versions == dict.fromkeys(tasks, 1.0) and p.lm_eval_version and p.batch_size == 4
    second, cached = score(open_suite(suite), tiny_model)
    assert cached is True and second == first
    # the cached file is the record, and reads back through its model
    assert (
        records.read(ScoreDoc, cache.score_path(open_suite(suite), p.checkpoint.identity_sha256, ran(first))) == first
    )


def test_eval_json_items_is_a_score_file(setup, tiny_model, capsys):
    """`quantize eval --json --items` writes what the gate reads: it validates against the record."""
    _, suite, _, _ = setup
    assert main(["eval", str(suite), str(tiny_model), "--json", "--items", "--quiet"]) == 0
    doc = records.parse(ScoreDoc, json.loads(capsys.readouterr().out), "stdout")
    assert doc.tasks["core_facts"].items[0].lls
    assert main(["eval", str(suite), str(tiny_model), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "items" not in summary["tasks"]["core_facts"] and summary["tasks"]["core_facts"]["n"] == 24


def test_cached_score_of_another_schema_is_refused_with_the_fix(setup, tiny_model, capsys):
    _, suite, _, _ = setup
    s = open_suite(suite)
    doc, _ = score(s, tiny_model)
    path = cache.score_path(s, doc.provenance.checkpoint.identity_sha256, ran(doc))
    saved, digest = path.read_text(), path.with_suffix(".sha256").read_text()
    try:
        path.write_text(json.dumps({k: v for k, v in json.loads(saved).items() if k != "schema_version"}))
        path.with_suffix(".sha256").write_text(sha256_file(path))  # an entry of the older schema, intact
        assert main(["eval", str(suite), str(tiny_model)]) == 2
        err = capsys.readouterr().err
        assert "no schema_version" in err and "--refresh" in err
        assert main(["eval", str(suite), str(tiny_model), "--refresh", "--quiet"]) == 0
        assert json.loads(path.read_text())["schema_version"] == 2  # the refused file was scored again and replaced
    finally:
        path.write_text(saved)
        path.with_suffix(".sha256").write_text(digest)


def test_eval_refuses_tampered_golden(setup, tiny_model, tmp_path, capsys):
    base, _, _, _ = setup
    copy = tmp_path / "v1"
    shutil.copytree(base / "golden" / "v1", copy)
    with (copy / "data" / "facts.jsonl").open("a") as f:
        f.write('{"id": "x"}\n')
    s = tmp_path / "s.yaml"
    s.write_text(f"golden: {copy}\n")
    assert main(["eval", str(s), str(tiny_model)]) == 2
    assert "facts.jsonl" in capsys.readouterr().err


def test_gate_a_a_passes_with_agreement(setup, tiny_model, capsys):
    _, _, _, policy = setup
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json"])
    v = json.loads(capsys.readouterr().out)
    assert code == 0 and v["verdict"] == "pass"
    kl = next(r for r in v["rules"] if r["rule"] == "agreement kl")["evidence"]
    assert kl["value"] == pytest.approx(0, abs=1e-5) and kl["positions"] > 0
    top1 = next(r for r in v["rules"] if r["rule"] == "agreement top1")["evidence"]
    assert top1["value"] == 1.0
    # what the gate wrote: the verdict on stdout and the cached agreement, each valid against its record
    verdict = records.parse(Verdict, v, "stdout")
    sha = verdict.provenance.baseline.checkpoint.identity_sha256
    s = open_suite(setup[1])
    cached = records.read(AgreementResult, cache.agreement_path(s, sha, sha, runtime(s, False, tiny_model)))
    assert cached.kl_mean == pytest.approx(kl["value"]) and cached.positions == kl["positions"]


def test_gate_a_a_at_another_batch_size_passes(setup, tiny_model, capsys):
    _, suite, suite_b2, _ = setup
    b, _ = score(open_suite(suite), tiny_model)
    c, _ = score(open_suite(suite_b2), tiny_model)
    assert c.provenance.batch_size == 2
    for t in b.tasks:
        for x, y in zip(b.tasks[t].items, c.tasks[t].items, strict=True):
            assert x.ll == pytest.approx(y.ll, abs=1e-3)
    bf, cf = Path(suite).parent / "b.json", Path(suite).parent / "c.json"
    bf.write_text(records.to_json(b))
    cf.write_text(records.to_json(c))
    pol = Path(suite).parent / "acc-only.yaml"
    pol.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.1}}\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.01}\n"
    )
    assert main(["gate", str(pol), "--baseline", str(bf), "--candidate", str(cf)]) == 0, capsys.readouterr().out


def test_damaged_model_on_a_tiny_set_is_not_a_pass(setup, tiny_model, tmp_path, capsys):
    """3-bit RTN of the tiny model against a 2-point margin: 24 facts items cannot show it, so not a pass."""
    _, suite, _, _ = setup
    policy = tmp_path / "strict.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.02}}\n  - "
        f"{{agreement: kl, max: 0.5}}\n"
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"method: rtn\nscheme: W3A16\ngroup_size: 32\ncalibration: null\nmodel: {tiny_model}\noutput: "
        f"{tmp_path / 'w3'}\n"
    )
    assert main(["run", str(recipe), "--quiet"]) == 0
    capsys.readouterr()
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tmp_path / "w3"), "--json"])
    out = capsys.readouterr()
    assert code == 1, out.err
    v = json.loads(out.out)
    assert v["verdict"] in ("inconclusive", "rejected")
    facts = next(r for r in v["rules"] if r["rule"] == "core_facts acc")
    assert facts["verdict"] == "inconclusive" and facts["evidence"]["items_needed"] > 24


def test_same_weights_under_another_config_are_another_checkpoint(setup, tiny_model, tmp_path):
    """With a shared cache, efcadec served one checkpoint's scores for another that had the same weights
    and a different config.json: the identity now covers config and tokenizer files."""
    from quantize.checkpoint.files import identity_sha256, weights_sha256

    _, suite, _, _ = setup
    first, _ = score(open_suite(suite), tiny_model)
    other = tmp_path / "same-weights"
    shutil.copytree(tiny_model, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 0.1}))
    assert weights_sha256(other) == weights_sha256(tiny_model) and identity_sha256(other) != identity_sha256(tiny_model)
    doc, cached = score(open_suite(suite), other)
    assert cached is False and doc.provenance.checkpoint.path == str(other)
    assert doc.provenance.checkpoint.identity_sha256 != first.provenance.checkpoint.identity_sha256
    # files that do not change what the checkpoint computes leave the identity alone
    (other / "README.md").write_text("notes")
    assert identity_sha256(other) == doc.provenance.checkpoint.identity_sha256
    (other / "tokenizer_config.json").write_text(
        (other / "tokenizer_config.json").read_text().replace("}", ', "x": 1}', 1)
    )
    assert identity_sha256(other) != doc.provenance.checkpoint.identity_sha256


def test_scoring_through_our_loader_equals_lm_evals_own_loading(setup, tiny_model, tmp_path):
    """Our scorer (the default backend, quantize/evaluate/lm.py) scores a model our strict loader loaded; per
    item, the scores and log-likelihoods are the ones lm-eval's stock HF backend gets when it loads the same
    checkpoint by path."""
    from quantize.evaluate.score import item_records, model_args
    from quantize.golden.manifest import lm_eval_tasks

    _, suite, _, _ = setup
    s = open_suite(suite)
    ours, _ = score(s, tiny_model)
    include = lm_eval_tasks(s.golden, tmp_path / "tasks", None, sandboxed_metrics())
    r = lm_eval_direct(
        s.tasks,
        include,
        model="hf",
        model_args=model_args(s.suite, tiny_model, "cpu"),
        batch_size=s.suite.batch_size,
        device="cpu",
    )
    for task in s.tasks:
        theirs, _ = item_records(r["configs"][task]["output_type"], r["samples"][task], s.golden.item_key(task))
        mine = [i.model_dump() for i in ours.tasks[task].items]
        assert [i["id"] for i in mine] == [i["id"] for i in theirs]
        for a, b in zip(mine, theirs, strict=True):
            assert a["score"] == b["score"] and a["ll"] == pytest.approx(b["ll"], abs=1e-4), (task, a["id"])


def test_weights_that_do_not_match_the_config_are_refused_not_scored(setup, tiny_model, tmp_path, capsys):
    """A quantized checkpoint whose config.json lost its quantization_config loaded with every projection
    missing (random) and was scored as if nothing were wrong; now it is exit 2 naming a few keys."""
    _, suite, _, _ = setup
    r = tmp_path / "r.yaml"
    r.write_text(
        f"method: rtn\nscheme: W4A16\ngroup_size: 32\ncalibration: null\nmodel: {tiny_model}\n"
        f"output: {tmp_path / 'w4'}\n"
    )
    assert main(["run", str(r), "--quiet"]) == 0
    cfg = json.loads((tmp_path / "w4" / "config.json").read_text())
    cfg.pop("quantization_config")
    (tmp_path / "w4" / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["eval", str(suite), str(tmp_path / "w4"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "do not match config.json" in err and "weight_packed" in err and "quantization_config" in err


def test_two_scorers_of_one_checkpoint_score_it_once(setup, tiny_model, tmp_path, monkeypatch):
    """Two concurrent evals of the same checkpoint: the second waits on the first's claim and reads its result."""
    import threading

    from quantize.evaluate import score as score_mod

    _, suite, _, _ = setup
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cold"))
    real, calls = score_mod.run_lm_eval, []

    def slow(*args):
        calls.append(1)
        time.sleep(0.5)  # long enough for the other thread to reach the claim
        return real(*args)

    monkeypatch.setattr(score_mod, "run_lm_eval", slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(score(open_suite(suite), tiny_model))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(r.cached for r in results) == [False, True]
    assert results[0].doc == results[1].doc


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_a_gate_loads_each_checkpoint_once(setup, tiny_model, tmp_path, monkeypatch, capsys, dtype):
    """Scores and agreement from one load each: cold caches, a baseline and a different candidate, the
    policy with agreement rules. Before, the gate loaded each checkpoint twice (scores, then agreement);
    with a suite dtype, agreement also ignored it and compared in float32."""
    from quantize.checkpoint import loader as models

    _, suite, _, setup_policy = setup
    policy = setup_policy
    if dtype != "auto":
        (tmp_path / "s.yaml").write_text(suite.read_text() + f"dtype: {dtype}\n")
        policy = tmp_path / "p.yaml"
        policy.write_text(setup_policy.read_text().replace(f"suite: {suite}", f"suite: {tmp_path / 's.yaml'}"))
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cold"))
    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 0.01}))  # another checkpoint
    loaded = []
    real = models.load_model
    monkeypatch.setattr(
        models, "load_model", lambda path, *a, **k: loaded.append(Path(path).name) or real(path, *a, **k)
    )
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(other), "--json", "--quiet"])
    v = json.loads(capsys.readouterr().out)
    assert code == v["exit_code"] == (0 if v["verdict"] == "pass" else 1)
    assert {r["kind"] for r in v["rules"]} == {"accuracy", "perplexity", "agreement"}
    assert loaded == [tiny_model.name, "other"]
    # in stages (cold caches again): the baseline's top-k is still built before the candidate loads
    staged_policy = tmp_path / "staged.yaml"
    staged_policy.write_text(policy.read_text().replace("rules:", "sequential: {looks: [0.5, 1.0]}\nrules:"))
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cold-staged"))
    loaded.clear()
    code = main(["gate", str(staged_policy), "--baseline", str(tiny_model), "--candidate", str(other), "--json"])
    v = json.loads(capsys.readouterr().out)
    assert v["sequential"]["agreement_looks_taken"] >= 1 and loaded == [tiny_model.name, "other"]


def test_staged_scoring_matches_full_scoring_and_scores_each_item_once(setup, tiny_model, monkeypatch):
    """The sequential gate's scorer: items scored in two stages (lm-eval `samples=`, one load) equal the same
    items of a full run, and the second stage scores only the new ones."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate import score as score_mod

    _, suite_path, _, _ = setup
    suite = open_suite(suite_path)
    full, _ = score(suite, tiny_model)
    order = {t: [i.id for i in full.tasks[t].items] for t in ("core_facts", "core_prose")}
    monkeypatch.setattr(score_mod.cache, "lookup_scores", lambda *a: None)  # as if never scored
    calls = []
    real = score_mod.run_lm_eval

    def counting(*a, samples=None, **k):
        calls.append({t: list(v) for t, v in samples.items()})
        return real(*a, samples=samples, **k)

    monkeypatch.setattr(score_mod, "run_lm_eval", counting)
    staged = score_mod.Staged(suite, tiny_model, order, LastModel())
    first = staged.score({"core_facts": order["core_facts"][:5], "core_prose": order["core_prose"][:2]})
    second = staged.score({"core_facts": order["core_facts"][:9]})
    assert calls == [{"core_facts": [0, 1, 2, 3, 4], "core_prose": [0, 1]}, {"core_facts": [5, 6, 7, 8]}]
    assert staged.calls == [{"core_facts": 5, "core_prose": 2}, {"core_facts": 4}]  # the batch plan the verdict records
    assert [i.id for i in first.tasks["core_prose"].items] == order["core_prose"][:2]
    ref = {i.id: i for i in full.tasks["core_facts"].items}
    assert [i.id for i in second.tasks["core_facts"].items] == order["core_facts"][:9]
    for i in second.tasks["core_facts"].items:
        assert i.score == ref[i.id].score and i.ll == pytest.approx(ref[i.id].ll, abs=1e-4)
        assert i.tokens_sha256 == ref[i.id].tokens_sha256 is not None  # an item's tokens, whatever else a stage holds
    prose = {i.id: i.tokens_sha256 for i in full.tasks["core_prose"].items}
    assert [i.tokens_sha256 for i in first.tasks["core_prose"].items] == [prose[i] for i in order["core_prose"][:2]]


def test_staged_agreement_matches_the_full_agreement_and_scores_each_item_once(setup, tiny_model, tmp_path):
    """The sequential gate's agreement: look k measures the first ⌈t_k · per_task⌉ agreement items of each task, the
    next look scores only the new ones, and the last look covers every item with the full agreement's figures."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.agreement import StagedAgreement, agreement_scores

    _, suite_path, _, _ = setup
    suite = open_suite(suite_path)
    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 0.01}))  # a candidate that disagrees
    sha_b, sha_c = identity_sha256(tiny_model), identity_sha256(other)
    full = agreement_scores(suite, tiny_model, other, sha_b, sha_c)
    assert full.kl_mean > 0  # the two differ: a check that can tell the looks' items apart
    staged = StagedAgreement(suite, tiny_model, other, (sha_b, sha_c), LastModel(), [0.5, 1.0])
    first, last = staged.look(0), staged.look(1)
    tasks = len(suite.agreement_tasks)
    assert first.per_task == 2 and first.items == 2 * tasks  # per_task 3 in the suite: ⌈0.5 · 3⌉ = 2
    assert staged.calls == [2 * tasks, tasks]  # the second look scored only the third item of each task
    assert (last.items, last.positions, last.clusters, last.per_task) == (full.items, full.positions, full.clusters, 3)
    for field in ("kl_mean", "kl_se", "top1", "sum_min", "sum_min_se"):
        assert getattr(last, field) == pytest.approx(getattr(full, field), rel=1e-3, abs=1e-6), field
    assert first.positions < last.positions and first.kl_mean != last.kl_mean


def test_sequential_gate_a_a_on_a_tiny_model(setup, tiny_model, tmp_path, capsys):
    _, suite, _, _ = setup
    policy = tmp_path / "seq.yaml"
    policy.write_text(
        f"suite: {suite}\nsequential: {{looks: [0.5, 1.0], stable_fraction: 0.5}}\nrules:\n"
        "  - {task: core_facts, metric: acc, margin: 0.4}\n  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n"
        "  - {agreement: kl, max: 0.5}\n"
    )
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json"])
    out = capsys.readouterr()
    assert out.out, out.err
    v = records.parse(Verdict, json.loads(out.out), "stdout")
    assert code == 0 and v.verdict == "pass" and v.sequential is not None
    # every rule carries the look that decided it; agreement runs looks of its own before the first, and an A/A
    # check (KL 0) passes at its first, on the first half of the agreement items of each task
    assert [r.look is not None for r in v.rules] == [True, True, True]
    assert v.rules[2].look == 1 and v.sequential.agreement_looks_taken == 1
    assert v.rules[2].evidence.items == len(v.sequential.agreement_runs) * v.sequential.agreement_runs[0]
    assert v.sequential.items_total["core_facts"] == 24 and 0 < v.sequential.items_scored["core_facts"] <= 24
    # the batch plan: every lm-eval run of the candidate and the batch size (none when read from the cache)
    sq = v.sequential
    assert sq.batch_size == 4
    if sq.candidate_seconds is None:
        assert sq.stage_runs == []
    else:
        assert {t: sum(r.get(t, 0) for r in sq.stage_runs) for t in sq.items_scored} == sq.items_scored


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_a_stored_bias_the_model_lacks_is_let_go_only_when_zero(tiny_model, tmp_path, value):
    """AutoGPTQ writes a zero bias for every quantized linear of a bias-free model: x W^T + 0 is x W^T, so the
    strict load lets it go; any other stored tensor the model has no place for is still refused."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from quantize.checkpoint.loader import load_model
    from quantize.errors import UsageError

    ckpt = tmp_path / "biased"
    shutil.copytree(tiny_model, ckpt)
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.bias"] = torch.full((128,), value, dtype=torch.bfloat16)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    if value == 0.0:
        load_model(ckpt)
    else:
        with pytest.raises(UsageError, match=r"not part of the model \(e.g. model.layers.0.mlp.down_proj.bias"):
            load_model(ckpt)


def _swapped_at_load(monkeypatch, folder: Path, weights: Path) -> None:
    """The one loader, with `folder`'s weights replaced by `weights` (one rename) just before it loads `folder`: the
    window between the identity's hash and the load."""
    from quantize.checkpoint.loader import LastModel

    real = LastModel.get

    def get(self, path, *args, **kwargs):
        if Path(path) == folder and weights.exists():
            weights.rename(folder / "model.safetensors")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(LastModel, "get", get)


@pytest.mark.parametrize("command", ["gate", "eval"])
def test_weights_replaced_between_hash_and_load_give_no_verdict_and_no_cache_entry(
    setup, tiny_model, tmp_path, monkeypatch, capsys, command
):
    """Route 2 of the fifth round: a NaN folder hashed, clean weights renamed in before the load. The gate passed,
    naming the NaN identity, and stored the clean scores under it for every later `eval`. Now the identity is taken
    again after the work: exit 2, nothing kept."""
    from quantize.checkpoint.files import identity_sha256

    _, suite, _, policy = setup
    cand = shutil.copytree(tiny_model, tmp_path / "cand")
    clean = shutil.copyfile(cand / "model.safetensors", tmp_path / "clean.safetensors")
    nan_copy(clean, cand / "model.safetensors")
    nan_id = identity_sha256(cand)
    _swapped_at_load(monkeypatch, cand, clean)
    argv = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand)]
    code = main(argv if command == "gate" else ["eval", str(suite), str(cand), "--refresh"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "changed while it was being read" in err and nan_id[:16] in err
    run = runtime(open_suite(suite), False, cand)
    assert not cache.score_path(open_suite(suite), nan_id, run).exists()


def _restored_around_load(monkeypatch, folder: Path, clean: Path) -> None:
    """The one loader, with `folder`'s weights renamed aside, `clean` copied in for the load, and the file renamed
    aside put back once it loaded (its inode and bytes the ones hashed): what a writer timed to the load does."""
    from quantize.checkpoint import loader

    real = loader.load_model

    def load_model(path, *args, **kwargs):
        if Path(path).resolve() != folder.resolve():
            return real(path, *args, **kwargs)
        aside = folder.parent / "aside.safetensors"
        (folder / "model.safetensors").rename(aside)
        shutil.copyfile(clean, folder / "model.safetensors")
        try:
            return real(path, *args, **kwargs)
        finally:
            (folder / "model.safetensors").unlink()
            aside.rename(folder / "model.safetensors")

    monkeypatch.setattr(loader, "load_model", load_model)


@pytest.mark.parametrize("command", ["gate", "eval", "agree"])
def test_weights_changed_for_the_load_and_put_back_give_no_verdict_and_no_cache_entry(
    setup, tiny_model, tmp_path, monkeypatch, capsys, command
):
    """A review's wrong pass: a NaN folder hashed, its file renamed aside and clean weights copied in for the load,
    the NaN file put back after it. The identity taken again hashed the same bytes, so the gate passed naming the
    NaN identity and cached the clean scores and agreement under it (for `eval`, `agree` and
    `--trust-cached-candidate`). Now the files are held to the stat keys the identity was taken with: exit 2,
    naming the file, nothing kept."""
    from quantize.checkpoint.files import identity_sha256

    _, suite, _, policy = setup
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    cand = shutil.copytree(tiny_model, tmp_path / "cand")
    clean = shutil.copyfile(cand / "model.safetensors", tmp_path / "clean.safetensors")
    nan_copy(clean, cand / "model.safetensors")
    nan_id = identity_sha256(cand)
    _restored_around_load(monkeypatch, cand, clean)
    argv = {
        "gate": ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand)],
        "eval": ["eval", str(suite), str(cand)],
        "agree": ["agree", str(suite), str(cand), "--baseline", str(tiny_model)],
    }[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{cand / 'model.safetensors'} was replaced or written" in err and nan_id[:16] in err
    assert identity_sha256(cand) == nan_id  # the NaN bytes are back: only their stat keys tell
    opened = open_suite(suite)
    run = runtime(opened, False, cand)
    assert not cache.score_path(opened, nan_id, run).exists()
    assert not list((tmp_path / "cache").rglob(f"*{nan_id[:16]}*.json"))  # no agreement (its .lock may stay)


def test_a_gate_shows_its_stages_on_stderr_and_nothing_under_quiet(setup, tiny_model, tmp_path, monkeypatch, capsys):
    """Issue #56: stderr not a terminal (a log, CI): one line per stage start and end, with the looks and their
    items; the verdict alone on stdout; nothing of it under --quiet."""
    _, suite, _, _ = setup
    policy = tmp_path / "seq.yaml"
    policy.write_text(
        f"suite: {suite}\nsequential: {{looks: [0.5, 1.0]}}\nrules:\n"
        "  - {task: core_facts, metric: acc, margin: 0.4}\n  - {agreement: kl, max: 0.5}\n"
    )
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cold"))
    gate = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tiny_model)]
    assert main(gate) == 0
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.startswith("quantize: ")]
    assert "\x1b[K" not in out.err and "quantize: " not in out.out  # no line rewritten in place (tqdm aside)
    name = tiny_model.name
    for stage in (
        f"gate: baseline scores ({name})",
        f"scoring {name} with lm-eval: core_analogy, core_cloze, core_facts, core_kv, core_prose",
        f"gate: baseline top-k ({name})",
        f"gate: candidate in stages ({name}, up to 2 looks)",
        f"gate: agreement look 1 of 2 ({name})",
    ):
        assert f"quantize: {stage} ..." in lines and any(line.startswith(f"quantize: {stage}: done") for line in lines)
    assert any(line.startswith("quantize: gate: look 1 of 2") and "items of core_facts" in line for line in lines)
    assert main([*gate, "--quiet"]) == 0
    assert "quantize: " not in capsys.readouterr().err


@pytest.mark.parametrize(
    "line,says",
    [("dtype: banana", "dtype"), ("seed: -1", "seed"), (f"seed: {2**40}", "seed")],
    ids=["dtype", "seed-negative", "seed-huge"],
)
def test_a_suite_dtype_or_seed_torch_or_numpy_refuse_is_exit_2_before_any_load(
    setup, tiny_model, tmp_path, capsys, monkeypatch, line, says
):
    """`dtype: banana` was an AttributeError from torch and `seed: -1` numpy's range error, both exit 3 after the
    model loaded (a review's repros): refused with the suite."""
    import quantize.checkpoint.loader

    monkeypatch.setattr(quantize.checkpoint.loader, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    suite = tmp_path / "s.yaml"
    suite.write_text(setup[1].read_text() + f"{line}\n")
    assert main(["eval", str(suite), str(tiny_model)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_each_item_records_the_hash_of_the_tokens_it_scored(setup, tiny_model, tmp_path):
    """An item's `tokens_sha256` is the hash of the rows its engine scored: lm-eval's requests as the cross-engine
    check tokenizes them (evaluate/tokens.py, HFLM's tokenization on a meta-device model), each cut into its row.
    A copy of the checkpoint whose tokenizer maps two words to each other's ids (a score file cannot show its
    tokenizer) moves the hashes of exactly the items that hold either word, and of no other."""
    import shutil

    from quantize.evaluate import tokens
    from quantize.evaluate.engine import tokens_sha256
    from quantize.evaluate.lm import row

    _, suite_path, _, _ = setup
    suite = open_suite(suite_path)
    doc, _ = score(suite, tiny_model)
    (window, _), given = tokens.item_tokens(suite, tokens.encoder_of(suite, tiny_model))
    facts = {i.id: i.tokens_sha256 for i in doc.tasks["core_facts"].items}
    for item, parts in given["core_facts"].items():
        rows = [row(parts[k], parts[k + 1], window) for k in range(0, len(parts), 2)]
        assert facts[item] == tokens_sha256([(r.prefix + r.suffix, r.targets) for r in rows])
    assert all(i.tokens_sha256 for t in doc.tasks.values() for i in t.items)
    other = tmp_path / "swapped"
    shutil.copytree(tiny_model, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["the"], vocab["of"] = vocab["of"], vocab["the"]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    theirs, _ = score(suite, other)
    moved = tokens.differences(given, tokens.item_tokens(suite, tokens.encoder_of(suite, other))[1])
    assert moved  # the words are common
    for task, t in doc.tasks.items():
        mine = {i.id: i.tokens_sha256 for i in theirs.tasks[task].items}
        assert sorted(i.id for i in t.items if i.tokens_sha256 != mine[i.id]) == moved.get(task, [])
