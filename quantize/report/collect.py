"""Gather what the other commands wrote about each checkpoint: bits (quantize.json or the header
accounting), cached scores, cached agreement with the baseline, the gate verdict, decode-cost bounds.
Nothing here scores a model: a checkpoint without cached scores appears as "not scored"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantize import cache, records
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import identity_sha256, read_config
from quantize.cost import bounds as cost
from quantize.errors import UsageError
from quantize.gates.gate import agreement_rule, decide
from quantize.gates.policy import AgreementRule, Policy, load_policy
from quantize.records import AgreementResult, RunRecord, ScoreDoc, Verdict
from quantize.suite import open_suite


@dataclass
class Entry:
    path: str
    label: str
    method: str
    scheme: str
    total_bytes: int
    parameters: int | None
    bits_per_weight: float | None
    qlinear_bits: float | None
    bytes_by_role: dict[str, int]
    sha256: str  # the checkpoint's identity (weights, config, tokenizer): what scores are cached under
    is_baseline: bool = False
    scores: ScoreDoc | None = None
    agreement: AgreementResult | None = None
    verdict: Verdict | None = None
    # the policy's agreement rules alone, when there are no scores yet: "pass", "regression" or "inconclusive"
    agreement_outcome: str | None = None
    decode: DecodeBounds | None = None


def _entry(path: Path) -> Entry:
    meta_path = path / "quantize.json"
    r = bits_report(path)
    if meta_path.is_file():
        meta = records.read(RunRecord, meta_path)
        label, method, scheme, params = (
            meta.label or path.name,
            meta.method,
            meta.scheme or "-",
            meta.bits.source_parameters,
        )
    else:
        label, method, scheme, params = path.name, "-", r.format, r.parameters
    sha = identity_sha256(path)
    return Entry(
        str(path),
        label,
        method,
        scheme,
        r.total_bytes,
        params,
        8 * r.total_bytes / params if params else None,
        r.quantized_linear_bits_per_weight,
        r.bytes_by_role,
        sha,
    )


class DecodeBounds(BaseModel):
    """An entry's decode-cost lower bounds (milliseconds per step at batch 1 and at the report's batch), and the
    speculative speedup it would give as a draft for the baseline (α = its measured Σ min(p, q)); or, alone,
    why none can be computed (`not_computable`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    not_computable: str | None = None
    batch1_ms: float | None = None
    batch_ms: float | None = None
    hardware: str | None = None
    context: int | None = None
    batch: int | None = None
    scope: str | None = None
    alpha: float | None = None
    gamma: int | None = None
    draft_cost: float | None = None
    speculative_speedup: float | None = None

    def to_data(self) -> dict[str, Any]:
        """report.json's `decode`: only what was computed."""
        return self.model_dump(exclude_none=True)


def decode_bounds(
    entry: Entry, baseline: Entry | None, hardware: cost.Hardware, batch: int, context: int, gamma: int = 4
) -> DecodeBounds:
    """Decode-cost lower bounds from the entry's bytes; empty, with the reason, when its config lacks the KV layout."""
    try:
        kv = cost.kv_layout_from_config(read_config(Path(entry.path)))
    except UsageError as e:
        return DecodeBounds(not_computable=str(e))
    m = cost.CostModel(entry.parameters or 1, kv, hardware, context)
    out = DecodeBounds(
        batch1_ms=1000 * m.step_bound_s(entry.total_bytes, 1),
        batch_ms=1000 * m.step_bound_s(entry.total_bytes, batch),
        hardware=hardware.name,
        context=context,
        batch=batch,
        scope=cost.SCOPE,
    )
    if baseline is not None and entry.agreement is not None and not entry.is_baseline:
        alpha = min(entry.agreement.sum_min, 0.999)
        c = entry.total_bytes / baseline.total_bytes  # a bandwidth-bound draft costs its bytes' share of a target step
        speedup = cost.speculative_speedup(alpha, gamma, c)
        out = out.model_copy(update=dict(alpha=alpha, gamma=gamma, draft_cost=c, speculative_speedup=speedup))
    return out


VERDICT_FILE = "gate.json"  # `quantize gate ... --json` saved beside the candidate (make gate-all)


def saved_verdict(path: Path, policy: Policy, suite: Any, base_id: str, cand_id: str) -> Verdict | None:
    """A verdict saved beside the checkpoint, when it is this policy's on this pair and golden set: a sequential
    gate scores a sample, so there are no full scores to decide from again."""
    f = path / VERDICT_FILE
    if not f.is_file():
        return None
    v = records.read(Verdict, f)
    p = v.provenance
    same = (
        v.policy == policy.name
        and p.baseline.checkpoint.identity_sha256 == base_id
        and p.candidate.checkpoint.identity_sha256 == cand_id
        and p.golden.manifest_sha256 == suite.golden.manifest_sha256
    )
    return v if same else None


def agreement_outcome(policy: Policy, agreement: AgreementResult) -> str:
    """The policy's agreement rules on their own (a first picture before any scoring): a regression on any of
    them settles a rejection already; passes leave the accuracy and perplexity rules to the full gate."""
    outcomes = [
        agreement_rule(r, policy.label(i), agreement, policy.alpha).verdict
        for i, r in enumerate(policy.rules)
        if isinstance(r, AgreementRule)
    ]
    return "regression" if "regression" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"


def collect(
    checkpoints: list[Path],
    suite_path: str,
    baseline: Path | None,
    policy_path: str | None,
    hardware: cost.Hardware,
    batch: int = 32,
    context: int = 2048,
) -> list[Entry]:
    paths = list(dict.fromkeys([*(p for p in [baseline] if p), *checkpoints]))
    entries = [_entry(p) for p in paths]
    base = entries[0] if baseline else None
    if base:
        base.is_baseline = True
    policy = load_policy(policy_path) if policy_path else None
    needs_agr = policy is not None and any(isinstance(r, AgreementRule) for r in policy.rules)
    suite = open_suite(suite_path)
    run = report_runtime(suite, [base] if base else entries)
    for e in entries:
        e.scores = cache.lookup_scores(suite, e.sha256, run)
        if base and not e.is_baseline:
            e.agreement = cache.lookup_agreement(suite, base.sha256, e.sha256, run)
            if policy and e.scores and base.scores and (e.agreement or not needs_agr):
                e.verdict = decide(policy, base.scores, e.scores, e.agreement)
            elif policy and (v := saved_verdict(Path(e.path), policy, suite, base.sha256, e.sha256)):
                e.verdict = v
            elif policy and e.agreement and needs_agr:
                e.agreement_outcome = agreement_outcome(policy, e.agreement)
        e.decode = decode_bounds(e, base, hardware, batch, context)
    return entries


def report_runtime(suite: Any, anchors: list[Entry]) -> cache.Runtime:
    """The one runtime the report reads every entry's scores under, so it never sets numbers computed on a CPU
    beside numbers from an accelerator: the one under which most of `anchors` (the baseline, else every entry)
    have scores, the first of `cache.runtimes` on a tie (a CPU without the checkpoints' own code)."""
    found = [
        (sum(cache.score_file_sha256(suite, e.sha256, r) is not None for e in anchors), r)
        for r in cache.runtimes(suite)
    ]
    return max(found, key=lambda f: f[0])[1]


def report_suite(suite: str | None, policy: str | None) -> str:
    """The report's suite: --suite, else the policy's, else evaluate/core.yaml; a policy on another suite than
    --suite would judge scores of one golden set by rules sized for another, so that is refused."""
    if policy is None:
        return suite or "evaluate/core.yaml"
    theirs = load_policy(policy).suite
    if suite is not None and Path(suite).resolve() != Path(theirs).resolve():
        raise UsageError(
            f"--suite {suite} and --policy {policy} (suite {theirs}) name different suites; drop --suite to report "
            "on the policy's suite, or pass a policy written for this one"
        )
    return theirs
