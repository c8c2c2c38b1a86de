"""The report: Pareto frontier, table values, graceful gaps, and a self-contained HTML page."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from quantize.cli import main
from quantize.evaluate.score import score
from quantize.golden.build import Sizes
from quantize.report.render import label_positions, pareto_front, spread_labels
from quantize.suite import open_suite

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


def test_a_checkpoint_without_a_kv_layout_has_no_decode_bounds_and_the_report_goes_on(tiny_model, tmp_path, capsys):
    cfg = json.loads((tiny_model / "config.json").read_text())
    shutil.copytree(tiny_model, tmp_path / "no-heads")
    (tmp_path / "no-heads" / "config.json").write_text(
        json.dumps({k: v for k, v in cfg.items() if k != "num_attention_heads"})
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
