"""The report: Pareto frontier, table values, graceful gaps, and a self-contained HTML page."""

from __future__ import annotations

import contextlib
import copy
import html
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from quantize import records
from quantize.checkpoint.files import identity_sha256
from quantize.cli import main
from quantize.evaluate.score import score
from quantize.evaluate.suite import open_suite
from quantize.golden.build import Sizes
from quantize.report.render import label_positions, pareto_front, spread_labels

from conftest import ROOT, small_golden, suite_file


def test_pareto_front_higher_is_better():
    pts = [(100, 0.60), (50, 0.58), (60, 0.50), (25, 0.40), (30, 0.39), (100, 0.55)]
    assert pareto_front(pts) == [3, 1, 0]  # (60, .50) is beaten by (50, .58); (30, .39) by (25, .40)


def test_spread_labels_keeps_order_and_gap_and_moves_no_more_than_needed():
    assert spread_labels([0.0, 1.0, 2.0], 0.5) == [0.0, 1.0, 2.0]  # already apart: unchanged
    assert spread_labels([1.0, 1.0], 0.2) == pytest.approx([0.9, 1.1])  # a tie: split symmetrically
    ys = [0.51, 0.50, 0.52, 0.90]
    h = spread_labels(ys, 0.05)
    ranked = sorted(range(4), key=lambda i: ys[i])
    assert [h[i] for i in ranked] == sorted(h)  # order kept
    assert all(b - a >= 0.05 - 1e-12 for a, b in zip(sorted(h), sorted(h)[1:], strict=False))
    assert h[3] == 0.90 and sum(h[:3]) == pytest.approx(sum(ys[:3]))  # the far point stays; the cluster is centred


def test_label_positions_spread_only_points_at_about_the_same_size():
    h = label_positions([100.0, 100.5, 200.0], [0.5, 0.5, 0.5], x_near=5.0, gap=0.1)
    assert h[0] != h[1] and abs(h[0] - h[1]) == pytest.approx(0.1) and h[2] == 0.5


def test_pareto_front_lower_is_better_and_ties():
    pts = [(10, 2.0), (10, 2.0), (5, 3.0), (20, 1.5), (20, 1.9)]
    assert pareto_front(pts, higher_is_better=False) == [2, 0, 1, 3]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("report")
    golden = small_golden(base, Sizes(facts=20, cloze=8, analogy=6, kv=6, prose=3, smoke=2))
    suite = suite_file(base / "suite.yaml", golden, per_task=2)
    outs = {}
    for name, fields in {
        "w4": {"method": "rtn", "scheme": "W4A16", "group_size": 32},
        "fp8": {"method": "fp8", "scheme": "FP8_DYNAMIC"},
    }.items():
        r = base / f"{name}.yaml"
        r.write_text(
            yaml.safe_dump(
                {**fields, "calibration": None, "model": str(tiny_model), "output": str(base / "out" / name)}
            )
        )
        assert main(["run", str(r), "--quiet"]) == 0
        outs[name] = base / "out" / name
    return base, suite, outs


def test_report_with_a_gap(checkpoints, tiny_model, tmp_path, monkeypatch, capsys):
    base, suite, outs = checkpoints
    monkeypatch.setenv("QUANTIZE_CACHE", str(base / "cache"))
    score(open_suite(suite), tiny_model)
    score(open_suite(suite), outs["w4"])  # fp8 is left unscored on purpose
    policy = base / "p.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.2}}\n")
    out = tmp_path / "rep"
    code = main(
        [
            "report",
            str(base / "out"),
            "--baseline",
            str(tiny_model),
            "--suite",
            str(suite),
            "--policy",
            str(policy),
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((out / "report.json").read_text())
    labels = [r[0] for r in data["table"]["rows"]]
    assert labels == ["tiny-llama (baseline)", "fp8", "w4"]
    rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
    assert rows["fp8"]["facts"] == "not scored" and rows["fp8"]["gate"] == "no verdict"
    # the report's verdict and Δ are the gate's on the same cached scores
    capsys.readouterr()
    main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(outs["w4"]), "--json"])
    gate = json.loads(capsys.readouterr().out)
    facts = next(r["evidence"] for r in gate["rules"] if r.get("task") == "core_facts")
    assert rows["w4"]["gate"] == gate["verdict"].upper()
    assert re.match(r"\d\.\d{3} ± \d\.\d{3}", rows["w4"]["facts"])
    assert f"(Δ {facts['delta']:+.3f}, LB {facts['lower_bound']:+.3f})" in rows["w4"]["facts"]
    w4 = next(e for e in data["entries"] if e["label"] == "w4")
    assert float(rows["w4"]["MiB"]) == pytest.approx(w4["total_bytes"] / 2**20, abs=0.05)
    assert float(rows["w4"]["bits/w (model)"]) == pytest.approx(8 * w4["total_bytes"] / w4["parameters"], abs=5e-4)
    assert float(rows["w4"]["batch-1 bound ms"]) > 0
    for name in ("pareto.png", "pareto.svg", "bytes.png", "bytes.svg", "report.md", "report.html"):
        assert (out / name).stat().st_size > 0
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "<script" not in page and "http" not in page.replace("http-equiv", "")
    for label in ("fp8", "w4", "tiny-llama (baseline)"):
        assert f"<td>{label}</td>" in page
    assert "Not scored" in (out / "report.md").read_text()


@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium is not installed (apt-get install chromium)")
def test_report_opens_in_headless_chromium(checkpoints, tmp_path):
    _, suite, outs = checkpoints
    out = tmp_path / "rep"
    assert main(["report", str(outs["w4"]), str(outs["fp8"]), "--suite", str(suite), "--out", str(out)]) == 0
    proc = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "Bytes versus accuracy" in proc.stdout and "<table>" in proc.stdout


def test_the_decode_column_prices_config_json_as_quantize_cost_does(tmp_path):
    """A Qwen3-Next config.json without layer_types (as published: full_attention_interval) was priced as full
    attention on every layer with no state by the report, where `quantize cost` completes it through its class."""
    import families

    from quantize import api
    from quantize.checkpoint.loader import completed_config
    from quantize.cost.bounds import HARDWARE
    from quantize.report.collect import collect

    ckpt = families.build("qwen3_next", tmp_path / "qn")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("layer_types")
    (ckpt / "config.json").write_text(json.dumps(cfg | {"full_attention_interval": 2}))
    suite = tmp_path / "s.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'core' / 'v1'}\n")
    [entry] = collect([ckpt], str(suite), None, None, HARDWARE["seed"], complete=completed_config)
    theirs = api.decode_cost(ckpt).to_data()["formats"]["measured"]  # at the report's batch 32 and context 2,048
    assert entry.decode.batch1_ms == pytest.approx(theirs["batch1_step_bound_ms"], rel=1e-9)
    assert entry.decode.batch_ms == pytest.approx(theirs["batch_step_bound_ms"], rel=1e-9)
    plain = collect([ckpt], str(suite), None, None, HARDWARE["seed"])[0].decode  # config.json as written
    assert plain.batch_ms > entry.decode.batch_ms  # as written: every layer full attention, 2,048 tokens of KV each


def test_a_checkpoint_without_a_kv_layout_has_no_decode_bounds_and_the_report_goes_on(tiny_model, tmp_path, capsys):
    cfg = json.loads((tiny_model / "config.json").read_text())
    shutil.copytree(tiny_model, tmp_path / "no-heads")
    # a family transformers does not know (its config class would fill num_attention_heads in with its default)
    (tmp_path / "no-heads" / "config.json").write_text(
        json.dumps({k: v for k, v in cfg.items() if k != "num_attention_heads"} | {"model_type": "custom_llama"})
    )
    suite = tmp_path / "s.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'core' / 'v1'}\n")
    out = tmp_path / "rep"
    code = main(["report", str(tmp_path / "no-heads"), str(tiny_model), "--suite", str(suite), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    data = json.loads((out / "report.json").read_text())
    rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
    assert rows["no-heads"]["batch-1 bound ms"] == "-" and float(rows["tiny-llama"]["batch-1 bound ms"]) > 0
    assert "No bounds for `no-heads`" in (out / "report.md").read_text()


def test_agree_gives_the_demo_report_a_measured_quality_figure(checkpoints, tiny_model, tmp_path, monkeypatch, capsys):
    """`quantize agree` measures agreement without scoring; the report shows it, labelled as such."""
    from quantize.records import AgreementResult, parse

    base, suite, _ = checkpoints
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))  # nothing scored
    code = main(["agree", str(suite), str(base / "out"), "--baseline", str(tiny_model), "--json", "--quiet"])
    got = json.loads(capsys.readouterr().out)
    assert code == 0 and sorted(Path(g["checkpoint"]).name for g in got) == ["fp8", "w4"]
    kl = {Path(g["checkpoint"]).name: parse(AgreementResult, g["agreement"], "stdout").kl_mean for g in got}
    assert 0 < kl["fp8"] < kl["w4"]  # 4-bit round-to-nearest moves the distributions more than FP8
    out = tmp_path / "rep"
    assert (
        main(["report", str(base / "out"), "--baseline", str(tiny_model), "--suite", str(suite), "--out", str(out)])
        == 0
    )
    data = json.loads((out / "report.json").read_text())
    rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
    assert float(rows["w4"]["mean KL"]) == pytest.approx(kl["w4"], abs=5e-5) and rows["w4"]["gate"] == "no verdict"
    assert "Measured without scoring (`quantize agree`)" in (out / "report.md").read_text()
    # with a policy, the agreement rules alone give a first verdict, labelled as such
    limit = (kl["fp8"] * kl["w4"]) ** 0.5
    pol = tmp_path / "agr.yaml"
    pol.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, margin: 0.05}}\n  - {{agreement: kl, max: {limit}}}\n"
    )
    out2 = tmp_path / "rep2"
    args = ["report", str(base / "out"), "--baseline", str(tiny_model), "--suite", str(suite), "--out", str(out2)]
    assert main([*args, "--policy", str(pol)]) == 0
    data = json.loads((out2 / "report.json").read_text())
    rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
    assert rows["fp8"]["gate"] == "agreement pass; scores pending"
    assert rows["w4"]["gate"] == "agreement REJECTED; scores pending"


def test_report_reads_a_saved_sequential_verdict_and_refuses_another_suite(
    checkpoints, tiny_model, tmp_path, monkeypatch, capsys
):
    """A sequential gate leaves no full scores: the verdict saved beside the checkpoint (make gate-all) is shown
    when it is this policy's, on this pair and golden set; a --suite other than the policy's is exit 2."""
    base, suite, _ = checkpoints
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    pol = tmp_path / "seq.yaml"
    pol.write_text(
        f"suite: {suite}\nsequential: {{looks: [0.5, 1.0]}}\nrules:\n  - {{task: core_facts, margin: 0.5}}\n"
    )
    fp8 = base / "out" / "fp8"
    main(["gate", str(pol), "--baseline", str(tiny_model), "--candidate", str(fp8), "--json"])
    got = capsys.readouterr()
    assert got.out, got.err
    saved = json.loads(got.out)
    (fp8 / "gate.json").write_text(json.dumps(saved))
    try:
        out = tmp_path / "rep"
        assert (
            main(["report", str(base / "out"), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)])
            == 0
        )
        data = json.loads((out / "report.json").read_text())
        rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
        assert rows["fp8"]["gate"] == saved["verdict"].upper() and rows["w4"]["gate"] == "no verdict"
        other = tmp_path / "other.yaml"
        other.write_text(f"golden: {Path(suite).parent / 'golden' / 'v1'}\nbatch_size: 2\n")
        args = ["report", str(base / "out"), "--suite", str(other), "--policy", str(pol), "--out", str(tmp_path / "r2")]
        assert main(args) == 2
        assert "name different suites" in capsys.readouterr().err
    finally:
        (fp8 / "gate.json").unlink()


@pytest.fixture(scope="module")
def staged(checkpoints, tiny_model, tmp_path_factory):
    """A staged gate's verdict on a copy of fp8 (as `quantize gate --json` prints it, before it is saved as
    gate.json) and the cache that gate filled: the baseline's full scores, none of the candidate's."""
    _, suite, outs = checkpoints
    root = tmp_path_factory.mktemp("staged")
    shutil.copytree(outs["fp8"], root / "fp8")
    pol = root / "seq.yaml"
    pol.write_text(
        f"suite: {suite}\nsequential: {{looks: [0.5, 1.0]}}\nrules:\n  - {{task: core_facts, margin: 0.5}}\n"
    )
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("QUANTIZE_CACHE", str(root / "cache"))
        code = main(["gate", str(pol), "--baseline", str(tiny_model), "--candidate", str(root / "fp8"), "--json"])
    verdict = json.loads(printed.getvalue())
    assert code == 0 and verdict["verdict"] == "pass" and verdict["sequential"] is not None
    return root, pol, verdict


def _report_with(staged, tiny_model, tmp_path, monkeypatch, verdict: dict) -> tuple[dict, dict, Path]:
    """The report on a fresh copy of the gated fp8 with `verdict` saved beside it as gate.json (read through the
    Verdict record), over a copy of the staged gate's cache; its table rows by label, its data and its folder."""
    root, pol, _ = staged
    cand = tmp_path / "cands" / "fp8"
    shutil.copytree(root / "fp8", cand)
    records.write(cand / "gate.json", records.parse(records.Verdict, verdict, "test"))
    if not (tmp_path / "cache").exists():
        shutil.copytree(root / "cache", tmp_path / "cache")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / f"rep{len(list(tmp_path.glob('rep*')))}"
    args = ["report", str(cand), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)]
    assert main(args) == 0
    data = json.loads((out / "report.json").read_text())
    rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
    return rows, data, out


def test_a_staged_rejection_stays_rejected_when_full_scores_would_pass(
    staged, checkpoints, tiny_model, tmp_path, monkeypatch
):
    """The verdict CI gave is the report's: cached full scores that pass under the fixed design do not turn a
    staged gate's saved rejection into a pass; without gate.json the same scores are decided again, labelled so."""
    from quantize.evaluate.cache import store_verdict

    _, suite, _ = checkpoints
    rejected = copy.deepcopy(staged[2])
    rejected.update(verdict="rejected", exit_code=1)
    # a staged rejection as the gate records one: a drop past the margin, its bounds below 0 (a rule's outcome
    # must be what its own bounds give, and Δ the candidate's accuracy less the baseline's)
    rejected["rules"][0]["verdict"] = "regression"
    rejected["rules"][0]["evidence"].update(
        candidate=0.1, baseline=0.9, delta=-0.8, lower_bound=-0.95, upper_bound=-0.65
    )
    shutil.copytree(staged[0] / "cache", tmp_path / "cache")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    store_verdict(records.parse(records.Verdict, rejected, "test"))  # kept as a staged gate that rejected keeps it
    score(open_suite(suite), staged[0] / "fp8")  # the candidate's full scores, cached
    rows, _, _ = _report_with(staged, tiny_model, tmp_path, monkeypatch, rejected)
    assert rows["fp8"]["gate"] == "REJECTED"
    assert rows["fp8"]["verdict from"] == "saved verdict (gate.json, staged: 1 of 2 looks)"
    assert re.match(r"\d\.\d{3} ± \d\.\d{3} \(Δ [-+]\d\.\d{3}, LB [-+]\d\.\d{3}, n \d+/20\)", rows["fp8"]["facts"])
    # the premise: the same cached scores pass under the fixed design, which the report labels as recomputed
    (tmp_path / "cands" / "fp8" / "gate.json").unlink()
    out = tmp_path / "again"
    args = ["report", str(tmp_path / "cands" / "fp8"), "--baseline", str(tiny_model), "--policy", str(staged[1])]
    assert main([*args, "--out", str(out)]) == 0
    again = json.loads((out / "report.json").read_text())
    row = dict(zip(again["table"]["head"], again["table"]["rows"][1], strict=True))
    assert row["gate"] == "PASS" and row["verdict from"] == "recomputed from cached full scores (fixed design)"


def test_a_pass_copied_beside_a_nan_copy_is_neither_the_reports_verdict_nor_a_sweeps_done(
    staged, tiny_model, tmp_path, monkeypatch, capsys
):
    """A review's repro: a NaN-weight copy of a gated candidate, its gate.json copied beside it with only the
    candidate identity set to the copy's (what anyone who can write the folder can do), showed PASS in the report
    ("saved verdict") and was done in a sweep, never gated. A gate.json is evidence only as a gate's own decision,
    which the cache the gate ran with holds: the forged one is named and not shown, and a sweep gates the copy
    again; the genuine one beside the candidate it judged stays the report's verdict and the sweep's done."""
    from conftest import nan_copy

    root, pol, saved = staged
    shutil.copytree(root / "cache", tmp_path / "cache")  # the cache the staged gate ran with
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    good, bad = tmp_path / "c" / "fp8", tmp_path / "c" / "nan"
    for folder in (good, bad):
        shutil.copytree(root / "fp8", folder)
    nan_copy(root / "fp8" / "model.safetensors", bad / "model.safetensors")
    forged = copy.deepcopy(saved)
    forged["provenance"]["candidate"]["checkpoint"]["identity_sha256"] = identity_sha256(bad)
    records.write(bad / "gate.json", records.parse(records.Verdict, forged, "forged"))
    records.write(good / "gate.json", records.parse(records.Verdict, saved, "saved"))
    out = tmp_path / "rep"
    args = ["report", str(good), str(bad), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)]
    assert main(args) == 0
    rows = _rows(out)
    assert rows["fp8"]["gate"] == "PASS" and rows["fp8"]["verdict from"].startswith("saved verdict (gate.json")
    assert rows["nan"]["gate"] == "no verdict" and rows["nan"]["facts"] == "not scored"
    assert rows["nan"]["verdict from"].startswith("gate.json not shown: not a gate's own decision: no gate run with")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"name: t\nmodel: {tiny_model}\ncheckpoints: [{good}, {bad}]\npolicy: {pol}\noutput: {tmp_path / 'out'}\n"
    )
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--plan", "--json"]) == 0
    plan = {c["name"]: c for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert plan["fp8"]["todo"] == "done" and plan["nan"]["todo"] == "gate"
    assert "its gate.json is not this sweep's verdict (not a gate's own decision" in plan["nan"]["message"]


def test_a_gate_json_for_another_candidate_identity_is_stale_not_the_verdict(staged, tiny_model, tmp_path, monkeypatch):
    other = copy.deepcopy(staged[2])
    other["provenance"]["candidate"]["checkpoint"]["identity_sha256"] = "0" * 64
    rows, data, out = _report_with(staged, tiny_model, tmp_path, monkeypatch, other)
    assert rows["fp8"]["gate"] == "no verdict" and rows["fp8"]["facts"] == "not scored"
    assert rows["fp8"]["verdict from"].startswith(
        "gate.json not shown: stale: gate.json judged checkpoint 000000000000"
    )
    fp8 = next(e for e in data["entries"] if e["label"] == "fp8")
    assert fp8["verdict"] is None and fp8["verdict_stale"].startswith("stale") and data["evidence"] == []
    assert "PASS" not in (out / "report.md").read_text()


def test_a_staged_pass_shows_its_delta_bounds_and_items_as_a_cell_and_a_point(
    staged, tiny_model, tmp_path, monkeypatch
):
    from matplotlib.axes import Axes

    drawn = []
    errorbar = Axes.errorbar
    monkeypatch.setattr(
        Axes, "errorbar", lambda ax, x, y, **kw: drawn.append((x, y, kw.get("yerr"))) or errorbar(ax, x, y, **kw)
    )
    v = records.parse(records.Verdict, staged[2], "test")
    ev, sq = v.rules[0].evidence, v.sequential
    total = sq.items_total["core_facts"]
    assert ev.n == sq.items_scored["core_facts"] < total  # stopped at the first look: a sample of the items
    rows, data, out = _report_with(staged, tiny_model, tmp_path, monkeypatch, staged[2])
    cell = f"Δ {ev.delta:+.3f} [{ev.lower_bound:+.3f}, {ev.upper_bound:+.3f}], n {ev.n}/{total}"
    assert rows["fp8"]["facts"] == cell and rows["fp8"]["gate"] == "PASS"
    assert rows["fp8"]["verdict from"] == "saved verdict (gate.json, staged: 1 of 2 looks)"
    point = next(p for p in data["evidence"] if p["label"] == "fp8")
    assert (point["value"], point["lower"], point["upper"]) == (ev.delta, ev.lower_bound, ev.upper_bound)
    assert (point["n"], point["items_total"], point["limit"], point["look"]) == (ev.n, total, -0.5, "look 1 of 2")
    assert "evidence.png" in data["images"] and (out / "evidence.svg").stat().st_size > 0
    # the plot drew that point with its interval: Δ − LB below, UB − Δ above
    bars = [(y, yerr) for _, y, yerr in drawn if y == ev.delta and yerr is not None and len(yerr) == 2]
    assert bars and bars[0][1] == [
        [pytest.approx(ev.delta - ev.lower_bound)],
        [pytest.approx(ev.upper_bound - ev.delta)],
    ]
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## The gate's evidence" in md and "![The gate's evidence against size](evidence.png)" in md
    assert f"<td>{html.escape(cell)}</td>" in page and "<h2>The gate's evidence</h2>" in page


def test_a_saved_verdict_is_the_reports_only_for_this_policy_pair_and_golden_set(
    staged, checkpoints, tiny_model, monkeypatch
):
    """The identities a gate.json names are the ones the report computes from the files; each other difference
    is named, the candidate's first (stale: changed since it was gated)."""
    from quantize.checkpoint.files import identity_sha256
    from quantize.gates.policy import load_policy
    from quantize.report.collect import saved_mismatch

    root, pol, saved = staged
    monkeypatch.setenv("QUANTIZE_CACHE", str(root / "cache"))  # where the staged gate kept its verdict
    v, policy, suite = records.parse(records.Verdict, saved, "test"), load_policy(pol), open_suite(checkpoints[1])
    base_id, cand_id = identity_sha256(tiny_model), identity_sha256(root / "fp8")
    assert saved_mismatch(v, policy, suite, base_id, cand_id) is None
    assert saved_mismatch(v, policy, suite, base_id, "f" * 64).startswith("stale: gate.json judged checkpoint")
    assert saved_mismatch(v, policy, suite, "f" * 64, "f" * 64).startswith("stale")
    assert saved_mismatch(v, policy, suite, "f" * 64, cand_id).startswith("another baseline's")
    other = policy.model_copy(update={"name": "ci"})
    assert saved_mismatch(v, other, suite, base_id, cand_id) == (
        "another policy's: gate.json is policy seq's verdict, the report's --policy is ci"
    )
    tighter = policy.model_copy(update={"rules": [policy.rules[0].model_copy(update={"margin": 0.1})]})
    assert saved_mismatch(v, tighter, suite, base_id, cand_id) == (
        "policy seq changed since it was gated: rule core_facts acc was judged at (limit, α) (0.5, 0.05), the policy "
        "now says (0.1, 0.05)"
    )
    golden = v.provenance.golden.model_copy(update={"manifest_sha256": "e" * 64})
    moved = v.model_copy(update={"provenance": v.provenance.model_copy(update={"golden": golden})})
    assert saved_mismatch(moved, policy, suite, base_id, cand_id).startswith("another golden set's")


def test_a_gate_stopped_by_agreement_shows_untested_tasks_and_its_agreement_point(staged, tmp_path):
    """A staged gate that an agreement look rejected before any item (the demo's GPTQ): its task cells say
    untested, not "not scored", and the agreement rule is a point with its bounds at that look."""
    from quantize.report.collect import Entry
    from quantize.report.render import write_report

    v = records.parse(records.Verdict, staged[2], "test")
    agreement = records.AgreementRuleResult(
        rule="agreement kl",
        verdict="regression",
        metric="kl",
        look=1,
        evidence=records.AgreementEvidence(
            value=0.31, se_clustered=0.02, lower_bound=0.26, upper_bound=0.36, max=0.2, alpha=0.05,
            positions=900, items=12, clusters=4, kl_p99=1.5, note="",
        ),
    )  # fmt: skip
    untested = records.UntestedResult(rule="core_facts acc", task="core_facts", reason="stopped by agreement")
    seq = v.sequential.model_copy(update={"looks_taken": 0, "agreement_looks_taken": 1})
    rejected = v.model_copy(update={"verdict": "rejected", "rules": [agreement, untested], "sequential": seq})
    common = dict(
        method="gptq",
        scheme="W4A16",
        parameters=1000,
        qlinear_bits=4.0,
        bytes_by_role={"payload": 900},
        sha256="a" * 64,
    )
    entries = [
        Entry(path="b", label="base", total_bytes=4000, bits_per_weight=32.0, is_baseline=True, **common),
        Entry(path="c", label="w4", total_bytes=900, bits_per_weight=7.2, verdict=rejected, verdict_origin="saved",
              **common),
    ]  # fmt: skip
    data = write_report(entries, tmp_path / "rep", "bytes", "suite.yaml", "h100-sxm")
    rows = {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}
    assert rows["w4"]["facts"] == "untested (the gate stopped before this task)" and rows["w4"]["gate"] == "REJECTED"
    assert rows["w4"]["verdict from"] == "saved verdict (gate.json, staged: 0 of 2 looks)"
    [point] = data["evidence"]
    assert (point["kind"], point["value"], point["lower"], point["upper"], point["limit"]) == (
        "agreement",
        0.31,
        0.26,
        0.36,
        0.2,
    )
    assert point["look"] == "agreement look 1 of 2" and (tmp_path / "rep" / "evidence.png").is_file()


def test_a_checkpoint_name_makes_no_row_tag_or_headline_in_the_report(tiny_model, tmp_path, capsys):
    """A folder named to add a table cell, a tag and a headline: report.md and report.html show the name as text."""
    name = "w4 | forged | <img src=x onerror=alert(1)> `x` # PASS"  # no slash: one folder
    shutil.copytree(tiny_model, tmp_path / name)
    suite = tmp_path / "s.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'core' / 'v1'}\n")
    out = tmp_path / "rep"
    assert main(["report", str(tmp_path / name), "--suite", str(suite), "--out", str(out)]) == 0, capsys.readouterr()
    md = (out / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert len(rows) == 3 and len({len(re.findall(r"(?<!\\)\|", row)) for row in rows}) == 1
    assert [line for line in md.splitlines() if line.startswith("#")] == ["# Bytes versus accuracy"]
    page = (out / "report.html").read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "<code>w4 | forged" in page
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<img src=x" not in rendered and rendered.count("<h1>") == 1 and "<h2>" not in rendered
    assert rendered.count("<tr>") == 2 and f"<code>{name.replace('<', '&lt;').replace('>', '&gt;')}</code>" in rendered


def test_the_bytes_by_role_plot_has_a_row_for_every_role_inspect_counts():
    """A role accounting counts but the report's plot leaves out drops those bytes from the bar without a word
    (the state and conv roles of the hybrid families were missing)."""
    from quantize.checkpoint.accounting import ROLES
    from quantize.report.render import ROLE_ORDER

    assert sorted(r for r, _ in ROLE_ORDER) == sorted(ROLES)


# --- what the report shows is what the gate would say (a review's repros) ------------------------------------------


def _rows(out: Path) -> dict[str, dict[str, str]]:
    data = json.loads((out / "report.json").read_text())
    return {r[0]: dict(zip(data["table"]["head"], r, strict=True)) for r in data["table"]["rows"]}


@pytest.fixture(scope="module")
def scored(checkpoints, tiny_model, tmp_path_factory):
    """The baseline and w4 scored in full, in a cache of their own, and a policy on facts: the report recomputes
    a PASS from them (test_report_with_a_gap)."""
    _, suite, outs = checkpoints
    root = tmp_path_factory.mktemp("scored")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTIZE_CACHE", str(root / "cache"))
        for c in (tiny_model, outs["w4"]):
            score(open_suite(suite), c)
    pol = root / "p.yaml"
    pol.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.2}}\n")
    return root, pol


def test_a_folder_of_the_users_is_never_replaced_by_a_report(checkpoints, tmp_path, capsys):
    """--out naming a folder that holds a report.md beside the user's own files replaced the whole folder (the
    files lost); such a folder, `.`, a file or a path below a file are exit 2 before anything is collected."""
    _, suite, outs = checkpoints
    mine = tmp_path / "mydocs"
    (mine / "sub").mkdir(parents=True)
    (mine / "report.md").write_text("# notes\n")
    (mine / "thesis.tex").write_text("precious\n")
    (tmp_path / "afile").write_text("x")
    for out in (mine, Path("."), tmp_path / "afile", tmp_path / "afile" / "rep"):
        assert main(["report", str(outs["w4"]), "--suite", str(suite), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--out" in err and "Traceback" not in err
    assert (mine / "thesis.tex").read_text() == "precious\n" and (mine / "sub").is_dir()
    # an earlier report of its own is replaced
    rep = tmp_path / "rep"
    for _ in range(2):
        assert main(["report", str(outs["w4"]), "--suite", str(suite), "--out", str(rep)]) == 0


def test_a_folder_of_report_names_alone_is_no_earlier_report(checkpoints, tmp_path, capsys):
    """--out holding only the user's own report.md ("my notes") was replaced (a review): an earlier report is known by
    its content, a report.json that reads as the one this tool writes. Such a folder is exit 2, kept as it was."""
    _, suite, outs = checkpoints
    notes = tmp_path / "o1"
    notes.mkdir()
    (notes / "report.md").write_text("my notes\n")
    other = tmp_path / "o2"
    other.mkdir()
    (other / "report.md").write_text("my notes\n")
    (other / "report.json").write_text(json.dumps({"table": "mine"}))
    for out in (notes, other):
        assert main(["report", str(outs["w4"]), "--suite", str(suite), "--out", str(out)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "no report.json this tool wrote" in err and "Traceback" not in err
        assert (out / "report.md").read_text() == "my notes\n"
    rep = tmp_path / "rep"
    assert main(["report", str(outs["w4"]), "--suite", str(suite), "--out", str(rep)]) == 0
    (rep / "report.md").write_text("my notes\n")  # an earlier report, however its Markdown reads now: replaced
    assert main(["report", str(outs["w4"]), "--suite", str(suite), "--out", str(rep)]) == 0
    assert (rep / "report.md").read_text() != "my notes\n"


def test_two_folders_of_one_label_are_two_rows_of_two_names(checkpoints, tmp_path):
    """A copy of a result folder (one identity, one recipe name in quantize.json) showed as two rows of one label in
    the tables and plots (a review): a shared label gets the folder's name, then its path where that collides."""
    _, suite, outs = checkpoints
    copy = tmp_path / "w4-copy"
    shutil.copytree(outs["w4"], copy)
    again = tmp_path / "elsewhere" / "w4"  # a second copy whose folder name is the first's
    shutil.copytree(outs["w4"], again)
    out = tmp_path / "rep"
    assert main(["report", str(outs["w4"]), str(copy), str(again), "--suite", str(suite), "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    labels = [r[0] for r in data["table"]["rows"]]
    assert labels == [e["label"] for e in data["entries"]] and len(set(labels)) == 3
    assert labels[1] == "w4 (w4-copy)" and str(again) in labels[2] and str(outs["w4"]) in labels[0]
    assert [e["path"] for e in data["entries"]] == [str(outs["w4"]), str(copy), str(again)]


def test_a_pinned_baseline_score_file_holds_for_the_reports_verdicts_too(scored, checkpoints, tiny_model, tmp_path):
    """The gate refuses to decide against a baseline score file other than the policy's pin; the report
    recomputed a PASS there. Now it shows no verdict, saying why; with the pin of the cached file it decides."""
    from quantize.evaluate import cache

    root, pol = scored
    _, suite, outs = checkpoints
    os.environ["QUANTIZE_CACHE"] = str(root / "cache")
    try:
        run = cache.runtimes(open_suite(suite))[0]
        found = cache.score_file_sha256(open_suite(suite), identity_sha256(tiny_model), run)
        for pin, gate in (("a" * 64, "no verdict"), (found, "PASS")):
            pinned = tmp_path / f"pinned-{gate[:2]}.yaml"
            pinned.write_text(pol.read_text() + f"baseline_scores_sha256: {pin}\n")
            out = tmp_path / f"rep-{gate[:2]}"
            args = ["report", str(outs["w4"]), "--baseline", str(tiny_model), "--policy", str(pinned)]
            assert main([*args, "--out", str(out)]) == 0
            row = _rows(out)["w4"]
            assert row["gate"] == gate
        assert "pins the baseline's score file to aaaaaaaaaaaa" in _rows(tmp_path / "rep-no")["w4"]["verdict from"]
    finally:
        del os.environ["QUANTIZE_CACHE"]


def test_another_vocabulary_gets_no_verdict_from_the_report(scored, checkpoints, tiny_model, tmp_path, monkeypatch):
    """The gate refuses a pair whose vocabularies differ; the report recomputed a PASS for a copy of the baseline
    with four token ids rotated in tokenizer.json. A re-saved tokenizer_config.json (w4's: keys of transformers'
    own) is the same vocabulary and keeps its recomputed verdict (test_report_with_a_gap)."""
    root, pol = scored
    _, suite, _ = checkpoints
    monkeypatch.setenv("QUANTIZE_CACHE", str(root / "cache"))
    other = tmp_path / "othertok"
    shutil.copytree(tiny_model, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    names = sorted(vocab, key=vocab.get)[100:104]
    ids = [vocab[n] for n in names]
    for n, i in zip(names, ids[1:] + ids[:1], strict=True):
        vocab[n] = i
    (other / "tokenizer.json").write_text(json.dumps(tok))
    score(open_suite(suite), other)
    out = tmp_path / "rep"
    assert main(["report", str(other), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)]) == 0
    row = _rows(out)["othertok"]
    assert row["gate"] == "no verdict" and "another vocabulary than the baseline's" in row["verdict from"]


def test_a_saved_verdict_of_another_task_suite_setting_or_pin_is_stale(staged, checkpoints, tiny_model, monkeypatch):
    """A rule renamed to judge another task kept its label; a suite of other settings (max_length) on the same
    golden set, or another suite file (an older verdict, without recorded settings), and a baseline score file
    other than a pin, each made a saved verdict the report's. Each is stale now, named."""
    from quantize.gates.policy import load_policy
    from quantize.report.collect import saved_mismatch

    root, pol, saved = staged
    monkeypatch.setenv("QUANTIZE_CACHE", str(root / "cache"))  # where the staged gate kept its verdict
    v, policy, suite = records.parse(records.Verdict, saved, "test"), load_policy(pol), open_suite(checkpoints[1])
    ids = identity_sha256(tiny_model), identity_sha256(root / "fp8")
    assert v.provenance.suite_settings and saved_mismatch(v, policy, suite, *ids) is None
    named = v.model_copy(update={"rules": [v.rules[0].model_copy(update={"rule": "quality"})]})
    rule = policy.rules[0].model_copy(update={"name": "quality", "task": "core_cloze"})
    renamed = policy.model_copy(update={"rules": [rule]})
    assert "judged (task, metric) ('core_facts', 'acc')" in saved_mismatch(named, renamed, suite, *ids)
    longer = v.provenance.model_copy(update={"suite_settings": {**v.provenance.suite_settings, "max_length": 16}})
    assert saved_mismatch(v.model_copy(update={"provenance": longer}), policy, suite, *ids) == (
        "another suite's: gate.json was on suite settings that differ in max_length"
    )
    older = v.provenance.model_copy(update={"suite_settings": None, "suite": "elsewhere.yaml"})
    assert saved_mismatch(v.model_copy(update={"provenance": older}), policy, suite, *ids).startswith(
        "another suite's: gate.json was on suite elsewhere.yaml"
    )
    pinned = policy.model_copy(update={"baseline_scores_sha256": "b" * 64})
    assert saved_mismatch(v, pinned, suite, *ids).startswith("other baseline scores")


def test_a_verdict_that_contradicts_its_rules_is_refused_wherever_it_is_read(staged):
    """A hand-edited gate.json saying pass above a regression (or above NaN evidence, or a rule's pass above its
    own bounds past the margin) was shown as PASS and put in a model card; the record refuses it (exit 2 where it
    is read)."""
    from quantize.errors import UsageError

    forged = copy.deepcopy(staged[2])
    forged["rules"][0]["verdict"] = "regression"
    with pytest.raises(UsageError, match="is not what its rules give"):
        records.parse(records.Verdict, forged, "gate.json")
    past = copy.deepcopy(staged[2])  # a pass whose own lower bound is past the margin (a review's forge1.json)
    past["rules"][0]["evidence"]["lower_bound"] = -past["rules"][0]["evidence"]["margin"] - 0.4
    with pytest.raises(UsageError, match="rule core_facts acc is pass, and its own evidence gives inconclusive"):
        records.parse(records.Verdict, past, "gate.json")
    nan = copy.deepcopy(staged[2])
    nan["rules"][0]["evidence"]["delta"] = "NaN"
    with pytest.raises(UsageError, match="not finite"):
        records.parse(records.Verdict, nan, "gate.json")
    inconclusive = copy.deepcopy(staged[2])
    inconclusive["rules"][0]["verdict"] = "inconclusive"
    inconclusive["rules"][0]["evidence"]["lower_bound"] = -0.6  # past the margin, the upper bound above 0
    for code in (0, 1):  # as fail_on_inconclusive said
        assert records.parse(records.Verdict, {**inconclusive, "verdict": "inconclusive", "exit_code": code}, "t")


def test_a_nan_candidate_shows_no_figures_and_report_json_stays_json(checkpoints, tiny_model, tmp_path, monkeypatch):
    """A candidate with NaN everywhere read "1.000 ± 0.000", was plotted at the top of the Pareto panels, and
    report.json held bare NaN tokens. Its cells say non-finite (k of n items), no point is plotted for it, the
    evidence row names the reason and shows no change (it read "Δ +0.0417", lm-eval's argmax over NaN against the
    baseline, plotted as a point), report.json parses strictly."""
    from quantize.records import non_finite_items
    from quantize.report.render import value

    from conftest import nan_copy

    _, suite, _ = checkpoints
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "nan"
    shutil.copytree(tiny_model, bad)
    nan_copy(tiny_model / "model.safetensors", bad / "model.safetensors")
    for c in (tiny_model, bad):
        facts = score(open_suite(suite), c).doc.tasks["core_facts"]
    pol = tmp_path / "p.yaml"
    pol.write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.2}}\n")
    out = tmp_path / "rep"
    assert main(["report", str(bad), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)]) == 0
    row = _rows(out)["nan"]
    bad_items = non_finite_items(facts)  # the NaN copy's scores, as computed
    assert bad_items and row["gate"] == "REJECTED"
    assert row["facts"] == f"non-finite ({len(bad_items)} of {facts.n} items)"
    text = (out / "report.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"report.json holds {c}"))
    [point] = data["evidence"]
    assert point["outcome"].startswith("regression (the candidate computes NaN")
    assert point["value"] == point["lower"] == point["upper"] == "NaN"  # no change measured over NaN
    [evidence_row] = [line for line in (out / "report.md").read_text().splitlines() if "core\\_facts acc" in line]
    assert [c.strip() for c in evidence_row.split("|")][4:6] == ["non-finite", "\\-"]  # change, bounds
    from quantize.cost.bounds import HARDWARE
    from quantize.report.collect import collect

    entries = collect([bad], str(suite), tiny_model, None, HARDWARE["seed"])
    assert value(entries[1], "core_facts:acc") is None and value(entries[0], "core_facts:acc") is not None


def test_a_quantize_json_of_other_weights_labels_nothing(checkpoints, tmp_path, capsys):
    """w4's folder with fp8's weights and config copied in was shown as "w4 | rtn | W4A16" at fp8's bits; the
    record is not read where its weights are not the folder's."""
    _, suite, outs = checkpoints
    stale = tmp_path / "w4"
    shutil.copytree(outs["w4"], stale)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(outs["fp8"] / name, stale / name)
    out = tmp_path / "rep"
    assert main(["report", str(stale), str(outs["w4"]), "--suite", str(suite), "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    [copy_, real] = sorted(data["entries"], key=lambda e: e["path"] != str(stale))
    assert copy_["method"] == "-" and copy_["recipe"] is None and "records weights" in copy_["record_stale"]
    assert real["method"] == "rtn" and real["record_stale"] is None
    assert "Not the output its `quantize.json` describes" in (out / "report.md").read_text()


def test_a_dollar_in_a_name_is_a_dollar_not_mathtext(tiny_model, tmp_path, capsys):
    """matplotlib read `$...$` in a checkpoint's name as mathtext: an unknown command was exit 3."""
    name = "w4 $\\nosuchcmd$"
    shutil.copytree(tiny_model, tmp_path / name)
    suite = tmp_path / "s.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'core' / 'v1'}\n")
    out = tmp_path / "rep"
    assert main(["report", str(tmp_path / name), "--suite", str(suite), "--out", str(out)]) == 0, capsys.readouterr()
    assert "nosuchcmd" in (out / "bytes.svg").read_text()


def test_a_policy_that_does_not_fit_its_suite_is_refused_as_the_gate_refuses_it(
    checkpoints, tiny_model, tmp_path, capsys
):
    """acc on a rolling task (no per-item acc) was exit 2 advising --refresh, which cannot help."""
    _, suite, outs = checkpoints
    pol = tmp_path / "p.yaml"
    pol.write_text(f"suite: {suite}\nrules:\n  - {{task: core_prose, metric: acc, margin: 0.2}}\n")
    args = ["report", str(outs["w4"]), "--baseline", str(tiny_model), "--policy", str(pol)]
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "rule 1 (core_prose acc) asks for acc on core_prose" in err and "--refresh" not in err


def test_the_baseline_listed_among_the_candidates_is_one_row(checkpoints, tiny_model, tmp_path):
    _, suite, outs = checkpoints
    out = tmp_path / "rep"
    again = tiny_model.parent / ".." / tiny_model.parent.name / tiny_model.name  # the same folder, spelt otherwise
    args = ["report", str(again), str(outs["w4"]), "--baseline", str(tiny_model), "--suite", str(suite)]
    assert main([*args, "--out", str(out)]) == 0
    assert list(_rows(out)) == ["tiny-llama (baseline)", "w4"]


def test_a_gguf_candidate_gets_the_decode_bounds_quantize_cost_gives_it(tmp_path):
    """The report read a GGUF's KV layout from config.json only ("No bounds"), where `quantize cost --checkpoint`
    prices it from the header: the same bound now."""
    from gguf_models import byteless_vocabulary_gguf

    from quantize.api import decode_cost
    from quantize.cost.bounds import HARDWARE
    from quantize.report.collect import _entry, decode_bounds

    g = byteless_vocabulary_gguf(tmp_path / "m.gguf")  # a tiny MoE: its header is all the bounds read
    bounds = decode_bounds(_entry(g), None, HARDWARE["seed"], 32, 2048)
    assert bounds.not_computable is None and bounds.batch1_ms > 0
    cost = decode_cost(g, hardware="seed")
    assert cost.formats["measured"].batch1_step_bound_ms == pytest.approx(bounds.batch1_ms, rel=1e-9)
    assert cost.formats["measured"].batch_step_bound_ms == pytest.approx(bounds.batch_ms, rel=1e-9)


def test_a_gate_over_a_score_file_is_not_a_saved_verdict_for_the_report_or_a_sweep(
    scored, checkpoints, tiny_model, tmp_path, monkeypatch, capsys
):
    """A review's repro: a gate whose baseline is a score file the user wrote (a candidate's own scores, relabelled
    with the baseline's identity) passed, and its verdict was kept in the cache as a gate's own, so the report showed
    the candidate PASS ("saved verdict") and a sweep took it as done. A gate over a score file (either side) keeps
    nothing; a verdict an older version kept so is not held either; the report decides from cached scores instead."""
    from quantize.evaluate import cache
    from quantize.io import write_text_atomic

    root, pol = scored
    _, suite, outs = checkpoints
    shutil.copytree(root / "cache", tmp_path / "cache")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    cand = tmp_path / "c" / "w4"
    shutil.copytree(outs["w4"], cand)
    own = score(open_suite(suite), cand).doc  # its honest scores (cached)
    base_ref = score(open_suite(suite), tiny_model).doc.provenance.checkpoint
    forged = own.model_copy(update={"provenance": own.provenance.model_copy(update={"checkpoint": base_ref})})
    records.write(tmp_path / "forged.json", forged)
    records.write(tmp_path / "w4.json", own)
    verdicts = tmp_path / "cache" / "verdicts"
    for base_side, cand_side, which in (
        (tmp_path / "forged.json", cand, "baseline"),
        (tiny_model, tmp_path / "w4.json", "candidate"),
    ):
        capsys.readouterr()
        assert main(["gate", str(pol), "--baseline", str(base_side), "--candidate", str(cand_side), "--json"]) == 0
        printed = capsys.readouterr().out
        v = records.parse(records.Verdict, json.loads(printed), "gate")
        assert v.verdict == "pass" and v.provenance.candidate.checkpoint.identity_sha256 == identity_sha256(cand)
        assert not verdicts.exists() or not list(verdicts.iterdir())  # nothing kept as a gate's own
        (cand / "gate.json").write_text(printed)
        # what an older version kept: the same bytes under the cache's name for them
        text, path = cache._verdict_text(v)
        write_text_atomic(path, text)
        assert not cache.holds_verdict(v)
        out = tmp_path / f"rep-{which}"
        assert main(["report", str(cand), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)]) == 0
        row = _rows(out)["w4"]
        assert row["verdict from"].startswith("recomputed from cached full scores")
        assert (
            f"not a gate's own decision on the checkpoints: the {which}'s scores came from a file"
            in (row["verdict from"])
        )
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(f"name: t\nmodel: {tiny_model}\ncheckpoints: [{cand}]\npolicy: {pol}\noutput: {tmp_path}/o\n")
        capsys.readouterr()
        assert main(["sweep", str(sweep), "--plan", "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)["candidates"][0]
        assert plan["todo"] == "gate" and f"the {which}'s scores came from a file" in plan["message"]
        shutil.rmtree(verdicts)
    # the gate on the two checkpoints keeps its verdict, and the report shows it as saved
    capsys.readouterr()
    main(["gate", str(pol), "--baseline", str(tiny_model), "--candidate", str(cand), "--json"])
    (cand / "gate.json").write_text(capsys.readouterr().out)
    out = tmp_path / "rep-checkpoints"
    assert main(["report", str(cand), "--baseline", str(tiny_model), "--policy", str(pol), "--out", str(out)]) == 0
    assert _rows(out)["w4"]["verdict from"].startswith("saved verdict (gate.json")


def test_a_saved_verdict_is_held_to_every_policy_setting_that_can_change_it(
    staged, checkpoints, tiny_model, monkeypatch
):
    """The report compared a saved verdict's rules and α only: a pass under `allow_different_tokenizer: true`, with
    another `sequential:` design, power or fail_on_inconclusive, was shown under a policy without them. The verdict
    records the policy as the gate applied it, and the report holds it to the whole of it."""
    from quantize.gates.policy import Sequential, load_policy
    from quantize.report.collect import saved_mismatch

    root, pol, saved = staged
    monkeypatch.setenv("QUANTIZE_CACHE", str(root / "cache"))
    v, policy, suite = records.parse(records.Verdict, saved, "test"), load_policy(pol), open_suite(checkpoints[1])
    ids = identity_sha256(tiny_model), identity_sha256(root / "fp8")
    assert saved_mismatch(v, policy, suite, *ids) is None
    for field, value in (
        ("allow_different_tokenizer", not policy.allow_different_tokenizer),
        ("sequential", None),
        ("sequential", Sequential(looks=[0.2, 1.0])),
        ("power", 0.9),
        ("fail_on_inconclusive", not policy.fail_on_inconclusive),
    ):
        other = policy.model_copy(update={field: value})
        why = saved_mismatch(v, other, suite, *ids)
        assert why is not None and why.startswith(f"policy {policy.name} changed since it was gated") and field in why
    assert v.provenance.policy_settings == policy.settings()
    older = v.provenance.model_copy(update={"policy_settings": None})
    assert "does not record the policy it applied" in saved_mismatch(
        v.model_copy(update={"provenance": older}), policy, suite, *ids
    )


@pytest.fixture
def tokx(scored, checkpoints, tiny_model, tmp_path, monkeypatch) -> tuple[Path, Path, int]:
    """A copy of the baseline whose tokenizer splits on whitespace only (one vocabulary, other tokens), scored in a
    copy of `scored`'s cache; `scored`'s policy under the same name allowing other tokenizers; and the number of items
    the two sides scored on other tokens (their score records' token hashes)."""
    from quantize.gates.gate import token_differences

    root, pol = scored
    _, suite, _ = checkpoints
    shutil.copytree(root / "cache", tmp_path / "cache")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    tokx = tmp_path / "tokx"
    shutil.copytree(tiny_model, tokx)
    tok = json.loads((tokx / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "WhitespaceSplit"}
    (tokx / "tokenizer.json").write_text(json.dumps(tok))
    diff = token_differences(score(open_suite(suite), tiny_model).doc, score(open_suite(suite), tokx).doc)
    k = sum(map(len, diff.values()))
    assert k > 0  # the premise: some items tokenize otherwise
    (tmp_path / "allow").mkdir()
    allow = tmp_path / "allow" / pol.name  # the same policy name, allowing other tokenizers
    allow.write_text(pol.read_text() + "allow_different_tokenizer: true\n")
    return tokx, allow, k


def test_a_verdict_on_a_tokenizer_that_splits_text_otherwise_names_the_items(tokx, tiny_model, tmp_path, capsys):
    """Under `allow_different_tokenizer: true` the gate passed a tokenizer that splits text otherwise over one
    vocabulary, and its verdict said nothing of the tokens (the gate and the report's own verdict alike): both name
    the items scored on other tokens."""
    cand, allow, k = tokx
    capsys.readouterr()
    main(["gate", str(allow), "--baseline", str(tiny_model), "--candidate", str(cand), "--json"])
    v = json.loads(capsys.readouterr().out)
    assert any(f"scored on other tokens for {k} of" in n and "allow_different_tokenizer" in n for n in v["notes"])
    out = tmp_path / "rep"
    assert main(["report", str(cand), "--baseline", str(tiny_model), "--policy", str(allow), "--out", str(out)]) == 0
    entry = next(e for e in json.loads((out / "report.json").read_text())["entries"] if e["label"] == "tokx")
    assert entry["verdict"] is not None
    assert any(f"scored on other tokens for {k} of" in n for n in entry["verdict"]["notes"])


def test_a_candidate_scored_on_other_tokens_is_withheld_and_the_report_written(
    tokx, scored, checkpoints, tiny_model, tmp_path, capsys
):
    """The report under a policy that does not allow other tokenizers exited 2 with the gate's message and wrote
    nothing, whatever the other candidates. Now it withholds that candidate's verdict with the gate's reason and
    writes the rest; a verdict saved by a gate under a policy allowing them is not shown (another policy setting's)."""
    cand, allow, k = tokx
    _, pol = scored
    _, _, outs = checkpoints
    args = ["report", str(outs["w4"]), str(cand), "--baseline", str(tiny_model), "--policy", str(pol)]
    for saved in (False, True):
        if saved:
            capsys.readouterr()
            main(["gate", str(allow), "--baseline", str(tiny_model), "--candidate", str(cand), "--json"])
            (cand / "gate.json").write_text(capsys.readouterr().out)
        out = tmp_path / f"rep-{saved}"
        assert main([*args, "--out", str(out)]) == 0
        rows = _rows(out)
        assert rows["w4"]["gate"] == "PASS" and rows["tokx"]["gate"] == "no verdict"
        assert (
            "not decided from the cached scores: the gate refuses to decide from these scores: the baseline "
            in (rows["tokx"]["verdict from"])
        )
        assert f"scored on other tokens for {k} item(s)" in rows["tokx"]["verdict from"]
        stale = "gate.json not shown: policy p changed since it was gated: "
        assert (stale in rows["tokx"]["verdict from"]) == saved
        assert ("allow_different_tokenizer True then, False now" in rows["tokx"]["verdict from"]) == saved


def test_a_report_of_checkpoints_with_no_finite_figure_is_drawn(tiny_model, tmp_path, monkeypatch):
    """A review (r5, session 44): `quantize report` of a checkpoint whose scores are all NaN, without a baseline,
    was exit 3 (`min() arg is an empty sequence` labelling a task's panel, which had no point). The panel
    says it has no finite figure and the report is written."""
    from conftest import ROOT, nan_copy

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "nan"
    shutil.copytree(tiny_model, bad)
    nan_copy(tiny_model / "model.safetensors", bad / "model.safetensors")
    smoke = str(ROOT / "evaluate" / "smoke.yaml")
    assert main(["eval", smoke, str(bad), "-q"]) == 0  # its scores: NaN, cached
    out = tmp_path / "rep"
    assert main(["report", str(bad), "--suite", smoke, "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and "nan" in _rows(out)
