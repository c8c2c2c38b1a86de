"""Gather what the other commands wrote about each checkpoint: bits (quantize.json or the header
accounting), cached scores, cached agreement with the baseline, the gate verdict, decode-cost bounds.
Nothing here scores a model: a checkpoint without cached scores appears as "not scored", or, where a gate
judged it in stages, with the gate's evidence (each rule's Δ, bounds and items).

The verdict is the one the gate gave and saved beside the candidate (gate.json, `quantize gate --json`), when it
names this policy (its rules and limits as the file says them now), the checkpoint's identity and the baseline's as
they are now, and this golden set; a gate.json that does not is kept with the reason (`Entry.verdict_stale`: stale
when the checkpoint changed since), never shown as the verdict. Only where none is saved does
the report decide from cached full scores (the fixed design), labelled as recomputed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantize import records
from quantize.checkpoint import ggufs
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import identity_sha256, read_config
from quantize.checkpoint.rounding import stored_rounds_activations
from quantize.cost import bounds as cost
from quantize.errors import UsageError
from quantize.evaluate import cache
from quantize.evaluate.suite import open_suite
from quantize.gates.gate import agreement_rule, decide
from quantize.gates.policy import AccuracyRule, AgreementRule, PerplexityRule, Policy, load_policy
from quantize.records import (
    VERDICT_FILE,
    AccuracyEvidence,
    AgreementResult,
    PerplexityEvidence,
    RunRecord,
    ScoreDoc,
    UntestedResult,
    Verdict,
)


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
    # where `verdict` came from: "saved" (gate.json beside the checkpoint, checked against the identities) or
    # "recomputed" (decided here from cached full scores: the fixed design, which CI may not have run)
    verdict_origin: str | None = None
    # why a gate.json beside the checkpoint is not its verdict here (stale: the checkpoint changed since; another
    # policy's, baseline's or golden set's); None when there is none, or it is the verdict
    verdict_stale: str | None = None
    recipe: dict[str, Any] | None = None  # the resolved recipe its quantize.json records (None: not ours)
    # its config.json rounds activations (checkpoint/rounding.py): its scores are read under this CPU (entry_runtime)
    rounds_activations: bool = False


def _entry(path: Path) -> Entry:
    meta_path = path / "quantize.json"
    r = bits_report(path)
    recipe = None
    if meta_path.is_file():
        meta = records.read(RunRecord, meta_path)
        recipe = meta.recipe.resolved
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
        recipe=recipe,
        rounds_activations=ggufs.find(path) is None and stored_rounds_activations(path),  # a GGUF: llama.cpp's
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
        cfg = read_config(Path(entry.path))
        kv = cost.kv_layout_from_config(cfg)
        weights, active = cost.checkpoint_weights(Path(entry.path), cfg)  # an MoE reads k/E of its experts
    except UsageError as e:
        return DecodeBounds(not_computable=str(e))
    m = cost.CostModel((active if weights.routed else None) or entry.parameters or 1, kv, hardware, context)
    out = DecodeBounds(
        batch1_ms=1000 * m.step_bound_s(weights, 1),
        batch_ms=1000 * m.step_bound_s(weights, batch),
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


def read_saved(path: Path) -> Verdict | None:
    """The verdict saved beside a checkpoint (gate.json), read through its record; None when there is none. A
    file that is not a current verdict record is a UsageError naming it (exit 2)."""
    f = path / VERDICT_FILE
    return records.read(Verdict, f) if f.is_file() else None


def saved_mismatch(v: Verdict, policy: Policy, suite: Any, base_id: str, cand_id: str) -> str | None:
    """Why a saved verdict is not this policy's on this pair and golden set, or None when it is. Identities are
    the ones computed now from the files: a candidate changed since it was gated makes the verdict stale."""
    p = v.provenance
    was = p.candidate.checkpoint.identity_sha256
    if was != cand_id:
        return (
            f"stale: {VERDICT_FILE} judged checkpoint {was[:12]}, this one is {cand_id[:12]} now (changed since it was "
            "gated; gate it again)"
        )
    if p.baseline.checkpoint.identity_sha256 != base_id:
        return (
            f"another baseline's: {VERDICT_FILE} was against {p.baseline.checkpoint.identity_sha256[:12]}, the "
            f"report's baseline is {base_id[:12]}"
        )
    if v.policy != policy.name:
        return (
            f"another policy's: {VERDICT_FILE} is policy {v.policy}'s verdict, the report's --policy is {policy.name}"
        )
    if changed := rules_changed(v, policy):
        return f"policy {policy.name} changed since it was gated: {changed}"
    if p.golden.manifest_sha256 != suite.golden.manifest_sha256:
        return (
            f"another golden set's: {VERDICT_FILE} was on {p.golden.name}/{p.golden.version} "
            f"({p.golden.manifest_sha256[:12]}), the policy's suite is on {suite.golden.manifest_sha256[:12]}"
        )
    return None


def _limit(x: Any) -> Any:
    """A rule's limit, from the rule or from the evidence its result recorded: margin, max_ratio, or (max, min)."""
    if isinstance(x, AccuracyRule | AccuracyEvidence):
        return x.margin
    if isinstance(x, PerplexityRule | PerplexityEvidence):
        return x.max_ratio
    return (x.max, x.min)


def rules_changed(v: Verdict, policy: Policy) -> str | None:
    """How the policy's rules differ from the ones the saved verdict judged (labels, then each rule's limit and
    α as its evidence recorded them), or None when they are the same."""
    labels = [policy.label(i) for i in range(len(policy.rules))]
    if [r.rule for r in v.rules] != labels:
        return f"{VERDICT_FILE} judged {[r.rule for r in v.rules]}, the policy's rules are {labels}"
    for r, rule in zip(v.rules, policy.rules, strict=True):
        if isinstance(r, UntestedResult):
            continue
        then, now = (_limit(r.evidence), r.evidence.alpha), (_limit(rule), policy.alpha)
        if then != now:
            return f"rule {r.rule} was judged at (limit, α) {then}, the policy now says {now}"
    return None


def saved_verdict(path: Path, policy: Policy, suite: Any, base_id: str, cand_id: str) -> Verdict | None:
    """A verdict saved beside the checkpoint, when it is this policy's on this pair and golden set: a sequential
    gate scores a sample, so there are no full scores to decide from again."""
    v = read_saved(path)
    return v if v is not None and saved_mismatch(v, policy, suite, base_id, cand_id) is None else None


def settle_verdict(e: Entry, base: Entry, policy: Policy, suite: Any, needs_agreement: bool) -> None:
    """A candidate's verdict: the saved one where it matches (whatever cached scores would say under the fixed
    design: a staged gate's rejection stays a rejection); else one decided here from cached full scores, labelled
    as recomputed (on one engine: across engines only the gate's own, saved verdict counts); else, with agreement
    alone, the policy's agreement rules (`agreement_outcome`)."""
    saved = read_saved(Path(e.path))
    if saved is not None:
        e.verdict_stale = saved_mismatch(saved, policy, suite, base.sha256, e.sha256)
        if e.verdict_stale is None:
            e.verdict, e.verdict_origin = saved, "saved"
            return
    # across engines (a GGUF scored in llama.cpp beside transformers' scores) a verdict needs both sides' tokens
    # compared, which only `quantize gate` does (evaluate/tokens.py loads tokenizers; the report loads nothing)
    both = e.scores is not None and base.scores is not None
    across = both and (e.scores.provenance.engine is None) != (base.scores.provenance.engine is None)
    if both and (e.agreement or not needs_agreement) and not across:
        e.verdict, e.verdict_origin = decide(policy, base.scores, e.scores, e.agreement), "recomputed"
    elif e.agreement and needs_agreement:
        e.agreement_outcome = agreement_outcome(policy, e.agreement)


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
    run = report_runtime(suite, entries, base)
    base_run = entry_runtime(suite, base, run) if base else None
    for e in entries:
        own = entry_runtime(suite, e, run)
        e.scores = cache.lookup_scores(suite, e.sha256, own)
        if base and not e.is_baseline:
            e.agreement = cache.lookup_agreement(suite, base.sha256, e.sha256, own, base_run)
            if policy:
                settle_verdict(e, base, policy, suite, needs_agr)
        e.decode = decode_bounds(e, base, hardware, batch, context)
    return entries


def entry_runtime(suite: Any, e: Entry, run: cache.Runtime) -> cache.Runtime:
    """The runtime an entry's numbers are read under: a GGUF's are llama.cpp's, on the CPU (evaluate/engine.py),
    every other checkpoint's the report's one runtime, which for a checkpoint that rounds activations names this
    machine's CPU and a thread count (cache.Runtime.rounding): this process's, else the first other count with
    scores (cache.on_this_cpu: a sweep's tasks score at their own). Scores computed on another CPU are not read."""
    if ggufs.find(e.path) is not None:
        return cache.llamacpp_runtime(suite)
    tried = cache.on_this_cpu(run.rounding(e.rounds_activations))
    return next((r for r in tried if cache.score_file_sha256(suite, e.sha256, r) is not None), tried[0])


def report_runtime(suite: Any, entries: list[Entry], base: Entry | None = None) -> cache.Runtime:
    """The one runtime the report reads every entry's scores under, so it never sets numbers computed on a CPU
    beside numbers from an accelerator: the one under which most anchors (the baseline, else every entry) have
    scores, then (on a tie, e.g. when nothing was scored and `quantize agree` measured on a GPU) the one under
    which most of the other entries have an agreement with the baseline, then the first of `cache.runtimes` (a
    CPU without the checkpoints' own code)."""
    anchors = [base] if base else entries
    others = [e for e in entries if e is not base] if base else []

    def found(r: cache.Runtime) -> tuple[int, int]:
        scored = sum(cache.score_file_sha256(suite, e.sha256, entry_runtime(suite, e, r)) is not None for e in anchors)
        if base is None:
            return scored, 0
        base_run = entry_runtime(suite, base, r)
        runs = ((e, entry_runtime(suite, e, r)) for e in others)
        return scored, sum(cache.agreement_path(suite, base.sha256, e.sha256, o, base_run).is_file() for e, o in runs)

    return max(cache.runtimes(suite), key=found)


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
