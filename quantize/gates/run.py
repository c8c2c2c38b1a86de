"""Orchestrate a gate run: scores (cached), agreement (cached), then the decision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantize.errors import UsageError
from quantize.evaluate import agreement as agr
from quantize.evaluate.score import score
from quantize.evaluate.suite import load_suite
from quantize.gates.gate import Verdict, decide
from quantize.gates.policy import AgreementRule, load_policy
from quantize.golden.manifest import verify
from quantize.io import write_json
from quantize.models import check_model_dir, weights_sha256


def load_scores(suite_path: str, target: str | Path) -> dict[str, Any]:
    """A checkpoint folder is scored (or read from the cache); a .json file is a saved `quantize eval --json --items`."""
    p = Path(target)
    if p.is_file() and p.suffix == ".json":
        try:
            doc = json.loads(p.read_text())
            doc["tasks"][next(iter(doc["tasks"]))]["items"]
        except (json.JSONDecodeError, KeyError, StopIteration, TypeError):
            raise UsageError(f"{p} is not a score file with per-item records; write one with `quantize eval SUITE CKPT --json --items`") from None
        return doc
    return score(suite_path, p)


def _load(path: Path, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32 if device == "cpu" else "auto")
    return model.to(device).eval(), tok


def agreement_scores(suite_path: str, baseline: Path, candidate: Path) -> dict[str, Any]:
    import torch

    suite, _ = load_suite(suite_path)
    golden = verify(suite.golden)
    a = suite.agreement
    b_sha, c_sha = weights_sha256(baseline), weights_sha256(candidate)
    base_path, cmp_path = agr.cache_paths(golden, a, b_sha, c_sha)
    if cmp_path.is_file():
        return json.loads(cmp_path.read_text())
    tasks = a.tasks or golden.tasks
    reqs = agr.requests(golden, tasks, a.per_task)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    max_length = suite.max_length or 2048
    if base_path.is_file():
        base = agr.load_baseline(base_path)
    else:
        model, tok = _load(baseline, device)
        base = agr.baseline_topk(model, tok, reqs, a.top_k, suite.batch_size, max_length)
        agr.save_baseline(base_path, base)
        del model
    model, tok = _load(candidate, device)
    result = agr.compare(model, tok, reqs, base, suite.batch_size, max_length)
    result.update(baseline_sha256=b_sha, candidate_sha256=c_sha, top_k=a.top_k, per_task=a.per_task, tasks=tasks)
    cmp_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(cmp_path, result)
    return result


def run_gate(policy_path: str | Path, baseline: str | Path, candidate: str | Path) -> Verdict:
    policy = load_policy(policy_path)
    load_suite(policy.suite)  # a bad suite is a usage error before any scoring
    needs_agreement = any(isinstance(r, AgreementRule) for r in policy.rules)
    for target in (baseline, candidate):
        p = Path(target)
        if not p.exists():
            raise UsageError(f"{p} does not exist; pass a checkpoint folder or a score file (.json)")
        if p.is_dir():
            check_model_dir(p)
        elif needs_agreement:
            raise UsageError(f"policy {policy.name} has agreement rules, which need checkpoints, not score files: {p}")
    base = load_scores(policy.suite, baseline)
    cand = load_scores(policy.suite, candidate)
    agreement = agreement_scores(policy.suite, Path(baseline), Path(candidate)) if needs_agreement else None
    return decide(policy, base, cand, agreement)
