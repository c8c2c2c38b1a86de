"""A gate on a mixture-of-experts checkpoint gives a verdict like any other: a tiny seeded Qwen3-MoE
(tests/families.py) against its FP8 conversion passes with measured evidence, and against a copy whose routed
experts were planted wrong is rejected by that evidence (small golden set; a policy that fails on regressions
only, with a KL tolerance of 0.001 nats: FP8 measures about 1e-5 on these random weights, the broken experts
about 6e-3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from families import build

from quantize import records
from quantize.cli import main
from quantize.records import Verdict

from conftest import ROOT, small_golden, suite_file


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("moe-gate")
    suite = suite_file(base / "suite.yaml", small_golden(base))
    policy = base / "lenient.yaml"
    policy.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n  - {agreement: kl, max: 0.001}\n"
        "  - {task: core_facts, metric: acc, margin: 0.5}\n"
    )
    return base, policy, build("qwen3_moe", base / "qwen3-moe")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-moe-gate"))


def gate(policy: Path, baseline: Path, candidate: Path, capsys) -> tuple[int, Verdict]:
    code = main(["gate", str(policy), "--baseline", str(baseline), "--candidate", str(candidate), "--json", "-q"])
    return code, records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")


def test_an_fp8_moe_passes_with_evidence(world, capsys):
    base, policy, source = world
    recipe = yaml.safe_load((ROOT / "recipes" / "fp8-e4m3.yaml").read_text())
    path = base / "fp8.yaml"
    path.write_text(yaml.safe_dump(recipe | {"model": str(source), "output": str(base / "fp8")}))
    code, said = main(["run", str(path), "--quiet"]), capsys.readouterr()
    assert code == 0, said.err
    code, v = gate(policy, source, base / "fp8", capsys)
    assert code == 0 and v.verdict == "pass" and v.exit_code == 0
    by = {r.rule: r for r in v.rules}
    kl = by["agreement kl"].evidence
    assert 0 < kl.upper_bound < 0.001 and kl.positions > 0 and kl.items > 0  # measured, and not nothing
    ppl = by["core_prose perplexity"].evidence
    assert ppl.n > 0 and 0.5 < ppl.ratio < 1.5
    assert by["core_facts acc"].evidence.n > 0
    assert v.provenance.baseline.checkpoint.identity_sha256 != v.provenance.candidate.checkpoint.identity_sha256
    assert v.provenance.candidate_scores == "computed"


def test_an_moe_with_broken_experts_is_rejected_by_its_evidence(world, capsys):
    """The routed experts' weights ×50 (the router, attention and every other tensor untouched)."""
    from safetensors.torch import load_file, save_file

    base, policy, source = world
    broken = base / "broken"
    shutil.copytree(source, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    experts = [n for n in tensors if ".mlp.experts." in n]
    assert experts  # fused (transformers 5) or per expert: either way the routed experts' tensors
    for n in experts:
        tensors[n] = tensors[n] * 50
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    code, v = gate(policy, source, broken, capsys)
    by = {r.rule: r for r in v.rules}
    assert code == 1 and v.verdict == "rejected", by["agreement kl"].evidence
    assert by["agreement kl"].verdict == "regression" and by["agreement kl"].evidence.lower_bound > 0.001
