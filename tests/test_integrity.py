"""Integrity: a verdict nobody can fool by accident or on purpose. Each case was a wrong answer before:
a NaN candidate passed a policy that did not fail closed, and `eval` printed nan with exit 0 and no word."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from quantize import records
from quantize.cli import main
from quantize.errors import UsageError
from quantize.records import ScoreDoc, Verdict

from conftest import gate_refused_before_scoring, small_golden, suite_file

SIZES = None


def nan_copy(src: Path, dst: Path) -> Path:
    """The checkpoint with one NaN in a late MLP weight: every logit after it is NaN."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    t = load_file(str(f))
    name = next(n for n in sorted(t) if n.endswith("layers.1.mlp.down_proj.weight"))
    t[name] = t[name].clone()
    t[name][0, 0] = float("nan")
    save_file(t, str(f), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("integrity")
    golden = small_golden(base)
    suite = suite_file(base / "suite.yaml", golden)
    lenient = base / "lenient.yaml"  # does not fail closed: only a regression can reject
    lenient.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n  - {agreement: kl, max: 0.5}\n"
        "  - {task: core_facts, metric: acc, margin: 0.5}\n"
    )
    return base, suite, lenient, nan_copy(tiny_model, base / "nan-model")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-integrity"))


def test_eval_of_a_nan_checkpoint_warns_and_records_the_values(world, capsys):
    _, suite, _, bad = world
    assert main(["eval", str(suite), str(bad), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "core_prose" in err and "NaN or infinity" in err and "regression" in err
    assert main(["eval", str(suite), str(bad), "--json", "--items", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert '"NaN"' in out  # JSON has no NaN: the value is written by name, and reads back as a float
    doc = records.parse(ScoreDoc, json.loads(out), "stdout")
    assert doc.non_finite()["core_prose"] and all(i.ll != i.ll for i in doc.tasks["core_prose"].items)
    assert main(["eval", str(suite), str(bad), "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["tasks"]["core_prose"]["non_finite"]) == summary["tasks"]["core_prose"]["n"]


def test_scoring_a_nan_checkpoint_through_the_api_warns_as_the_cli_prints(world):
    """quantize.score and scored returned the NaN scores without a word, where `quantize eval` printed a warning per
    task: the API warns (QuantizeWarning) with the same lines, fresh or from the cache."""
    import warnings

    import quantize
    from quantize.evaluate.render import non_finite_warnings

    _, suite, _, bad = world
    for call in (quantize.scored, quantize.score, quantize.scored):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = call(suite, bad)
        doc = found if isinstance(found, ScoreDoc) else found.doc
        lines = [str(w.message) for w in caught if issubclass(w.category, quantize.QuantizeWarning)]
        assert lines == non_finite_warnings(doc) and any("core_prose" in line for line in lines)


def test_a_nan_candidate_is_a_regression_even_when_inconclusive_would_pass(world, tiny_model, capsys):
    """It passed before (exit 0): "ratio nan [nan, nan]" and "kl nan ± nan" came out inconclusive."""
    _, _, lenient, bad = world
    code = main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(bad), "--json", "--quiet"])
    v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    assert code == 1 and v.verdict == "rejected"
    by = {r.rule: r for r in v.rules}
    for rule in ("core_prose perplexity", "agreement kl", "core_facts acc"):
        assert by[rule].verdict == "regression" and by[rule].non_finite, rule
        assert by[rule].p_regression is None  # no test was run on NaN: no p-value to adjust
    assert main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(bad), "--quiet"]) == 1
    assert "not finite: the candidate computes NaN or infinity" in capsys.readouterr().out


def test_a_nan_candidate_is_a_regression_on_a_generation_task(world, tiny_model, capsys):
    """It passed (exit 0, exact_match 0 -> 0, no warning): a generated item carries no log-likelihood, and the NaN
    model's empty answers scored as the finite model's wrong ones. Each generated item now records the
    log-likelihood of its tokens (`generated_ll`), NaN where its logits were."""
    from conftest import ROOT

    base, _, _, bad = world
    suite = base / "answers.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'answers' / 'v1'}\nsubset: smoke\nbatch_size: 8\n")
    policy = base / "answers-policy.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: answers_facts, metric: exact_match, margin: 0.2}}\n")
    assert main(["eval", str(suite), str(bad), "--json", "--items", "--quiet"]) == 0
    out = capsys.readouterr()
    doc = records.parse(ScoreDoc, json.loads(out.out), "stdout")
    items = doc.tasks["answers_facts"].items
    assert all(math.isnan(i.generated_ll) for i in items) and len(doc.non_finite()["answers_facts"]) == len(items)
    assert "answers_facts" in out.err and "NaN or infinity" in out.err
    assert main(["eval", str(suite), str(tiny_model), "--json", "--items", "--quiet"]) == 0
    finite = records.parse(ScoreDoc, json.loads(capsys.readouterr().out), "stdout")
    assert all(i.generated_ll < 0 for i in finite.tasks["answers_facts"].items) and not finite.non_finite()
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(bad), "--json", "--quiet"])
    (rule,) = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout").rules
    assert code == 1 and rule.verdict == "regression" and rule.non_finite and rule.p_regression is None


def test_eval_shows_no_figure_for_a_task_holding_non_finite_items(world, capsys):
    """The table read "core_analogy acc 1.0000 ± 0.0000" under the warning: lm-eval's argmax over NaN
    log-likelihoods picks the first choice, and the gold is often first. A task with any non-finite item shows
    "non-finite (k of n items)", and no figure of lm-eval's beside it; its records keep what was computed."""
    _, suite, _, bad = world
    assert main(["eval", str(suite), str(bad), "--json", "--items", "--quiet"]) == 0
    doc = records.parse(ScoreDoc, json.loads(capsys.readouterr().out), "stdout")
    assert main(["eval", str(suite), str(bad), "--quiet"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:] if line.strip()}
    bad_tasks = doc.non_finite()
    assert bad_tasks and any(math.isfinite(doc.tasks[t].acc) for t in bad_tasks if hasattr(doc.tasks[t], "acc"))
    for task, ids in bad_tasks.items():
        d = doc.tasks[task]
        assert f"non-finite ({len(ids)} of {d.n} items)" in rows[task], rows[task]
        if hasattr(d, "acc"):  # the computed accuracy stays in the record, and out of the table
            assert math.isfinite(d.acc) and f"{d.acc:.4f}" not in rows[task]
    from quantize.kinds import headline  # what every display reads

    for task, ids in bad_tasks.items():
        d = doc.tasks[task]
        h = headline(d)
        assert math.isnan(h.value) and h.se is None and (h.non_finite, h.n) == (len(ids), d.n)


def test_a_card_for_a_nan_candidate_publishes_no_figure_of_it(world, tiny_model, tmp_path, capsys):
    """`gate --card` on a NaN copy published "core_facts acc 0.2917" (finite: lm-eval's argmax over NaN) into
    model-index beside a regression verdict. A rule the gate marked non-finite is in the card's section only,
    with no candidate figure, and the sweep's one-line headline says why the rule failed."""
    from huggingface_hub import ModelCard

    from quantize.gates.render import headline

    _, _, lenient, bad = world
    cand = tmp_path / "nan-card"
    shutil.copytree(bad, cand)
    args = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(cand), "--json", "--quiet"]
    assert main([*args, "--card"]) == 1
    v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    facts = next(r for r in v.rules if r.rule == "core_facts acc")
    assert facts.non_finite and math.isfinite(facts.evidence.candidate)  # the figure the card published
    card = ModelCard.load(cand / "README.md")
    assert not card.data.eval_results  # every rule of this verdict is non-finite
    row = next(line for line in card.text.splitlines() if line.startswith("| `core_facts acc`"))
    assert f"{facts.evidence.candidate:.4f}" not in row and "| non-finite |" in row
    assert "core_facts acc regression (non-finite)" in headline(v)


def test_a_nan_baseline_is_the_user_s_input_to_fix(world, tiny_model, capsys):
    _, _, lenient, bad = world
    code = main(["gate", str(lenient), "--baseline", str(bad), "--candidate", str(tiny_model), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "baseline" in err and "NaN" in err


@pytest.fixture(scope="module")
def hidden_nan(tmp_path_factory):
    """An untied tiny model and its copy with one NaN in the last row of `embed_tokens` (a token no item holds: the
    scores stay finite), and a suite and policy of two scored tasks on the world's golden set."""
    from safetensors.torch import load_file, save_file

    from conftest import make_tiny_llama

    base = tmp_path_factory.mktemp("hidden-nan")
    clean = make_tiny_llama(base / "clean", tie_word_embeddings=False)
    bad = base / "bad"
    shutil.copytree(clean, bad)
    t = load_file(str(bad / "model.safetensors"))
    t["model.embed_tokens.weight"][-1, 0] = float("nan")
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    return clean, bad


def test_a_safetensors_candidate_storing_nan_no_score_shows_fails_every_rule(world, hidden_nan, capsys):
    """A NaN in an embedding row of a token no item holds left every score finite: `eval` said nothing and the
    gate passed it (only a GGUF's tensors were scanned). Its files are scanned as a GGUF's are
    (checkpoint/finite.py): eval records and warns of the tensor, every rule of a gate on it is a regression naming
    it, and as a baseline it is refused before anything is scored; the clean model's score file is unchanged."""
    base, _, _, _ = world
    clean, bad = hidden_nan
    name = "model.embed_tokens.weight"
    suite = suite_file(base / "hidden.yaml", base / "golden" / "v1", extra="tasks: [core_facts, core_prose]\n")
    policy = base / "hidden-policy.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n"
    )
    assert main(["eval", str(suite), str(clean), "--json", "--items", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "non_finite_tensors" not in out and "NaN" not in err  # a clean checkpoint: no field written
    assert main(["eval", str(suite), str(bad), "--json", "--items", "--quiet"]) == 0
    out, err = capsys.readouterr()
    doc = records.parse(ScoreDoc, json.loads(out), "stdout")
    assert not doc.non_finite()  # every score finite: only the scan sees the NaN
    assert doc.provenance.checkpoint.non_finite_tensors == [name]
    assert f"{bad} stores NaN or infinity in 1 tensor(s) ({name})" in err
    code = main(["gate", str(policy), "--baseline", str(clean), "--candidate", str(bad), "--json", "--quiet"])
    v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    assert code == 1 and v.verdict == "rejected" and len(v.rules) == 2
    assert all(r.verdict == "regression" and name in r.non_finite for r in v.rules)
    err = gate_refused_before_scoring(policy, bad, clean, capsys)
    assert f"the baseline {bad} stores NaN or infinite values in 1 tensor(s) ({name})" in err


def test_other_records_still_refuse_non_finite_numbers(tmp_path):
    from quantize.errors import RuntimeFailure
    from quantize.records import SensitivityRecord

    rec = SensitivityRecord(key="k", kl={"layer.0": {"W4A16": float("nan")}}, seconds=1.0)
    with pytest.raises(RuntimeFailure, match=r"kl\.layer\.0\.W4A16"):
        records.write(tmp_path / "s.json", rec)
    assert not (tmp_path / "s.json").exists()


# --- cleanup touches only its own files ------------------------------------------------------------------------

DEAD = "99999999"  # no such process


def _leftover(parent: Path, name: str, kind: str = "tmp") -> Path:
    p = parent / f".{name}.{kind}-{DEAD}"
    p.mkdir(parents=True)
    return p


@pytest.mark.parametrize("name", ["o*", "llama-[8b]", "a?c"])
def test_leftovers_are_matched_by_exact_name_never_as_a_pattern(tmp_path, name):
    """`.{name}.tmp-*` was globbed with the name unescaped: `o*` and `llama-[8b]` claimed other outputs' folders."""
    from quantize.io import leftovers

    others = [_leftover(tmp_path, n) for n in ("ox", "llama-8", "abc", "o*x")]
    mine = _leftover(tmp_path, name)
    assert leftovers(tmp_path / name) == [mine]
    assert all(p.exists() for p in others)


def test_a_link_named_like_a_leftover_is_never_listed_removed_or_restored(tmp_path):
    from quantize.convert.engine import tidy_leftovers

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "quantize.json").write_text("{}")
    (tmp_path / f".out.old-{DEAD}").symlink_to(precious)
    (tmp_path / f".out.tmp-{DEAD}").symlink_to(precious)
    said = tidy_leftovers(tmp_path / "out", clean=True)
    assert not (tmp_path / "out").exists() and precious.is_dir() and (precious / "quantize.json").exists()
    assert not any("removed" in s or "restored" in s for s in said)


def test_only_a_complete_output_is_restored(tmp_path, tiny_model, capsys):
    import yaml

    from quantize.convert.engine import tidy_leftovers

    r = tmp_path / "r.yaml"
    r.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model),
                "method": "fp8",
                "scheme": "FP8_DYNAMIC",
                "calibration": None,
                "output": str(tmp_path / "done"),
            }
        )
    )
    assert main(["run", str(r), "--quiet"]) == 0, capsys.readouterr().err
    half = _leftover(tmp_path, "out", "old")  # only quantize.json left of a half-deleted output
    shutil.copy(tmp_path / "done" / "quantize.json", half / "quantize.json")
    assert tidy_leftovers(tmp_path / "out", clean=False)[0].startswith("warning") and not (tmp_path / "out").exists()
    shutil.rmtree(half)
    (tmp_path / "done").rename(tmp_path / f".out.old-{DEAD}")  # a whole output moved aside by a killed --force
    said = tidy_leftovers(tmp_path / "out", clean=False)
    assert (tmp_path / "out" / "quantize.json").is_file() and "restored" in said[0]


def test_a_dangling_output_link_is_refused_before_any_work(tmp_path, tiny_model, capsys):
    import time

    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    r = tmp_path / "r.yaml"
    r.write_text(
        f"model: {tiny_model}\nmethod: fp8\nscheme: FP8_DYNAMIC\ncalibration: null\noutput: {tmp_path / 'out'}\n"
    )
    t = time.perf_counter()
    assert main(["run", str(r), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is a link to" in err and "nowhere" in err and time.perf_counter() - t < 5


def test_the_loser_of_a_race_says_what_happened_and_exits_2(tmp_path):
    from quantize.errors import UsageError
    from quantize.io import atomic_dir

    target = tmp_path / "conc"
    with pytest.raises(UsageError, match="discarded") as e, atomic_dir(target) as tmp:
        (tmp / "w").write_text("mine")
        target.mkdir()  # the other run finished first
    assert "left in" not in str(e.value) and not any(p.name.startswith(".conc.tmp-") for p in tmp_path.iterdir())


# --- a cache that checks what it serves -----------------------------------------------------------------------


def _entry(suite: Path, ckpt: Path, trust: bool = False) -> Path:
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.score import runtime
    from quantize.evaluate.suite import open_suite

    s = open_suite(suite)
    return cache.score_path(s, identity_sha256(ckpt), runtime(s, trust, ckpt))


def _rewrite(path: Path, data: dict, digest: bool = True) -> None:
    from quantize.io import sha256_file

    path.write_text(json.dumps(data))
    if digest:  # a careful forger keeps the digest in step
        path.with_suffix(".sha256").write_text(sha256_file(path))


def test_a_flipped_item_in_a_cached_score_file_is_refused(world, tiny_model, capsys):
    """Was served as is: the summary said 0.75 while its items said 7/8."""
    _, suite, _, _ = world
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    p = _entry(suite, tiny_model)
    saved, digest = p.read_text(), p.with_suffix(".sha256").read_text()
    try:
        data = json.loads(saved)
        item = data["tasks"]["core_facts"]["items"][0]
        item["score"] = 1.0 - item["score"]
        _rewrite(p, data, digest=False)
        assert main(["eval", str(suite), str(tiny_model)]) == 2
        assert "changed after it was written" in capsys.readouterr().err
        _rewrite(p, data)
        assert main(["eval", str(suite), str(tiny_model)]) == 2
        err = capsys.readouterr().err
        assert str(p) in err and "core_facts: acc is" in err and "--refresh" in err
    finally:
        p.write_text(saved)
        p.with_suffix(".sha256").write_text(digest)


def test_another_checkpoints_scores_under_a_candidates_key_are_refused(world, tiny_model, capsys):
    """A candidate entry given the baseline's items and numbers made a NaN candidate pass in 2.6 s. The gate now
    scores the candidate itself (rejected); read from the cache on --trust-cached-candidate, the entry is refused."""
    _, suite, lenient, bad = world
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    assert main(["eval", str(suite), str(bad), "--quiet"]) == 0
    capsys.readouterr()
    good, forged = _entry(suite, tiny_model), _entry(suite, bad)
    saved = forged.read_text(), forged.with_suffix(".sha256").read_text()
    gate = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(bad), "--quiet"]
    try:
        _rewrite(forged, json.loads(good.read_text()))
        assert main(gate) == 1
        assert main([*gate, "--trust-cached-candidate"]) == 2
        err = capsys.readouterr().err
        assert "another checkpoint's or suite's scores" in err and str(forged) in err
    finally:
        forged.write_text(saved[0])
        forged.with_suffix(".sha256").write_text(saved[1])


@pytest.mark.parametrize(
    "digest",
    [b"\xff\xfe", b"not a digest\n", b"ab" * 32 + b" " * 300, b"AB" * 32 + b"\n"],
    ids=["not-utf8", "not-hex", "too-long", "upper-case"],
)
def test_a_digest_holding_no_sha256_is_exit_2_never_exit_3(world, tiny_model, tmp_path, capsys, digest):
    """A review: b"\\xff\\xfe" in a restored cache's score digest was `failed: UnicodeDecodeError`, exit 3, from
    `quantize eval` and from the report (which reads the digest to choose a runtime); the digest was read whole
    with no size cap. It is the cache's own file, sealed by us: anything but one sha256 is an entry that does not
    hold, exit 2 naming it and --refresh, as a digest the file does not hash to is; --refresh seals it again."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.score import runtime
    from quantize.evaluate.suite import open_suite
    from quantize.io import sha256_file

    _, suite, _, _ = world
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    p = _entry(suite, tiny_model)
    sealed = p.with_suffix(".sha256")
    saved = p.read_bytes(), sealed.read_bytes()
    capsys.readouterr()
    try:
        sealed.write_bytes(digest)
        assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert str(p) in err and "--refresh" in err and "failed" not in err and "Traceback" not in err
        report = ["report", str(tiny_model), "--suite", str(suite), "--out", str(tmp_path / "r")]
        assert main(report) == 2
        err = capsys.readouterr().err
        assert str(p) in err and "--refresh" in err and "failed" not in err
        s = open_suite(suite)
        with pytest.raises(UsageError, match="--refresh"):
            cache.score_file_sha256(s, identity_sha256(tiny_model), runtime(s, False, tiny_model))
        assert main(["eval", str(suite), str(tiny_model), "--refresh", "--quiet"]) == 0
        assert sealed.read_text() == f"{sha256_file(p)}\n"  # scored again, and sealed
    finally:
        p.write_bytes(saved[0])
        sealed.write_bytes(saved[1])


def test_an_entry_without_its_digest_is_never_served_but_scored_again(world, tiny_model, capsys):
    """Entries from before digests (or copied without one) carry no claim: a miss, scored again and replaced."""
    _, suite, _, _ = world
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    entry = _entry(suite, tiny_model)
    data = json.loads(entry.read_text())
    data["tasks"]["core_facts"]["acc"] = 0.99  # a stale or forged summary, no digest to vouch for it
    entry.write_text(json.dumps(data))
    entry.with_suffix(".sha256").unlink()
    capsys.readouterr()
    assert main(["eval", str(suite), str(tiny_model), "--json", "--quiet"]) == 0
    fresh = json.loads(capsys.readouterr().out)
    assert fresh["tasks"]["core_facts"]["acc"] != 0.99 and entry.with_suffix(".sha256").is_file()


def test_scores_computed_with_remote_code_are_another_entry(world, tiny_model, capsys):
    """The key left out --trust-remote-code: scores computed by a checkpoint's own code were served without it."""
    _, suite, _, _ = world
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    assert _entry(suite, tiny_model) != _entry(suite, tiny_model, trust=True)
    assert not _entry(suite, tiny_model, trust=True).exists()
    capsys.readouterr()
    assert main(["eval", str(suite), str(tiny_model), "--quiet", "--trust-remote-code", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["trust_remote_code"] is True
    assert _entry(suite, tiny_model, trust=True).is_file()


def test_scores_from_another_device_kind_or_dtype_are_another_entry(world, tiny_model, capsys):
    """The key left out the device kind and the resolved dtype: a CPU's float32 scores would be served to an
    accelerator's run (and the reverse), and the report could set one beside the other."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite

    _, suite, _, _ = world
    s, ckpt = open_suite(suite), identity_sha256(tiny_model)
    on_cpu, on_cuda = cache.Runtime.on(s, "cpu"), cache.Runtime.on(s, "cuda:1")
    assert (on_cpu.device_kind, on_cpu.dtype) == ("cpu", "float32") and (on_cuda.device_kind, on_cuda.dtype) == (
        "cuda",
        "auto",  # "auto" on an accelerator: the checkpoint's own dtype
    )
    assert cache.Runtime.on(s, "cuda:0") == on_cuda  # the index is not a kind
    paths = {cache.score_path(s, ckpt, r) for r in cache.runtimes(s)}
    # five kinds, with and without remote code; and llama.cpp's (a GGUF's) where it is installed
    engines = 1 if cache.llamacpp_version() is not None else 0
    assert len(paths) == len(cache.runtimes(s)) == 10 + engines
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    assert cache.lookup_scores(s, ckpt, on_cpu) is not None and cache.lookup_scores(s, ckpt, on_cuda) is None
    # a CPU entry copied to the accelerator's path is refused by what it says it ran on, not served
    src, dst = cache.score_path(s, ckpt, on_cpu), cache.score_path(s, ckpt, on_cuda)
    try:
        dst.write_bytes(src.read_bytes())
        dst.with_suffix(".sha256").write_bytes(src.with_suffix(".sha256").read_bytes())
        with pytest.raises(UsageError, match="another checkpoint's or suite's scores"):
            cache.lookup_scores(s, ckpt, on_cuda)
    finally:
        dst.unlink(missing_ok=True)
        dst.with_suffix(".sha256").unlink(missing_ok=True)


@pytest.fixture
def torch_threads():
    """Torch's thread count as it was, put back after a test that scores under another (a load pins it)."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_an_activation_rounding_checkpoints_scores_are_keyed_by_cpu_and_threads(
    world, tiny_model, tmp_path, monkeypatch, capsys, torch_threads
):
    """FP8 dynamic's scores moved by up to 1.26 nats a request between 1 and 2 torch threads (docs/results.md), and
    the key named neither: a score computed at one count was served to a run at another, and a sweep's 1-thread
    candidate scores read as a gate's 2-thread ones. Now such an entry names the CPU and the thread count, each load
    pins torch to the count its key names, and a weight-only checkpoint's entry stays one shared entry."""
    import torch

    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.score import runtime
    from quantize.evaluate.suite import open_suite
    from quantize.machine import cpu_kernels

    _, suite, _, _ = world
    fp8 = tmp_path / "fp8"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {tiny_model}\nmethod: fp8\nscheme: FP8_DYNAMIC\ncalibration: null\noutput: {fp8}\n")
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    s, fp8_id = open_suite(suite), identity_sha256(fp8)

    def scored(threads: int) -> dict:
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(3 - threads)  # whoever set it before: the load pins it
        capsys.readouterr()
        assert main(["eval", str(suite), str(fp8), "--json", "--quiet"]) == 0
        assert torch.get_num_threads() == threads
        doc = json.loads(capsys.readouterr().out)["provenance"]
        assert main(["eval", str(suite), str(fp8), "--quiet"]) == 0  # read back from the cache, said in its text
        said = "1 thread)" if threads == 1 else f"{threads} threads)"
        assert f"cached; on {cpu_kernels()}, {said}" in capsys.readouterr().out
        return doc

    one = scored(1)
    assert (one["cpu"], one["threads"]) == (cpu_kernels(), 1)
    on_one = runtime(s, False, fp8)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    on_two = runtime(s, False, fp8)
    assert (on_one.threads, on_two.threads) == (1, 2) and cache.score_path(s, fp8_id, on_one) != cache.score_path(
        s, fp8_id, on_two
    )
    assert cache.lookup_scores(s, fp8_id, on_two) is None  # not served to a run at another count
    assert scored(2)["threads"] == 2
    # the 1-thread entry copied to the 2-thread path is refused by what it says it ran on, not served
    src, dst = cache.score_path(s, fp8_id, on_one), cache.score_path(s, fp8_id, on_two)
    dst.write_bytes(src.read_bytes())
    dst.with_suffix(".sha256").write_bytes(src.with_suffix(".sha256").read_bytes())
    with pytest.raises(UsageError, match="another checkpoint's or suite's scores"):
        cache.lookup_scores(s, fp8_id, on_two)
    dst.unlink()
    # weights alone rounded: one entry whatever the count, its file naming neither (its bytes as before)
    base_id = identity_sha256(tiny_model)
    assert runtime(s, False, tiny_model) == cache.Runtime.on(s, "cpu") and on_two.rounding(False) == runtime(
        s, False, tiny_model
    )
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    entry = json.loads(cache.score_path(s, base_id, runtime(s, False, tiny_model)).read_text())["provenance"]
    assert "cpu" not in entry and "threads" not in entry
    # an accelerator's runtime is keyed by its kind alone (not measured across its models)
    assert cache.Runtime.on(s, "cuda", rounds=True) == cache.Runtime.on(s, "cuda")
    # the verdict names where the candidate's numbers were computed, and says why it matters; the baseline none
    _, _, lenient, _ = world
    capsys.readouterr()
    gate = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(fp8)]
    assert main([*gate, "--json", "-q"]) in (0, 1)
    verdict = json.loads(capsys.readouterr().out)
    sides = verdict["provenance"]
    assert (sides["candidate"]["cpu"], sides["candidate"]["threads"]) == (cpu_kernels(), 2)
    assert "cpu" not in sides["baseline"] and "threads" not in sides["baseline"]
    main(gate)
    out = capsys.readouterr().out
    assert f"candidate was computed on {cpu_kernels()} at 2 threads:" in out and "baseline was computed" not in out
    from quantize.gates.render import render_markdown, render_text

    v = records.parse(Verdict, verdict, "stdout")
    assert "The candidate was computed on" in render_markdown(v)
    # the report reads the FP8 scores under this CPU and thread count, and says so under its table
    capsys.readouterr()
    report = ["report", str(fp8), "--baseline", str(tiny_model), "--suite", str(suite), "--out", str(tmp_path / "r")]
    assert main(report) == 0, capsys.readouterr().err
    said = (tmp_path / "r" / "report.md").read_text()
    assert f"`r` on `{cpu_kernels()}` at 2 threads." in said  # the entry of recipe r.yaml; the baseline rounds nothing
    # a forged score file's CPU name is printed as its characters, starting no line of its own
    forged = v.provenance.candidate.model_copy(update={"cpu": "x\n# PASS"})
    v = v.model_copy(update={"provenance": v.provenance.model_copy(update={"candidate": forged})})
    assert not [line for line in (render_text(v) + render_markdown(v)).splitlines() if line.startswith("# PASS")]


def test_scores_computed_at_another_thread_count_than_their_key_are_not_cached(
    world, tmp_path, tiny_model, monkeypatch, capsys, torch_threads
):
    """The key's count is read when the key is made, the pin applied at the load: something that moved torch's
    count between the load and the end of the scoring would file the numbers under the wrong count. Exit 3,
    nothing cached."""
    import torch

    from quantize.checkpoint.files import identity_sha256
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate import cache
    from quantize.evaluate.score import runtime
    from quantize.evaluate.suite import open_suite

    _, suite, _, _ = world
    fp8 = tmp_path / "fp8"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {tiny_model}\nmethod: fp8\nscheme: FP8_DYNAMIC\ncalibration: null\noutput: {fp8}\n")
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))  # nothing of another test's served
    pinned = LastModel.get

    def moved(self, *args, **kwargs):
        got = pinned(self, *args, **kwargs)
        torch.set_num_threads(1)
        return got

    monkeypatch.setattr(LastModel, "get", moved)
    capsys.readouterr()
    assert main(["eval", str(suite), str(fp8)]) == 3
    assert "computed with torch at 1 thread, but its cache key names 2" in capsys.readouterr().err
    s = open_suite(suite)
    assert not cache.score_path(s, identity_sha256(fp8), runtime(s, False, fp8)).exists()


def test_the_cpu_in_the_key_is_what_its_kernels_see(world, tmp_path, monkeypatch):
    """Torch's own kernels at their default level instead of AVX2 moved FP8 dynamic's scores by up to 1.62 nats a
    request on one CPU (benchmarks/isa_variance.py), and a VM's masked model name ("AMD EPYC", "Intel(R) Xeon(R)
    Processor") covers CPUs with and without AVX-512: an activation-rounding entry names the CPU's SIMD extensions
    and any variable that caps its kernels, so such CPUs and settings never share one."""
    from quantize import machine
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite

    _, suite, _, _ = world
    s = open_suite(suite)
    for v in machine.KERNEL_VARIABLES:
        monkeypatch.delenv(v, raising=False)

    def on(cpuinfo: str) -> cache.Runtime:
        path = tmp_path / f"cpuinfo-{len(cpuinfo)}-{hash(cpuinfo)}"
        path.write_text(cpuinfo)
        monkeypatch.setattr(machine, "CPUINFO", path)
        return cache.Runtime.on(s, "cpu", rounds=True)

    masked = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma f16c avx2 smep {}\n\n"
    zen3, zen4 = on(masked.format("")), on(masked.format("avx512f avx512bw avx512_bf16"))
    assert zen3.cpu == "AMD EPYC (avx avx2 f16c fma)"  # smep: a protection flag, not an x86 SIMD one
    assert zen4.cpu == "AMD EPYC (avx avx2 avx512_bf16 avx512bw avx512f f16c fma)"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    capped = on(masked.format(""))
    assert capped.cpu == "AMD EPYC (avx avx2 f16c fma; ATEN_CPU_CAPABILITY=default)"
    assert len({cache.score_path(s, "0" * 64, r) for r in (zen3, zen4, capped)}) == 3
    arm = on("processor\t: 0\nFeatures\t: fp asimd sve sve2 i8mm bf16 sme2 evtstrm\nCPU part\t: 0xd40\n")
    assert arm.cpu.endswith("(asimd bf16 i8mm sme2 sve sve2; ATEN_CPU_CAPABILITY=default)")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert on("").cpu == machine.cpu_name()  # nothing listed: the platform's machine name alone
    assert cache.Runtime.on(s, "cpu", rounds=False).cpu is None  # weight-only entries name no machine


@pytest.mark.parametrize("value", ["many", "0", "-2", "99999"])
def test_a_bad_thread_count_is_the_users_to_fix(tiny_model, world, monkeypatch, capsys, value):
    _, suite, _, _ = world
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "OMP_NUM_THREADS" in err and repr(value) in err and "Traceback" not in err


def test_the_thread_count_reads_torchs_variable_else_this_processs_cpus(monkeypatch):
    import os

    from quantize import machine

    monkeypatch.setenv("OMP_NUM_THREADS", " 3,1 ")  # torch reads a nested list's first number
    assert machine.threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert machine.threads() == machine.physical_cores(os.sched_getaffinity(0)) <= len(os.sched_getaffinity(0))


def test_the_default_thread_count_is_the_physical_cores_this_process_may_use(tmp_path, monkeypatch):
    """Torch's own default is one thread per physical core; hyperthreads of one core count once, and only the
    CPUs of the process's affinity count."""
    from quantize import machine

    for cpu, (package, core) in enumerate([(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0)]):  # 2 threads a core
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(machine, "TOPOLOGY", tmp_path)
    assert machine.physical_cores(set(range(6))) == 3  # (0, 0), (0, 1), (1, 0): one package's core 0 is not another's
    assert machine.physical_cores({0, 1}) == 1 and machine.physical_cores({1, 2, 4}) == 3
    assert machine.physical_cores({0, 7}) == 2  # a CPU without its topology: every CPU counted
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {2, 3})
    assert machine.threads() == 1


def test_the_gate_refuses_score_files_from_two_device_kinds(world, tiny_model, tmp_path, capsys):
    _, suite, _, _ = world
    assert main(["eval", str(suite), str(tiny_model), "--json", "--items", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    base, cand = tmp_path / "base.json", tmp_path / "cand.json"
    base.write_text(json.dumps(doc))
    doc["provenance"]["device"] = "cuda:0"
    cand.write_text(json.dumps(doc))
    accuracy = tmp_path / "accuracy.yaml"  # score files need a policy without agreement rules
    accuracy.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n")
    assert main(["gate", str(accuracy), "--baseline", str(base), "--candidate", str(base), "-q"]) == 0
    assert main(["gate", str(accuracy), "--baseline", str(base), "--candidate", str(cand)]) == 2
    assert "device kind: baseline 'cpu' vs candidate 'cuda'" in capsys.readouterr().err


def test_the_report_reads_one_runtime_for_every_entry(world, tiny_model, tmp_path, monkeypatch):
    """The runtime under which the baseline has scores, whatever the others have."""
    from types import SimpleNamespace

    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite
    from quantize.report.collect import report_runtime

    _, suite, _, _ = world
    s = open_suite(suite)
    on_cuda = cache.Runtime.on(s, "cuda")
    base = SimpleNamespace(sha256="b" * 64, path=tmp_path / "b", rounds_activations=False)  # folders, not GGUFs
    cands = [SimpleNamespace(sha256=c * 64, path=tmp_path / c, rounds_activations=False) for c in "cde"]
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path))
    assert report_runtime(s, [base]) == cache.runtimes(s)[0] == cache.Runtime.on(s, "cpu")  # nothing: the first
    for e, run in [(base, on_cuda), *((c, cache.Runtime.on(s, "cpu")) for c in cands)]:
        digest = cache.score_path(s, e.sha256, run).with_suffix(".sha256")
        digest.parent.mkdir(parents=True, exist_ok=True)
        digest.write_text("0" * 64)
    assert report_runtime(s, [base, *cands], base) == on_cuda  # the baseline's, though three candidates have CPU scores
    assert report_runtime(s, cands) == cache.runtimes(s)[0]
    # nothing scored, agreement measured on an accelerator (`quantize agree` on a GPU): its runtime, so the report
    # shows those agreements (it read the CPU's and showed none, found on an H200)
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "agreed"))
    on_cpu = cache.Runtime.on(s, "cpu")
    agreed = cache.agreement_path(s, base.sha256, cands[1].sha256, on_cuda)
    agreed.parent.mkdir(parents=True)
    agreed.write_text("{}")
    assert report_runtime(s, [base]) == on_cpu and report_runtime(s, [base, *cands], base) == on_cuda
    # scores come first: the baseline scored on the CPU outweighs agreements on the accelerator
    digest = cache.score_path(s, base.sha256, on_cpu).with_suffix(".sha256")
    digest.parent.mkdir(parents=True, exist_ok=True)
    digest.write_text("0" * 64)
    assert report_runtime(s, [base, *cands], base) == on_cpu


def test_the_report_reads_a_rounding_checkpoint_under_this_machine(world, tmp_path, monkeypatch):
    """An entry whose config.json rounds activations is read (and counted when the report picks its runtime) under
    this machine's CPU and thread count; one that rounds weights alone under the report's one runtime."""
    from types import SimpleNamespace

    from quantize.checkpoint.rounding import stored_rounds_activations
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite
    from quantize.report.collect import entry_runtime, report_runtime

    _, suite, _, _ = world
    s = open_suite(suite)
    qc = {"quant_method": "compressed-tensors", "config_groups": {"g": {"input_activations": {"num_bits": 8}}}}
    rounding = []
    for name in "ef":
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"quantization_config": qc}))
        rounds = stored_rounds_activations(tmp_path / name)  # as the report reads an entry (collect._entry)
        rounding.append(SimpleNamespace(sha256=name * 64, path=tmp_path / name, rounds_activations=rounds))
    weights = SimpleNamespace(sha256="a" * 64, path=tmp_path / "a", rounds_activations=False)
    assert not stored_rounds_activations(weights.path)  # no config.json: rounds nothing
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    on_cpu, on_cuda = cache.Runtime.on(s, "cpu"), cache.Runtime.on(s, "cuda")
    assert entry_runtime(s, rounding[0], on_cpu) == cache.Runtime.on(s, "cpu", rounds=True) != on_cpu
    assert entry_runtime(s, rounding[0], on_cpu).threads == 1 and entry_runtime(s, weights, on_cpu) == on_cpu
    assert entry_runtime(s, rounding[0], on_cuda) == on_cuda
    for e, run in [*((e, on_cpu.rounding(True)) for e in rounding), (weights, on_cuda)]:
        digest = cache.score_path(s, e.sha256, run).with_suffix(".sha256")
        digest.parent.mkdir(parents=True, exist_ok=True)
        digest.write_text("0" * 64)
    assert report_runtime(s, [*rounding, weights]) == on_cpu  # two scored on this CPU, one on an accelerator
    # scored at another thread count on this CPU (a sweep's task at its own): read, under that count
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert entry_runtime(s, rounding[0], on_cpu).threads == 1
    assert entry_runtime(s, weights, on_cpu) == on_cpu
    unscored = SimpleNamespace(sha256="9" * 64, path=rounding[0].path, rounds_activations=True)
    assert entry_runtime(s, unscored, on_cpu).threads == 2  # none anywhere: this process's count


def test_the_verdict_names_its_score_files_and_a_policy_can_pin_the_baseline(world, tiny_model, tmp_path, capsys):
    _, suite, lenient, _ = world
    gate = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json", "-q"]
    code = main(gate)
    v = json.loads(capsys.readouterr().out)
    assert code == 0
    digest = _entry(suite, tiny_model).with_suffix(".sha256").read_text().strip()
    # the candidate was scored in this run (no file), and its scores did not replace the baseline's entry
    assert v["provenance"]["score_files"] == {"baseline": digest, "candidate": None}
    assert v["provenance"]["candidate_scores"] == "computed"
    assert _entry(suite, tiny_model).with_suffix(".sha256").read_text().strip() == digest
    assert main([*gate, "--trust-cached-candidate"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["provenance"]["score_files"] == {"baseline": digest, "candidate": digest}
    assert v["provenance"]["candidate_scores"] == "cache"
    pinned = tmp_path / "pinned.yaml"
    for pin, want in (("0" * 64, 2), (digest, 0)):
        pinned.write_text(lenient.read_text() + f"baseline_scores_sha256: '{pin}'\n")
        assert main(["gate", str(pinned), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "-q"]) == want
        if want == 2:
            assert "pins the baseline's score file" in capsys.readouterr().err


def test_a_pinned_baseline_without_its_file_is_refused_before_scoring(world, tiny_model, tmp_path, capsys, monkeypatch):
    """No cache entry matches the pin: the gate stops at once instead of scoring the baseline and then refusing."""
    _, _, lenient, _ = world
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "empty"))
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(lenient.read_text() + f"baseline_scores_sha256: '{'1' * 64}'\n")
    assert main(["gate", str(pinned), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "-q"]) == 2
    assert "would be scored here" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "scores").exists()


def test_a_corrupt_baseline_top_k_is_named_not_a_crash(world, tiny_model, capsys):
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite

    _, suite, lenient, _ = world
    assert main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "-q"]) == 0
    from quantize.evaluate.score import runtime

    s = open_suite(suite)
    p = cache.baseline_topk_path(s, identity_sha256(tiny_model), runtime(s, False, tiny_model))
    kept = p.read_bytes()
    try:
        p.write_bytes(kept[: len(kept) // 2])  # truncated
        code = main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "-q"])
        err = capsys.readouterr().err
        assert code == 2 and str(p) in err and "delete it" in err
    finally:
        p.write_bytes(kept)


def test_agreement_entries_are_served_only_beside_a_digest_they_match(world, tiny_model, tmp_path, capsys):
    """The baseline's top-k (which every gate reads) and a stored comparison (`quantize agree`) are checked on
    read like score files: a changed byte is named (exit 2), an entry without its digest is measured again. The
    candidate is a copy of the baseline (one identity: `agree` leaves out a candidate that is the baseline's own
    folder, so on that folder it measured nothing and this test held only after tests that had stored both)."""
    from quantize.cache import digest_path, seal
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.score import runtime
    from quantize.evaluate.suite import open_suite

    _, suite, lenient, _ = world
    s = open_suite(suite)
    sha, run = identity_sha256(tiny_model), runtime(s, False, tiny_model)
    copy = shutil.copytree(tiny_model, tmp_path / "copy")
    assert main(["agree", str(suite), "--baseline", str(tiny_model), str(copy), "-q"]) == 0
    topk, cmp = cache.baseline_topk_path(s, sha, run), cache.agreement_path(s, sha, sha, run)
    assert digest_path(topk).is_file() and digest_path(cmp).is_file()
    saved = {f: f.read_bytes() for f in (topk, cmp, digest_path(topk), digest_path(cmp))}
    gate = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "-q"]
    try:
        data = json.loads(cmp.read_text())
        data["kl_mean"] = 0.5  # a forged comparison (an A/A one is 0), its digest left as it was
        cmp.write_text(json.dumps(data))
        with pytest.raises(UsageError) as e:
            cache.lookup_agreement(s, sha, sha, run)
        assert str(cmp) in str(e.value) and "delete it" in str(e.value)
        # a careful forger keeps the digest in step: another pair's comparison under this pair's name is refused
        data = json.loads(saved[cmp]) | {"candidate_identity": "0" * 64}
        cmp.write_text(json.dumps(data))
        seal(cmp)
        with pytest.raises(UsageError, match="compares other checkpoints"):
            cache.lookup_agreement(s, sha, sha, run)
    finally:
        for f, b in saved.items():
            f.write_bytes(b)
    topk.write_bytes(saved[topk][:-1] + bytes([saved[topk][-1] ^ 1]))  # one bit of the top-k
    try:
        assert main(gate) == 2
        err = capsys.readouterr().err
        assert str(topk) in err and "sha256" in err and "delete it" in err
    finally:
        topk.write_bytes(saved[topk])
    digest_path(topk).unlink()  # from before digests: nothing vouches for it, so it is computed again
    assert main(gate) == 0
    assert digest_path(topk).read_bytes() == saved[digest_path(topk)]  # the same top-k, sealed again


# --- a restored cache may supply the baseline, never the candidate ---------------------------------------------

STAGED = "sequential: {looks: [0.5, 1.0], stable_fraction: 0.5}\n"


def _design(lenient: Path, design: str, tmp_path: Path, agreement: bool = True) -> Path:
    """The lenient policy in the fixed design (every item scored) or the staged one; without its agreement rule
    where `agreement` is false (agreement is always measured in the run: scores alone are what a cache supplies)."""
    text = lenient.read_text()
    if not agreement:
        text = "".join(line for line in text.splitlines(keepends=True) if "agreement:" not in line)
    p = tmp_path / f"{design}-{agreement}.yaml"
    p.write_text(text + (STAGED if design == "staged" else ""))
    return p


def _forge_candidate_entry(suite: Path, good: Path, bad: Path) -> Path:
    """The baseline's scores under the NaN candidate's key, identity and path, digest in step: an entry every check
    on read accepts (what a writer of the cache store can plant)."""
    from quantize.checkpoint.files import identity_sha256, weights_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.score import runtime
    from quantize.evaluate.suite import open_suite

    s, run, bad_id = open_suite(suite), runtime(open_suite(suite), False, bad), identity_sha256(bad)
    data = json.loads(_entry(suite, good).read_text())
    data["key"] = cache.score_key(s, bad_id, run)
    ref = {"path": str(bad), "weights_sha256": weights_sha256(bad), "identity_sha256": bad_id}
    data["provenance"]["checkpoint"] = ref
    forged = cache.score_path(s, bad_id, run)
    _rewrite(forged, data)
    assert cache.lookup_scores(s, bad_id, run) is not None  # served by every check on read
    return forged


def test_agreement_entries_of_another_scorer_revision_are_not_served(world, monkeypatch):
    """A comparison, a baseline's top-k or a search's sensitivities computed by another revision of the agreement
    scorer (cache.AGREEMENT_REVISION: 3 moved the head to the scored positions, other float rounding) are
    measured again, never read as this revision's."""
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite
    from quantize.records import AgreementResult

    s = open_suite(world[1])
    run, base, cand = cache.Runtime("cpu", "float32"), "b" * 64, "c" * 64
    a = s.suite.agreement
    figures = dict(positions=3, items=1, clusters=1, kl_mean=0.1, kl_se=0.0, kl_p99=0.1, top1=1.0, top1_se=0.0)
    ids = dict(baseline_identity=base, candidate_identity=cand)
    setting = dict(top_k=a.top_k, per_task=a.per_task, tasks=s.agreement_tasks)
    result = AgreementResult(**figures, sum_min=0.9, sum_min_se=0.0, note="", **ids, **setting)
    cache.store_agreement(s, result, run)
    assert cache.lookup_agreement(s, base, cand, run) == result
    topk, sens = cache.baseline_topk_path(s, base, run), cache.sensitivity_key(s, base, {})
    monkeypatch.setattr(cache, "AGREEMENT_REVISION", cache.AGREEMENT_REVISION + 1)
    assert cache.lookup_agreement(s, base, cand, run) is None
    assert cache.baseline_topk_path(s, base, run) != topk and cache.sensitivity_key(s, base, {}) != sens


def test_agreement_entries_are_keyed_by_the_suite_settings_the_scorer_reads(world, tmp_path):
    """The agreement scorer pads a batch's rows to one width (batch_size), cuts them at the context window
    (max_length) and is the suite's backend: each moved a KL in review (max_length 16: 1.54e-6 against 1.88e-6;
    batch size 1 against 8: 1.5387e-6 against 1.5397e-6), while a suite differing only there was served the other's
    cached comparison and baseline top-k. Each is in the key now."""
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite

    text = Path(world[1]).read_text()
    run, base = cache.Runtime("cpu", "float32"), "b" * 64
    paths = set()
    for n, extra in enumerate(["", "max_length: 16\n", "batch_size: 1\n"]):
        f = tmp_path / f"s{n}.yaml"
        f.write_text("".join(line for line in text.splitlines(True) if not line.startswith("batch_size")) + extra)
        paths.add(cache.baseline_topk_path(open_suite(f), base, run))
    assert len(paths) == 3


def test_entries_are_keyed_by_the_libraries_that_compute_them(world, monkeypatch):
    """torch, transformers, tokenizers, compressed-tensors and datasets compute or feed every number: an upgrade of
    one scores again. Before, only lm-eval's version keyed an entry (the CI restore key held the others)."""
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite

    s = open_suite(world[1])
    run, base = cache.Runtime("cpu", "float32"), "b" * 64
    before = cache.score_key(s, base, run), cache.baseline_topk_path(s, base, run)
    keyed = {d for d, _ in cache.library_versions()}
    assert keyed == set(cache.SCORING_DISTRIBUTIONS) - {"quantize"} and {"torch", "tokenizers"} <= keyed
    upgraded = tuple((d, "99.0" if d == "transformers" else v) for d, v in cache.library_versions())
    monkeypatch.setattr(cache, "library_versions", lambda: upgraded)
    assert cache.score_key(s, base, run) != before[0] and cache.baseline_topk_path(s, base, run) != before[1]


def test_an_openmp_thread_limit_is_in_the_runtime_key(world, monkeypatch):
    """OMP_THREAD_LIMIT=1 makes OpenMP compute on one thread while torch (and the key's thread count) says two: a
    float sum took the one-thread bits in review. A rounding checkpoint's entry names it as a kernel variable."""
    from quantize import machine
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite

    s = open_suite(world[1])
    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    free = cache.Runtime.on(s, "cpu", rounds=True)
    monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
    limited = cache.Runtime.on(s, "cpu", rounds=True)
    assert "OMP_THREAD_LIMIT=1" in limited.cpu and free.key() != limited.key()
    assert "OMP_THREAD_LIMIT" in machine.KERNEL_VARIABLES


def test_a_comparison_is_keyed_by_the_baselines_runtime_too(world):
    """A GGUF baseline's top-k is llama.cpp's: a comparison measured against it under one llama-cpp-python (or its
    threads and n_batch) is not served once the baseline's engine moved, nor read as a same-runtime comparison."""
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite
    from quantize.records import AgreementResult

    s = open_suite(world[1])
    run, base, cand = cache.Runtime("cpu", "float32"), "d" * 64, "e" * 64  # ids no other test stores
    engine = cache.Runtime("cpu", "file", engine="llamacpp-1 llama-cpp-python 0.3.36 threads 2 n_batch 512")
    moved = cache.Runtime("cpu", "file", engine="llamacpp-1 llama-cpp-python 0.3.37 threads 2 n_batch 512")
    a = s.suite.agreement
    figures = dict(positions=3, items=1, clusters=1, kl_mean=0.1, kl_se=0.0, kl_p99=0.1, top1=1.0, top1_se=0.0)
    ids = dict(baseline_identity=base, candidate_identity=cand)
    setting = dict(top_k=a.top_k, per_task=a.per_task, tasks=s.agreement_tasks)
    result = AgreementResult(**figures, sum_min=0.9, sum_min_se=0.0, note="", **ids, **setting)
    cache.store_agreement(s, result, run, engine)
    assert cache.lookup_agreement(s, base, cand, run, engine) == result
    assert cache.lookup_agreement(s, base, cand, run, moved) is None
    assert cache.lookup_agreement(s, base, cand, run) is None  # a folder baseline under the candidate's runtime
    assert cache.agreement_path(s, base, cand, run, run) == cache.agreement_path(s, base, cand, run)


@pytest.mark.parametrize("design", ["fixed", "staged"])
def test_a_forged_candidate_entry_is_not_served_unless_asked_for(world, tiny_model, tmp_path, capsys, design):
    """A NaN candidate passed both designs in 5-6 s on an entry with a consistent .sha256: the gate now scores the
    candidate in the run (rejected), and reads the cache for it only on --trust-cached-candidate, which the verdict
    records. Served the forged clean scores, it is still rejected: its weights are scanned (checkpoint/finite.py),
    and every rule names the tensor storing NaN."""
    _, suite, lenient, bad = world
    assert main(["eval", str(suite), str(tiny_model), "--quiet"]) == 0
    forged = _entry(suite, bad)
    saved = {f: f.read_bytes() for f in (forged, forged.with_suffix(".sha256")) if f.is_file()}
    policy = _design(lenient, design, tmp_path, agreement=False)
    gate = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(bad)]
    try:
        _forge_candidate_entry(suite, tiny_model, bad)
        capsys.readouterr()
        assert main([*gate, "--json", "-q"]) == 1
        v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
        assert v.verdict == "rejected" and v.provenance.candidate_scores == "computed"
        assert v.provenance.score_files["candidate"] is None
        assert main([*gate, "--json", "-q", "--trust-cached-candidate"]) == 1
        v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
        assert v.verdict == "rejected" and v.provenance.candidate_scores == "cache"
        assert all(
            "stores NaN or infinity in 1 tensor(s) (model.layers.1.mlp.down_proj.weight)" in r.non_finite
            for r in v.rules
        )
        assert v.provenance.score_files["candidate"] == forged.with_suffix(".sha256").read_text().strip()
        assert any("--trust-cached-candidate" in n for n in v.notes)
    finally:
        for f in (forged, forged.with_suffix(".sha256")):
            f.unlink(missing_ok=True)
        for f, b in saved.items():
            f.write_bytes(b)


def test_a_candidate_scored_in_the_gate_fills_an_empty_cache_entry(world, tiny_model, tmp_path, monkeypatch):
    """What the gate computed is kept for the report where the cache has nothing for it (never over an entry)."""
    _, suite, lenient, _ = world
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cold"))
    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 0.01}))
    assert main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(other), "-q"]) in (0, 1)
    kept = _entry(suite, other)
    assert kept.is_file() and kept.with_suffix(".sha256").is_file()
    doc = records.read(ScoreDoc, kept)
    assert doc.provenance.checkpoint.path == str(other)


# --- identities nobody can borrow --------------------------------------------------------------------------------


def _hub_snapshot(root: Path, checkpoint: Path, repo: str, weights_blob: str | None = None) -> Path:
    """The layout snapshot_download leaves (models--ORG--NAME/{blobs/NAME, snapshots/REV/FILE -> ../../blobs/NAME}),
    the weights' blob named `weights_blob` (default: their sha256, as on the Hub), other files by a 40-hex git sha."""
    from quantize.io import sha256_file

    repo_dir = root / f"models--{repo}"
    snap = repo_dir / "snapshots" / ("ab" * 20)
    (repo_dir / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(checkpoint.iterdir()):
        git_sha = sha256_file(f)[:40]  # what the Hub names a small file's blob by
        name = (weights_blob or sha256_file(f)) if f.suffix == ".safetensors" else git_sha
        shutil.copyfile(f, repo_dir / "blobs" / name)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / name)
    return snap


@pytest.mark.parametrize("design", ["fixed", "staged"])
def test_a_hub_blob_named_with_the_baseline_s_hash_is_refused_not_passed(
    world, tiny_model, tmp_path, capsys, monkeypatch, design
):
    """NaN weights in a blob named with the baseline's sha256 borrowed its identity, got its cached scores, and
    passed both designs (exit 0 in ~4 s). The gate reads the blobs back while it scores: exit 2 naming the blob,
    the sha256 it claims and the one it has; no verdict, and nothing it computed is cached under the borrowed
    identity."""
    from quantize.checkpoint.files import REREAD, identity_sha256
    from quantize.io import sha256_file

    _, suite, lenient, bad = world
    claimed, actual = sha256_file(tiny_model / "model.safetensors"), sha256_file(bad / "model.safetensors")
    base = _hub_snapshot(tmp_path / "hub", tiny_model, "org--base")
    cand = _hub_snapshot(tmp_path / "hub", bad, "org--cand", weights_blob=claimed)
    assert identity_sha256(cand) == identity_sha256(base)  # the borrowed identity
    assert main(["eval", str(suite), str(base), "--quiet"]) == 0
    entry = _entry(suite, base)
    digest = entry.with_suffix(".sha256").read_text()
    blob = cand.parent.parent / "blobs" / claimed
    gate = ["gate", str(_design(lenient, design, tmp_path)), "--baseline", str(base), "--candidate", str(cand), "-q"]
    for extra in ([], ["--trust-cached-candidate"]):
        capsys.readouterr()
        assert main([*gate, "--json", *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and str(blob) in err and claimed in err and actual in err
    assert entry.with_suffix(".sha256").read_text() == digest  # the baseline's entry is still the baseline's
    monkeypatch.setenv(REREAD, "1")  # --reread-weights: checked before anything (restored when the test ends)
    assert main([*gate, "--reread-weights"]) == 2
    assert str(blob) in capsys.readouterr().err


def test_a_lying_blob_leaves_nothing_cached_under_the_identity_it_borrowed(
    world, tiny_model, tmp_path, capsys, monkeypatch
):
    """Where the borrowed identity had nothing cached yet, `gate --trust-cached-candidate` scored the candidate and
    stored its scores and agreement before the blob check refused it; `golden size` and a sweep's baseline task
    never checked blobs: each left the liar's figures cached under the other model's identity, and a later plain
    gate of that model passed (a review's repros). Each refuses, and nothing is cached under that identity."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.flows.gate import score_baseline
    from quantize.io import sha256_file

    _, suite, lenient, bad = world
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    liar = _hub_snapshot(tmp_path / "hub", tiny_model, "org--liar", weights_blob=sha256_file(bad / "model.safetensors"))
    assert identity_sha256(liar) == identity_sha256(bad)  # the NaN model's identity, the tiny model's bytes
    gate = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(liar), "-q"]
    assert main([*gate, "--trust-cached-candidate"]) == 2
    assert main(["golden", "size", str(suite), "--baseline", str(liar), "--candidate", str(tiny_model)]) == 2
    with pytest.raises(UsageError, match="blob"):
        score_baseline(lenient, liar)
    capsys.readouterr()
    assert not _entry(suite, bad).exists()  # no scores under the borrowed identity
    assert not [p for p in (tmp_path / "cache").rglob("*") if identity_sha256(bad)[:16] in p.name]


def test_a_true_hub_snapshot_is_read_back_and_passes(world, tiny_model, tmp_path, capsys, monkeypatch):
    """A snapshot whose names hold: its blob is read back once (in the background), same identity, same verdict."""
    from quantize.checkpoint import files

    _, _, lenient, _ = world
    base = _hub_snapshot(tmp_path / "hub", tiny_model, "org--base")
    checked, real = [], files.check_blob
    monkeypatch.setattr(files, "check_blob", lambda f, name: (checked.append(name), real(f, name)))
    code = main(["gate", str(lenient), "--baseline", str(base), "--candidate", str(tiny_model), "--json", "-q"])
    out = capsys.readouterr().out
    assert code == 0 and records.parse(Verdict, json.loads(out), "stdout").verdict == "pass"
    assert checked == [files.hub_blob_sha256(base / "model.safetensors")]


# --- safetensors header metadata ---------------------------------------------------------------------------------


def _with_metadata(src: Path, dst: Path, meta) -> Path:
    """A copy of the checkpoint whose header's __metadata__ is `meta` (the tensors untouched)."""
    import struct

    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n]) | {"__metadata__": meta}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    f.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return dst


@pytest.mark.parametrize("meta", [[], "", 0, False, 1.5, {"format": 1}, {"format": None}])
def test_header_metadata_of_the_wrong_type_is_exit_2_naming_the_file(
    world, tiny_model, tmp_path, capsys, monkeypatch, meta
):
    """`__metadata__: []` (or "", 0, false) passed the header check; eval, gate and run then ended in exit 3 after
    8-10 s and 600 MB. Now exit 2 naming the file, before anything is scored or loaded."""
    from quantize.evaluate import score as score_mod

    _, suite, lenient, _ = world
    ckpt = _with_metadata(tiny_model, tmp_path / "meta", meta)

    def never(*_a, **_k):
        raise AssertionError("scored a checkpoint whose header is invalid")

    monkeypatch.setattr(score_mod, "run_lm_eval", never)
    capsys.readouterr()
    for argv in (
        ["eval", str(suite), str(ckpt)],
        ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(ckpt)],
        ["inspect", str(ckpt)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert str(ckpt / "model.safetensors") in err and "__metadata__" in err


# --- golden sets hold all their data ----------------------------------------------------------------------------


def _copy_set(tmp_path: Path) -> Path:
    from conftest import ROOT

    copy = tmp_path / "g" / "v1"
    shutil.copytree(ROOT / "golden" / "answers" / "v1", copy)
    return copy


def _retask(copy: Path, edit) -> None:
    """Edit the task YAML and keep the manifest's hash of it in step (a hand-made set, not a tampered one)."""
    import hashlib

    import yaml

    t = copy / "tasks" / "answers_facts.yaml"
    cfg = yaml.safe_load(t.read_text())
    edit(cfg)
    t.write_text(yaml.safe_dump(cfg))
    m = json.loads((copy / "MANIFEST.json").read_text())
    m["files"]["tasks/answers_facts.yaml"]["sha256"] = hashlib.sha256(t.read_bytes()).hexdigest()
    (copy / "MANIFEST.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "edit,why",
    [
        (lambda c: c["dataset_kwargs"]["data_files"].update(test="/etc/hostname"), "outside the version folder"),
        (lambda c: c["dataset_kwargs"]["data_files"].update(test="../../v1/data/x.jsonl"), "not listed"),
        (lambda c: c.update(dataset_path="some/hub_dataset"), "dataset_path"),
        (lambda c: c.update(include="../../../elsewhere.yaml"), "include"),
    ],
)
def test_a_verified_set_reads_nothing_outside_itself(tmp_path, capsys, edit, why):
    """`golden verify` passed a task whose data_files named an absolute path, and eval scored that file."""
    copy = _copy_set(tmp_path)
    _retask(copy, edit)
    assert main(["golden", "verify", str(copy)]) == 2
    assert why in capsys.readouterr().err


@pytest.mark.parametrize(
    "ident,ok",
    [("caf\u00e9", True), ("cafe\u0301", True), ("a\u200bb", False), ("a\x07b", False)],
)
def test_golden_ids_are_nfc_and_visible(tmp_path, capsys, ident, ok):
    src = tmp_path / "items.jsonl"
    src.write_text(json.dumps({"id": ident, "context": "The sky is", "target": " blue"}) + "\n")
    code = main(["golden", "new", str(tmp_path / "s" / "v1"), "--from", str(src), "--type", "greedy"])
    if ok:
        assert code == 0
        item = json.loads((tmp_path / "s" / "v1" / "data" / "s_greedy.jsonl").read_text())
        assert item["id"] == "caf\u00e9"  # both spellings are the one NFC id
    else:
        assert code == 2 and "invisible" in capsys.readouterr().err


def test_a_lone_surrogate_is_the_line_s_fault(tmp_path, capsys):
    src = tmp_path / "items.jsonl"
    src.write_text('{"context": "x \\ud800", "target": " y"}\n')
    assert main(["golden", "new", str(tmp_path / "s" / "v1"), "--from", str(src), "--type", "greedy"]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "surrogate" in err


# --- signals ----------------------------------------------------------------------------------------------------

CHILD = """
import argparse, sys, time
from pathlib import Path
import quantize.cli as cli
from quantize.io import atomic_dir

def slow(args):
    with atomic_dir(Path(sys.argv[1])) as tmp:
        (tmp / "part").write_text("half written")
        print("ready", flush=True)
        time.sleep(60)
    return 0

parser = cli.build_parser()
cli.build_parser = lambda: parser
sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["golden"]
next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices["new"].set_defaults(fn=slow)
sys.exit(cli.main(["golden", "new", sys.argv[1], "--from", "x.jsonl", "--type", "greedy"]))
"""


@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_signal_cleans_up_and_exits_with_its_shell_code(tmp_path, sig, code):
    """SIGTERM exited 130 and SIGHUP left its temporary folder (160 MB for a real conversion)."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "set" / "v1"

    # a job started in the background of a non-interactive shell inherits SIGINT ignored (POSIX), one under nohup
    # SIGHUP, and the CLI leaves an ignored signal ignored (as nohup means): the child starts with the default
    # dispositions, as a terminal's command does
    def defaults():
        for s in (signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)

    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=defaults,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code, err
    assert "nothing was left at the output path" in err
    assert not out.exists() and list(out.parent.iterdir()) == []


# --- the gate says what it compares; outputs checked before work ----------------------------------------------


def test_an_unwritable_junit_path_is_refused_before_any_scoring(world, tiny_model, tmp_path, capsys, monkeypatch):
    """Was found only after scoring, with the verdict lost."""
    _, _, lenient, _ = world
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cold"))
    argv = ["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "-q"]
    assert main([*argv, "--junit", str(tmp_path / "no-such-dir" / "gate.xml")]) == 2
    assert "--junit" in capsys.readouterr().err
    assert not (tmp_path / "cold" / "scores").exists()  # nothing was scored


def test_junit_replaces_only_a_junit_file_the_gate_wrote(world, tiny_model, tmp_path, capsys, monkeypatch):
    """`--junit CANDIDATE/model.safetensors` exited 0 with the candidate's weights replaced by JUnit XML, and
    `--junit POLICY` replaced the policy. Now each path that is not a new file outside the checkpoints and the golden
    set (or CANDIDATE/gate.xml, its home beside the candidate, where `make demo` saves it), or a JUnit file the gate
    wrote, is exit 2 before anything is scored, and the file is left as it was."""
    import quantize
    import quantize.flows.gate as flows_gate

    _, suite, lenient, _ = world
    policy = tmp_path / "policy.yaml"
    shutil.copyfile(lenient, policy)
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    golden = Path(suite).parent / "golden" / "v1"
    (tmp_path / "pytest.xml").write_text('<?xml version="1.0"?>\n<testsuite name="pytest" tests="0"/>\n')
    (tmp_path / "link.xml").symlink_to(tmp_path / "pytest.xml")
    before = {p: p.read_bytes() for p in (cand / "model.safetensors", policy, tmp_path / "pytest.xml")}
    real_gate = flows_gate.run_gate

    def no_gate(*_a, **_k):
        raise AssertionError("scored before the JUnit path was checked")

    monkeypatch.setattr(flows_gate, "run_gate", no_gate)
    argv = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(cand), "-q", "--junit"]
    for junit, said in [
        (cand / "model.safetensors", "inside the candidate checkpoint"),
        (cand / "results.xml", "inside the candidate checkpoint"),  # a new file inside is refused too
        (cand / "gate.json", "inside the candidate checkpoint"),  # the verdict's home, not the JUnit file's
        (tiny_model / "gate.xml", "inside the baseline checkpoint"),  # the candidate's home only
        (golden / "gate.xml", "inside the policy's golden set"),
        (policy, "exists and is not a JUnit file the gate wrote"),
        (tmp_path / "pytest.xml", "exists and is not a JUnit file the gate wrote"),  # another tool's JUnit
        (tmp_path / "link.xml", "is a symbolic link"),
    ]:
        assert main([*argv, str(junit)]) == 2, junit
        assert said in capsys.readouterr().err, junit
    with pytest.raises(UsageError, match="inside the candidate checkpoint"):
        quantize.gate(policy, tiny_model, cand, junit=cand / "model.safetensors")
    assert {p: p.read_bytes() for p in before} == before
    assert not (cand / "results.xml").exists() and not (golden / "gate.xml").exists()
    monkeypatch.setattr(flows_gate, "run_gate", real_gate)
    assert main([*argv, str(cand / "gate.xml")]) == 0  # its home beside the candidate (`make gate-these`)
    assert (cand / "gate.xml").read_bytes().startswith(b"<?xml")
    junit = tmp_path / "gate.xml"
    assert main([*argv, str(junit)]) == 0  # a new path
    first = junit.read_bytes()
    junit.write_bytes(first.replace(b'tests="3"', b'tests="0"'))  # an earlier run's file: replaced
    assert junit.read_bytes() != first
    assert main([*argv, str(junit)]) == 0 and junit.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gate")] == []  # no temporary file left


def test_the_verdict_names_an_a_a_check_and_another_architecture(world, tiny_model, tmp_path, capsys):
    from conftest import make_tiny_llama

    _, _, lenient, _ = world
    code = main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json", "-q"])
    v = json.loads(capsys.readouterr().out)
    assert code == 0 and any("one checkpoint" in n for n in v["notes"])
    narrow = make_tiny_llama(tmp_path / "narrow", hidden_size=64, head_dim=16)
    main(["gate", str(lenient), "--baseline", str(tiny_model), "--candidate", str(narrow), "--json", "-q"])
    v = json.loads(capsys.readouterr().out)
    assert any("different architectures" in n and "hidden_size 128 vs 64" in n for n in v["notes"])


def test_another_vocabulary_is_refused_unless_the_policy_allows_it(world, tiny_model, tmp_path, capsys):
    from conftest import make_tiny_llama

    _, suite, _, _ = world
    other = make_tiny_llama(tmp_path / "other-vocab", vocab_size=1024)
    policy = tmp_path / "p.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n")
    argv = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(other), "-q"]
    assert main(argv) == 2
    assert "different tokenizers" in capsys.readouterr().err
    policy.write_text(policy.read_text() + "allow_different_tokenizer: true\n")
    code = main([*argv, "--json"])
    v = json.loads(capsys.readouterr().out)
    assert code == v["exit_code"] == (0 if v["verdict"] == "pass" else 1)
    assert any("different tokenizers" in n for n in v["notes"])


# --- checkpoints checked on headers before any allocation ------------------------------------------------------


def _with_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **changes}))
    return dst


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"num_hidden_layers": 100_000}, "num_hidden_layers 100000, but the weights hold 2"),
        ({"vocab_size": 10**9}, "embed_tokens.weight has shape [2048, 128]"),
        ({"intermediate_size": 256}, "mlp.down_proj.weight has shape [128, 192]"),
    ],
)
def test_a_config_that_does_not_fit_its_weights_is_refused_before_allocation(
    world, tiny_model, tmp_path, capsys, changes, named
):
    """num_hidden_layers 100000 grew to 5.4 GB over 146 s, then exit 3 MemoryError; vocab_size 10**9 ended in
    exit 3 behind --quiet."""
    import time

    _, suite, _, _ = world
    bad = _with_config(tiny_model, tmp_path / "bad", **changes)
    t = time.perf_counter()
    assert main(["eval", str(suite), str(bad), "--quiet"]) == 2
    assert named in capsys.readouterr().err and time.perf_counter() - t < 10


def test_integers_where_the_model_holds_floats_are_refused_not_cast(world, tiny_model, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    _, suite, _, _ = world
    bad = tmp_path / "int-norm"
    shutil.copytree(tiny_model, bad)
    t = load_file(str(bad / "model.safetensors"))
    name = next(n for n in sorted(t) if n.endswith("input_layernorm.weight"))
    t[name] = torch.ones_like(t[name], dtype=torch.int32)
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    assert main(["eval", str(suite), str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert name in err and "I32" in err and "does not cast" in err


def test_a_fifo_given_as_a_recipe_is_named_not_read(tmp_path, capsys):
    """A FIFO was described as "does not exist" (and reading one blocks)."""
    import os

    fifo = tmp_path / "r.yaml"
    os.mkfifo(fifo)
    assert main(["run", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_full_disk_names_the_output_and_leaves_nothing(tmp_path):
    import errno

    from quantize.errors import RuntimeFailure
    from quantize.io import atomic_dir, atomic_file

    target = tmp_path / "out"
    with pytest.raises(RuntimeFailure, match=str(target)), atomic_dir(target) as tmp:
        (tmp / "w").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeFailure, match="f.json"), atomic_file(tmp_path / "f.json"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_link_planted_beside_an_atomic_file_is_not_written_through(tmp_path):
    """`.README.tmp-PID.md` was a name anyone could plant a link under (a checkpoint folder others can write): `quantize
    card` then wrote the card through it into the link's target, any file the user can write (a review)."""
    import os

    from quantize.io import atomic_file, write_text_atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    pid = os.getpid()
    for name in (f".README.tmp-{pid}.md", f".README.tmp-{pid}-.md", f".README.tmp-{pid}"):
        (folder / name).symlink_to(victim)
    write_text_atomic(folder / "README.md", "the card\n")
    assert victim.read_text() == "untouched"
    card = folder / "README.md"
    assert not card.is_symlink() and card.read_text() == "the card\n"
    mask = os.umask(0)
    os.umask(mask)
    assert card.stat().st_mode & 0o777 == 0o666 & ~mask  # mkstemp's 0600 is not what a published file should have
    with atomic_file(folder / "gate.json") as tmp:
        assert tmp.parent == folder and tmp.is_file() and not tmp.is_symlink()
        tmp.write_text("{}")
    assert sorted(p.name for p in folder.iterdir() if not p.is_symlink()) == ["README.md", "gate.json"]


def test_a_cache_entry_is_read_capped_and_as_a_regular_file(tmp_path, monkeypatch):
    """A second reading (session 43): `checked_bytes` read a cache entry whole with `read_bytes`, no cap, after an
    `is_file` check on the path (not the descriptor read). It is read as every file here is: a regular file of at
    most MAX_ENTRY_BYTES, exit 2 naming the entry and the fix beyond it; an entry under the cap is served."""
    from quantize import cache
    from quantize.io import sha256_bytes

    entry = tmp_path / "scores.json"
    entry.write_bytes(b"x" * 100)
    cache.digest_path(entry).write_text(sha256_bytes(entry.read_bytes()) + "\n")
    assert cache.checked_bytes(entry, "rerun with --refresh", "score file") == b"x" * 100
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", 99)
    with pytest.raises(UsageError, match="--refresh") as e:
        cache.checked_bytes(entry, "rerun with --refresh", "score file")
    assert str(entry) in str(e.value) and "at most 99 are read" in str(e.value)


def test_make_gate_these_saves_its_junit_file_where_the_gate_writes_it(tmp_path):
    """`make gate-these` (so `make demo` and `make gate-all`) passes `--junit $d/gate.xml` for each candidate `$d`:
    a path the gate's output check must accept before anything is scored. e0ecf1e refused it ("inside the candidate
    checkpoint") and `make demo` ended in exit 2 at its three gates, found only by running it."""
    import re

    from quantize.flows.gate import check_verdict_files

    root = Path(__file__).resolve().parent.parent
    recipe = (root / "Makefile").read_text(encoding="utf-8").split("\ngate-these:", 1)[1].split("\n\n", 1)[0]
    (junit,) = re.findall(r"--junit (\S+)", recipe)
    base, cand = tmp_path / "base", tmp_path / "cand"
    base.mkdir()
    cand.mkdir()
    path = Path(junit.replace("$$d", str(cand)))
    check_verdict_files(root / "gates" / "ci.yaml", (base, cand), ("--junit", path), None)
    assert path.parent == cand
