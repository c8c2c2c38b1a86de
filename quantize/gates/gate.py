"""The gate: compare a candidate with its baseline item by item, rule by rule, and decide.

Takes score documents and an agreement result (records), never a model. Results whose provenance
differs (golden set, task versions, lm-eval version, suite settings) are refused, naming the field;
the batch size is recorded but may differ (an A/A run at another batch size must pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from quantize import stats
from quantize.errors import UsageError
from quantize.evaluate.suite import OpenSuite, device_kind
from quantize.gates.policy import RULE_OUTPUT_TYPES, AccuracyRule, AgreementRule, PerplexityRule, Policy
from quantize.kinds import kind_of_item
from quantize.records import (
    AccuracyEvidence,
    AccuracyResult,
    AgreementEvidence,
    AgreementMetric,
    AgreementResult,
    AgreementRuleResult,
    GateOutcome,
    PerplexityEvidence,
    PerplexityResult,
    RuleResult,
    ScoreDoc,
    ScoreProvenance,
    SequentialRecord,
    SideRef,
    UntestedResult,
    Verdict,
    VerdictProvenance,
    limit_outcome,
    non_finite_fields,
    non_finite_items,
)
from quantize.tables import first_named

R = TypeVar("R", AccuracyResult, PerplexityResult, AgreementRuleResult)

# Provenance fields that must agree before two results are compared, by the name the refusal gives them.
MUST_MATCH: dict[str, Callable[[ScoreProvenance], Any]] = {
    "golden.name": lambda p: p.golden.name,
    "golden.version": lambda p: p.golden.version,
    "golden.manifest_sha256": lambda p: p.golden.manifest_sha256,
    "task_versions": lambda p: p.task_versions,
    "lm_eval_version": lambda p: p.lm_eval_version,
    "seed": lambda p: p.seed,
    "backend": lambda p: p.backend,
    "dtype": lambda p: p.dtype,
    "device kind": lambda p: device_kind(p.device),  # kernels differ: a CPU's scores beside an accelerator's
    # llama.cpp's build, threads and batch (evaluate/engine.llamacpp_engine): two builds' scores of one GGUF differ
    "engine": lambda p: p.engine,
}
# the dtype of a side scored in llama.cpp (evaluate/cache.llamacpp_runtime): it tokenizes with the GGUF's own
# vocabulary, so its items' tokens must have been compared with the other side's before any pairing
LLAMACPP_DTYPE = "gguf"
SUITE_SETTINGS_IGNORED = {"batch_size"}
# How each side was computed: they may differ only across engines (a GGUF scored in llama.cpp beside transformers'
# scores), where the caller compared both sides' tokens of every item first (quantize/evaluate/tokens.py)
ENGINE_FIELDS = {"backend", "dtype", "device kind", "engine"}


def check_rules(policy: Policy, suite: OpenSuite) -> None:
    """Every rule names a task the suite scores, of a kind the rule can judge, and a sequential schedule's
    boundaries can be computed: refused before any scoring."""
    if policy.sequential is not None:
        try:
            stats.sequential_bounds(policy.sequential.looks, policy.alpha)
        except ValueError as e:
            raise UsageError(f"policy {policy.name}: sequential.looks {policy.sequential.looks}: {e}") from None
    golden = suite.golden
    for i, rule in enumerate(policy.rules):
        if isinstance(rule, AgreementRule):
            continue
        if rule.task not in suite.tasks:
            where = (
                f"the golden set {golden.path} ({golden.manifest.name}/{golden.manifest.version}) has "
                f"{', '.join(golden.tasks)}"
            )
            if rule.task in golden.tasks:
                where = f"suite {suite.path} scores only {', '.join(suite.tasks)}"
            raise UsageError(
                f"policy {policy.name}: rule {i + 1} ({policy.label(i)}) names task {rule.task!r}, which its suite "
                f"{suite.path} does not score: {where}. Name one of those tasks, or point the policy's `suite:` "
                "at a suite whose golden set has it"
            )
        kind = golden.entry(rule.task).output_type
        if rule.metric in RULE_OUTPUT_TYPES and kind not in RULE_OUTPUT_TYPES[rule.metric]:
            raise UsageError(
                f"policy {policy.name}: rule {i + 1} ({policy.label(i)}) asks for {rule.metric} on {rule.task}, a "
                f"{kind} task; {rule.metric} applies to {' or '.join(RULE_OUTPUT_TYPES[rule.metric])} tasks"
            )
        if rule.metric not in RULE_OUTPUT_TYPES and rule.metric not in (defined := golden.item_metrics(rule.task)):
            own = [m for m, kinds in RULE_OUTPUT_TYPES.items() if kind in kinds]
            theirs = ", ".join([*own, *defined])
            raise UsageError(
                f"policy {policy.name}: rule {i + 1} ({policy.label(i)}) asks for {rule.metric} on {rule.task}, which "
                f"that task does not compute per item; it gives {theirs} (its YAML's metric_list under each "
                "filter pipeline, as metric@filter)"
            )


def comparable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The suite settings two score documents must share (all but the batch size)."""
    return {k: v for k, v in settings.items() if k not in SUITE_SETTINGS_IGNORED}


def check_provenance(
    base: ScoreDoc, cand: ScoreDoc, across_engines: bool = False, allow_different_tokenizer: bool = False
) -> int | None:
    """Two score documents may be compared: every MUST_MATCH field and suite setting alike (ENGINE_FIELDS
    excepted `across_engines`: the caller checked both sides' tokens of every item). Where the caller did not, the
    items' recorded token hashes are compared (`token_differences`): one item scored on other tokens is exit 2
    naming the items, unless the policy allows different tokenizers (`allow_different_tokenizer`, never for a side
    scored in llama.cpp), and a side that records hashes for only some of them is exit 2 naming the others
    (`check_hashed`, whatever the policy allows); where every item both sides scored has one hash on both, a side
    scored in llama.cpp may differ in ENGINE_FIELDS as after the caller's check. A side read from lm-eval's samples
    (`provenance.samples`: another engine's numbers, quantize/evaluate/samples.py) may differ in ENGINE_FIELDS too,
    but only after `same_prompts` found every item both sides scored on one prompt: that check runs here first, and
    only its pass relaxes the fields. A side scored in llama.cpp (dtype `gguf`) is compared only where its tokens
    were (by the caller or by their hashes), or with itself. Returns the items whose prompts it checked (None: it
    did not)."""
    pb, pc = base.provenance, cand.provenance
    checked = None
    one = pb.checkpoint.identity_sha256 == pc.checkpoint.identity_sha256
    llamacpp = LLAMACPP_DTYPE in (pb.dtype, pc.dtype)
    if not across_engines and (diff := token_differences(base, cand)) is not None:
        if diff and (llamacpp or not allow_different_tokenizer):
            named = named_items(diff)
            allow = "" if llamacpp else ", or set `allow_different_tokenizer: true` in the policy"
            raise UsageError(
                f"the baseline {pb.checkpoint.path} and the candidate {pc.checkpoint.path} were scored on other tokens "
                f"for {sum(map(len, diff.values()))} item(s) ({named}; their score records' token hashes differ: "
                "another tokenizer, prefix token or context window), so a paired comparison would measure their "
                "tokenizers, not their weights. Gate a candidate that keeps its baseline's tokenizer, scored with the "
                f"same suite{allow}"
            )
        across_engines = llamacpp and not diff and not one  # one GGUF's two scorings: ENGINE_FIELDS alike
    if not across_engines and llamacpp and not one:
        raise UsageError(
            "a side scored in llama.cpp is paired with a score file or lm-eval samples, and a side records no token "
            "hashes (a file written before they were recorded, or computed by another engine), so their items' "
            "tokens cannot be compared (a GGUF tokenizes with its own vocabulary: one that adds a BOS token scores "
            "other sequences on the same prompts). Score such a file again with `quantize eval SUITE CHECKPOINT "
            "--json --items`, or pass both checkpoints (the GGUF and the folder or GGUF it is gated against): the "
            "gate compares every item's tokens first"
        )
    if not across_engines and (pb.samples is not None or pc.samples is not None):
        checked = same_prompts(base, cand)  # raises on one item scored on another prompt, or with none recorded
        across_engines = True
    skip = ENGINE_FIELDS if across_engines else set()
    diffs = [(f, get(pb), get(pc)) for f, get in MUST_MATCH.items() if f not in skip and get(pb) != get(pc)]
    sb, sc = comparable_settings(pb.suite.settings), comparable_settings(pc.suite.settings)
    diffs += [
        (f"suite.settings.{k}", sb.get(k), sc.get(k)) for k in sorted(set(sb) | set(sc)) if sb.get(k) != sc.get(k)
    ]
    if diffs:
        shown = "; ".join(f"{f}: baseline {b!r} vs candidate {c!r}" for f, b, c in diffs)
        raise UsageError(
            f"refusing to compare scores with different provenance ({shown}). "
            "Score both with the same suite, golden set and lm-eval version."
        )
    return checked


def token_differences(base: ScoreDoc, cand: ScoreDoc) -> dict[str, list[str]] | None:
    """Per task both sides scored, the items both scored whose recorded token hashes (`tokens_sha256`: the token
    ids the engine scored, quantize/evaluate/engine.ScoredTokens) differ, in id order; None where a side records
    no hash at all (a file written before hashes were recorded, lm-eval's samples, a backend that records none):
    then nothing is compared. A side that records hashes but not for every item both sides scored is refused
    (`check_hashed`): our engines record one for every item or for none."""
    check_hashed(base, cand)
    if not records_hashes(base) or not records_hashes(cand):
        return None
    out = {}
    for task in sorted(set(base.tasks) & set(cand.tasks)):
        b = {i.id: i.tokens_sha256 for i in base.tasks[task].items}
        c = {i.id: i.tokens_sha256 for i in cand.tasks[task].items}
        if other := [i for i in sorted(set(b) & set(c)) if b[i] != c[i]]:
            out[task] = other
    return out


def records_hashes(doc: ScoreDoc) -> bool:
    """Whether any item of a score document records the hash of its tokens."""
    return any(i.tokens_sha256 is not None for t in doc.tasks.values() for i in t.items)


def check_hashed(base: ScoreDoc, cand: ScoreDoc) -> None:
    """A side that records token hashes records one for every item both sides scored. quantize eval records one
    for every item it scores (a document without one is a bug of ours: evaluate/score.py) or, where nothing is
    recorded, for none; a side with some is a file edited or put together from others, and its items without a
    hash are exactly the ones that would escape the comparison (before 2026-12-07 one such item turned it off for
    every item). A UsageError names the side and the items."""
    shared = sorted(set(base.tasks) & set(cand.tasks))
    for name, doc, other in (("baseline", base, cand), ("candidate", cand, base)):
        if not records_hashes(doc):
            continue
        missing = {}
        for task in shared:
            theirs = {i.id for i in other.tasks[task].items}
            if ids := sorted(i.id for i in doc.tasks[task].items if i.id in theirs and i.tokens_sha256 is None):
                missing[task] = ids
        if missing:
            named = named_items(missing)
            raise UsageError(
                f"the {name}'s scores (of {doc.provenance.checkpoint.path}) record the hash of the tokens scored "
                f"(`tokens_sha256`) for some items but not for {sum(map(len, missing.values()))} item(s) the other "
                f"side scored too ({named}). quantize eval records one for every item, or none (a file written "
                "before they were recorded, lm-eval's samples, a backend that records none), so these scores were "
                "edited or put together from others, and whether those items were scored on the same tokens cannot "
                "be checked. Score that side again with `quantize eval SUITE CHECKPOINT --json --items`"
            )


def named_items(ids: dict[str, list[str]]) -> str:
    """Items per task as an error names them: the first five ids of each."""
    return "; ".join(f"{t}: {', '.join(i[:5])}{' ...' if len(i) > 5 else ''}" for t, i in ids.items())


def tokens_note(base: ScoreDoc, cand: ScoreDoc) -> str:
    """What the verdict says of the tokens where a side is a score file (no checkpoint whose tokenizer the gate
    could read): compared by their hashes, or not, and why."""
    diff = token_differences(base, cand)
    shared = set(base.tasks) & set(cand.tasks)
    if diff is None:
        lacking = [name for name, doc in (("baseline", base), ("candidate", cand)) if not records_hashes(doc)]
        return (
            f"the {' and the '.join(lacking)} {'sides record' if len(lacking) > 1 else 'side records'} no token "
            "hashes (a score file written before they were recorded, lm-eval's samples, or a backend that records "
            "none): whether both sides scored the same tokens was not checked; score such a file again with "
            "`quantize eval SUITE CHECKPOINT --json --items`"
        )
    n = sum(len({i.id for i in base.tasks[t].items} & {i.id for i in cand.tasks[t].items}) for t in shared)
    if diff:
        return (
            f"baseline and candidate were scored on other tokens for {sum(map(len, diff.values()))} of {n} items "
            "(their token hashes differ; allowed by the policy's `allow_different_tokenizer`)"
        )
    return f"both sides scored the same tokens on all {n} items they share (their score records' token hashes)"


def other_tokens_note(base: ScoreDoc, cand: ScoreDoc) -> list[str]:
    """Where two checkpoints' items were scored on other tokens (a tokenizer that splits text otherwise over one
    vocabulary, which the policy's `allow_different_tokenizer` let check_provenance pass): the note saying in how
    many items; else nothing. A verdict on such a pair says so, whoever decided it (the gate, the report)."""
    return [tokens_note(base, cand)] if token_differences(base, cand) else []


def same_prompts(base: ScoreDoc, cand: ScoreDoc) -> int:
    """Every item both sides scored (in every task both scored) records lm-eval's prompt hash on both sides, and
    the two are equal: what lets a side computed by another engine (lm-eval's samples) be paired with this one.
    Returns the number of items checked; a UsageError names the task and the items otherwise."""
    checked = 0
    for task in sorted(set(base.tasks) & set(cand.tasks)):
        b = {i.id: i.prompt_sha256 for i in base.tasks[task].items}
        c = {i.id: i.prompt_sha256 for i in cand.tasks[task].items}
        both = sorted(set(b) & set(c))
        unknown = [i for i in both if b[i] is None or c[i] is None]
        other = [i for i in both if i not in unknown and b[i] != c[i]]
        if unknown or other:
            said = "; ".join(
                f"{what} for {len(ids)} item(s), e.g. {', '.join(ids[:3])}"
                for what, ids in (("no prompt hash recorded", unknown), ("different prompts", other))
                if ids
            )
            raise UsageError(
                f"{task}: a side read from lm-eval's samples is compared item by item only where both sides scored "
                f"each item on one prompt (lm-eval's prompt hash), and here they did not ({said}). Run lm-eval on "
                "the tasks `quantize golden export` writes for the policy's suite, and score the other side with "
                "`quantize eval` of that suite"
            )
        checked += len(both)
    return checked


@dataclass(frozen=True)
class Look:
    """One look of a sequential gate (quantize/gates/sequential.py): the candidate holds a stratified sample of
    each task's items, tested against this look's critical value."""

    index: int  # 1-based
    bound: float  # critical value c_k, used in place of z₁₋α
    strata: dict[str, dict[str, str]]  # task -> item id -> stratum
    population: dict[str, dict[str, int]]  # task -> stratum -> items in the golden set

    @property
    def level(self) -> float:
        """The nominal one-sided level of the bound, 1 − Φ(c_k) (the bootstrap's quantile)."""
        return stats.phi_upper(self.bound)


def _paired(base: ScoreDoc, cand: ScoreDoc, task: str, sample: bool = False) -> tuple[list[Any], list[Any]]:
    """Baseline and candidate items, paired by id. `sample`: the candidate holds a sample of the baseline's.
    A baseline whose items on the task are not finite is refused: nothing can be judged against it."""
    if task not in base.tasks or task not in cand.tasks:
        raise UsageError(f"rule task {task} was not scored; the suite scores: {', '.join(base.tasks)}")
    if bad := non_finite_items(base.tasks[task]):
        raise UsageError(
            f"the baseline {base.provenance.checkpoint.path} computes NaN or infinite values on {task} ({len(bad)} "
            f"item(s), e.g. {', '.join(bad[:3])}): a gate needs a baseline whose log-likelihoods are finite. Check "
            "the baseline checkpoint (`quantize eval` names the tasks), or gate against another one"
        )
    b = {i.id: i for i in base.tasks[task].items}
    c = {i.id: i for i in cand.tasks[task].items}
    if (set(c) - set(b)) if sample else (set(b) != set(c)):
        raise UsageError(
            f"{task}: baseline and candidate were scored on different items; score both with the same suite"
        )
    ids = sorted(c)
    if half := [i for i in ids if (b[i].prompt_sha256 is None) != (c[i].prompt_sha256 is None)]:
        raise UsageError(
            f"{task}: {len(half)} item(s) carry lm-eval's prompt hash on one side only (e.g. {', '.join(half[:3])}): "
            "the prompts cannot be compared. Score both sides with `quantize eval SUITE CHECKPOINT --json --items` "
            "(or lm-eval with --log_samples)"
        )
    other = [
        i
        for i in ids
        if None not in (b[i].prompt_sha256, c[i].prompt_sha256) and b[i].prompt_sha256 != c[i].prompt_sha256
    ]
    if other:
        raise UsageError(
            f"{task}: baseline and candidate were scored on different prompts for {len(other)} item(s) (e.g. "
            f"{', '.join(other[:3])}): a paired comparison needs one prompt per item. Score both with the same "
            "golden set and suite (a set frozen before few-shot prompts were pinned draws them per run: freeze "
            "it again)"
        )
    return [b[i] for i in ids], [c[i] for i in ids]


def item_value(item: Any, metric: str, task: str) -> float:
    """An item's value of a rule's metric: its score for a metric its kind's score is (quantize/kinds.py
    `scored_as`), else the per-item metric lm-eval computed."""
    if (kind := kind_of_item(item)) is not None and metric in kind.scored_as:
        return item.score
    if metric not in item.metrics:
        raise UsageError(
            f"{task}: item {item.id} has no per-item {metric} (it has {', '.join(item.metrics) or 'none'}): its scores "
            "were computed before per-item metrics were kept; score it again with `quantize eval SUITE CKPT --refresh`"
        )
    return item.metrics[metric]


def units(item: Any, metric: str) -> int:
    """What a perplexity is per (PerplexityRule): bytes for byte_perplexity, else the item's own unit."""
    return item.bytes if metric == "byte_perplexity" else item.units


def non_finite_is_regression(result: R, candidate_items: list[str] | None = None) -> R:
    """Non-finite evidence is a regression, never inconclusive (docs/design.md, "The gate"): a candidate whose
    items on the rule's task hold NaN or infinity (`candidate_items`), or whose evidence is not finite, has no
    p-value and fails the rule, whatever `fail_on_inconclusive` says."""
    fields = non_finite_fields(result.evidence.model_dump())
    if not candidate_items and not fields:
        return result
    why = (
        f"the candidate computes NaN or infinity on {len(candidate_items)} item(s) "
        f"(e.g. {', '.join(candidate_items[:3])})"
        if candidate_items
        else f"the evidence is not finite ({', '.join(fields[:3])})"
    )
    return result.model_copy(update={"verdict": "regression", "p_regression": None, "non_finite": why})


def check_baseline_finite(path: str, bad: list[str] | None) -> None:
    """A gate's baseline whose weights store NaN or infinity (its tensors: checkpoint/finite.non_finite_tensors) is
    refused, naming them: the flow checks it before anything is scored, verdict_of again on the scores it reads."""
    if bad:
        raise UsageError(
            f"the baseline {path} stores NaN or infinite values in {len(bad)} tensor(s) ({first_named(bad)}): a "
            "gate needs a baseline whose weights are finite. Check the baseline checkpoint (`quantize eval` names "
            "the tensors), or gate against another one"
        )


def stored_non_finite(result: RuleResult, tensors: list[str] | None) -> RuleResult:
    """A rule on a candidate whose weights store NaN or infinity (its `tensors`: checkpoint/finite.non_finite_tensors)
    is a regression with no p-value, whatever its evidence: finite scores can come from such weights (an embedding
    row of a token no item holds is never read; llama.cpp rounds an activation to 8 bits before a Q8_0 matrix, where
    a NaN element becomes a finite one), so the scores alone would pass them. Non-finite evidence, as
    non_finite_is_regression's. A rule a sequential gate never tested (UntestedResult: it stopped at an agreement
    regression, which this makes a regression too) stays untested: it has no evidence to mark."""
    if not tensors or isinstance(result, UntestedResult):
        return result
    why = f"the candidate stores NaN or infinity in {len(tensors)} tensor(s) ({first_named(tensors)})"
    if result.non_finite:
        why = f"{result.non_finite}; {why}"
    return result.model_copy(update={"verdict": "regression", "p_regression": None, "non_finite": why})


def accuracy_rule(
    rule: AccuracyRule,
    label: str,
    base: ScoreDoc,
    cand: ScoreDoc,
    alpha: float,
    power: float,
    look: Look | None = None,
) -> AccuracyResult:
    bi, ci = _paired(base, cand, rule.task, sample=look is not None)
    vb = [item_value(b, rule.metric, rule.task) for b in bi]
    vc = [item_value(c, rule.metric, rule.task) for c in ci]
    d = [c - b for b, c in zip(vb, vc, strict=True)]
    clusters = [b.cluster for b in bi]
    # a sequential look's sample is stratified: every mean is design-weighted
    strata = [look.strata[rule.task][b.id] for b in bi] if look else None
    population = look.population[rule.task] if look else None
    r = stats.noninferiority(
        d, clusters, rule.margin, alpha, power, strata, population, bound=look.bound if look else None
    )

    def mean(x: list[float]) -> float:
        if strata is None or population is None:
            return sum(x) / len(x)
        return stats.stratified(x, [b.id for b in bi], strata, population)[0]

    right_wrong = [b.id for b, x, y in zip(bi, vb, vc, strict=True) if x > y]
    wrong_right = [b.id for b, x, y in zip(bi, vb, vc, strict=True) if x < y]
    ev = AccuracyEvidence(
        n=r.n,
        clusters=r.clusters,
        baseline=mean(vb),
        candidate=mean(vc),
        delta=r.delta,
        se_paired=r.se_paired,
        se_clustered=r.se_clustered,
        se=r.se,
        lower_bound=r.lower,
        upper_bound=r.upper,
        margin=rule.margin,
        alpha=alpha,
        flips_right_to_wrong=len(right_wrong),
        flips_wrong_to_right=len(wrong_right),
        mcnemar_p=stats.mcnemar_exact(len(right_wrong), len(wrong_right)),
        examples_right_to_wrong=right_wrong[:5],
        min_detectable_drop=r.min_detectable,
        items_needed=r.n_needed if r.verdict == "inconclusive" else None,
        items_needed_at_estimate=r.n_needed_at_estimate if r.verdict == "inconclusive" else None,
    )
    result = AccuracyResult(
        rule=label,
        task=rule.task,
        metric=rule.metric,
        verdict=r.verdict,
        evidence=ev,
        p_regression=stats.drop_p(r.delta, r.se),
        look=look.index if look else None,
    )
    return non_finite_is_regression(result, non_finite_items(cand.tasks[rule.task]))


def perplexity_rule(
    rule: PerplexityRule, label: str, base: ScoreDoc, cand: ScoreDoc, alpha: float, seed: int, look: Look | None = None
) -> PerplexityResult:
    """A sequential look's items are a stratified sample of the task's (documents: one stratum; context/target
    items: by the baseline's margin, the items at risk all drawn): each item weighs N_h / n_h of its stratum in
    every sum (stats.design_weights), so the ratio is the whole set's; the bootstrap's quantiles are taken at the look's
    nominal level."""
    bi, ci = _paired(base, cand, rule.task, sample=look is not None)
    # per item: negative log-likelihood and its unit count (words or bytes of a document; 1 target otherwise)
    w = [units(b, rule.metric) for b in bi]
    if other := [b.id for b, c, n in zip(bi, ci, w, strict=True) if units(c, rule.metric) != n]:
        what = "bytes" if rule.metric == "byte_perplexity" else "words"
        raise UsageError(
            f"{rule.task}: {len(other)} document(s) count other {what} on the two sides (e.g. {', '.join(other[:3])}):"
            " one document has one length, so the two sides did not score the same text. Score both with the same "
            "suite and golden set"
        )
    nll_b = [-b.ll for b in bi]
    nll_c = [-c.ll for c in ci]
    clusters = [b.cluster for b in bi]
    level = alpha if look is None else look.level
    dw = stats.design_weights([look.strata[rule.task][b.id] for b in bi], look.population[rule.task]) if look else None
    ppl_ratio, ppl_lo, ppl_hi = stats.bootstrap_ppl_ratio(nll_b, nll_c, w, clusters, level, seed=seed, weights=dw)
    dw = dw or [1.0] * len(w)
    total_w = sum(x * y for x, y in zip(w, dw, strict=True))
    nll_b = [x * y for x, y in zip(nll_b, dw, strict=True)]
    nll_c = [x * y for x, y in zip(nll_c, dw, strict=True)]
    verdict = limit_outcome(ppl_lo, ppl_hi, at_most=rule.max_ratio)
    ev = PerplexityEvidence(
        n=len(bi),
        clusters=len(set(clusters)),
        baseline_perplexity=_exp(sum(nll_b) / total_w),
        candidate_perplexity=_exp(sum(nll_c) / total_w),
        ratio=ppl_ratio,
        lower_bound=ppl_lo,
        upper_bound=ppl_hi,
        max_ratio=rule.max_ratio,
        alpha=alpha,
        interval="cluster bootstrap percentile, 2000 resamples",
    )
    result = PerplexityResult(
        rule=label, task=rule.task, metric=rule.metric, verdict=verdict, evidence=ev, look=look.index if look else None
    )
    return non_finite_is_regression(result, non_finite_items(cand.tasks[rule.task]))


def _exp(x: float) -> float:
    """e^x, infinite past a float's range: a candidate's mean NLL above 709.8 nats (its logits exploded) is a
    perplexity no float holds, non-finite evidence (a regression), not an OverflowError (exit 3)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def agreement_rule(
    rule: AgreementRule, label: str, agreement: AgreementResult, alpha: float, look: Look | None = None
) -> AgreementRuleResult:
    """An agreement rule on a measured agreement: bounds value ± q·SE with q = z₁₋α (measured once, on every
    agreement item), or a sequential look's critical value c_k (`look`: the agreement measured on that look's
    share of the items); a pass when the bound on the far side is within the limit, a regression when the near
    one is beyond it. Top-1 agreement is a 0/1 outcome a position: its bounds are at least Wilson's over the
    positions at the same q (stats.wilson_bounds), so positions that all agree still leave a bound below 1; a
    share's bounds stay inside [0, 1]. Any metric of the agreement not finite (NaN logits somewhere: top-1
    counts such a row as a disagreement and stays finite) makes every agreement rule a regression."""
    value, se = agreement.estimate(rule.agreement)
    q = look.bound if look is not None else stats.z(1 - alpha)
    lo, hi = value - q * se, value + q * se
    wilson = None
    if rule.agreement is AgreementMetric.top1 and math.isfinite(value):
        wilson = stats.wilson_bounds(value, agreement.positions, q)
        lo, hi = min(lo, wilson[0]), max(hi, wilson[1])
    if rule.agreement is not AgreementMetric.kl and math.isfinite(lo) and math.isfinite(hi):
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    verdict = limit_outcome(lo, hi, at_most=rule.max, at_least=rule.min)
    if rule.agreement is AgreementMetric.kl:
        # p-value of H0 "within the limit" (value <= max) against H1 "beyond it"
        p_reg = stats.phi((rule.max - value) / se) if se > 0 else float(value <= rule.max)
    else:
        p_reg = stats.phi((value - rule.min) / se) if se > 0 else float(value >= rule.min)
    ev = AgreementEvidence(
        value=value,
        se_clustered=se,
        wilson_bounds=wilson,
        lower_bound=lo,
        upper_bound=hi,
        max=rule.max,
        min=rule.min,
        alpha=alpha,
        positions=agreement.positions,
        items=agreement.items,
        clusters=agreement.clusters,
        kl_p99=agreement.kl_p99 if rule.agreement is AgreementMetric.kl else None,
        note=agreement.note,
    )
    result = AgreementRuleResult(
        rule=label,
        metric=rule.agreement,
        verdict=verdict,
        evidence=ev,
        p_regression=p_reg,
        look=look.index if look is not None else None,
    )
    measured = {"KL": agreement.kl_mean, "top-1": agreement.top1, "sum min(p, q)": agreement.sum_min}
    if bad := [f"{k} {v}" for k, v in measured.items() if not math.isfinite(v)]:
        why = f"the candidate's token distributions are not finite somewhere ({', '.join(bad)})"
        return result.model_copy(update={"verdict": "regression", "p_regression": None, "non_finite": why})
    return non_finite_is_regression(result)


def rule_result(
    policy: Policy, i: int, base: ScoreDoc, cand: ScoreDoc, agreement: AgreementResult | None, look: Look | None = None
) -> RuleResult:
    """Rule i of the policy on these scores (a sequential look: on the candidate's sample, at its bound)."""
    rule, label = policy.rules[i], policy.label(i)
    if isinstance(rule, AccuracyRule):
        return accuracy_rule(rule, label, base, cand, policy.alpha, policy.power, look)
    if isinstance(rule, PerplexityRule):
        return perplexity_rule(rule, label, base, cand, policy.alpha, base.provenance.seed, look)
    assert agreement is not None, "agreement rules need the agreement scores"
    return agreement_rule(rule, label, agreement, policy.alpha)


def decide(
    policy: Policy, base: ScoreDoc, cand: ScoreDoc, agreement: AgreementResult | None, across_engines: bool = False
) -> Verdict:
    """The verdict of the policy's rules on two score documents (`across_engines`: check_provenance's)."""
    checked = check_provenance(base, cand, across_engines, policy.allow_different_tokenizer)
    results = [rule_result(policy, i, base, cand, agreement) for i in range(len(policy.rules))]
    v = verdict_of(policy, base, side(cand), results)
    if checked is not None:
        v.notes.append(prompts_note(base, cand, checked))
    v.notes += unjudged_non_finite(policy, cand)
    return v


def unjudged_non_finite(policy: Policy, cand: ScoreDoc) -> list[str]:
    """A note for each task the candidate computes NaN or infinity on that no rule of the policy judges: scored,
    not evidence for any rule, and not to be passed over in silence (a review)."""
    judged = {r.task for r in policy.rules if not isinstance(r, AgreementRule)}
    return [
        f"the candidate computes NaN or infinity on {len(ids)} item(s) of {task} (e.g. {', '.join(ids[:3])}), a task "
        "no rule of this policy judges"
        for task, ids in sorted(cand.non_finite().items())
        if task not in judged
    ]


def prompts_note(base: ScoreDoc, cand: ScoreDoc, checked: int) -> str:
    """What the verdict says of a side read from lm-eval's samples: the engines differ, and why that may be."""
    sides = ", ".join(
        f"the {name} is {p.engine or p.backend}"
        for name, p in (("baseline", base.provenance), ("candidate", cand.provenance))
        if p.samples is not None
    )
    return (
        f"{sides}: its backend, dtype and device kind may differ from the other side's because all {checked} items "
        "both sides scored were checked first to have one prompt on both (lm-eval's prompt hash)"
    )


def side(doc: ScoreDoc) -> SideRef:
    """The verdict's reference to one side: its checkpoint identity, the batch size it was scored at, and the
    machine where its numbers move with it (an activation-rounding model on a CPU)."""
    p = doc.provenance
    return SideRef(checkpoint=p.checkpoint, batch_size=p.batch_size, cpu=p.cpu, threads=p.threads)


def verdict_of(
    policy: Policy,
    base: ScoreDoc,
    candidate: SideRef,
    results: list[RuleResult],
    sequential: SequentialRecord | None = None,
) -> Verdict:
    """The gate's verdict from its rules' results: any regression rejects; any inconclusive fails closed when
    the policy says so; Holm-adjusted p-values of regression beside each. `candidate`: the candidate side (a
    sequential gate stopped by an agreement regression has scored none of its items). A candidate storing NaN or
    infinity in a tensor (a GGUF's or safetensors files') fails every rule (`stored_non_finite`); a baseline doing
    so is refused."""
    check_baseline_finite(base.provenance.checkpoint.path, base.provenance.checkpoint.non_finite_tensors)
    results = [stored_non_finite(r, candidate.checkpoint.non_finite_tensors) for r in results]
    with_p = [r for r in results if r.p_regression is not None]
    for r, adj in zip(with_p, stats.holm([r.p_regression for r in with_p]), strict=True):
        r.p_holm = adj
    verdict: GateOutcome
    if any(r.verdict == "regression" for r in results):
        verdict, code = "rejected", 1
    elif any(r.verdict == "inconclusive" for r in results):
        verdict, code = "inconclusive", 1 if policy.fail_on_inconclusive else 0
    else:
        verdict, code = "pass", 0
    pb = base.provenance
    provenance = VerdictProvenance(
        baseline=side(base),
        candidate=candidate,
        golden=pb.golden,
        task_versions=pb.task_versions,
        lm_eval_version=pb.lm_eval_version,
        seed=pb.seed,
        suite=policy.suite,  # the policy's file, not the one whose equal settings first cached the baseline's scores
        suite_settings=comparable_settings(pb.suite.settings),
        policy_settings=policy.settings(),
    )
    return Verdict(
        policy=policy.name or "policy",
        verdict=verdict,
        exit_code=code,
        rules=results,
        provenance=provenance,
        sequential=sequential,
    )
