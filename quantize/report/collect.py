"""Gather what the other commands wrote about each checkpoint: bits (quantize.json or the header
accounting), cached scores, cached agreement with the baseline, the gate verdict, decode-cost bounds.
Nothing here scores a model: a checkpoint without cached scores appears as "not scored", or, where a gate
judged it in stages, with the gate's evidence (each rule's Δ, bounds and items).

The verdict is the one the gate gave and saved beside the candidate (gate.json, `quantize gate --json`), when it
names this policy (its rules, tasks, metrics and limits as the file says them now, every other setting that can change
a verdict as the gate recorded the policy, and a pinned baseline score file), the checkpoint's identity and the
baseline's as they are now, this golden set and this suite's settings, and is a gate's own decision on the two
checkpoints: one a gate run with this cache kept there, byte for byte (evaluate/cache.py holds_verdict; a file in the
candidate's folder is otherwise only what whoever wrote the folder claims), and never one whose gate read a side from
a score file named on its command line (evaluate/cache.py file_side). A gate.json that does not
is kept with the reason (`Entry.verdict_stale`: stale when the checkpoint changed since), never shown as the
verdict. Only where none is saved does the report decide from cached full scores (the fixed design),
labelled as recomputed, and only where the gate would have decided from them: not against a baseline score file
other than the policy's pin, not where the two sides' vocabularies differ or cannot be read without loading (the
gate loads both tokenizers; the report reads tokenizer.json with the tokenizers library), not where a side is a GGUF
(the gate compares both sides' tokens of every item first), not where the gate would refuse the two score records
(items scored on other tokens, other provenance: gates/gate.check_provenance); there `Entry.verdict_withheld` says
why, and the rest of the report is written. A
quantize.json whose recorded weights are not the folder's is not read (`Entry.record_stale`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantize import records
from quantize.cache import shared_path
from quantize.checkpoint import ggufs
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import (
    identity_sha256,
    read_config,
    tokenizer_files,
    vocabulary_sha256,
    weights_sha256,
)
from quantize.checkpoint.rounding import stored_rounds_activations
from quantize.cost import bounds as cost
from quantize.errors import UsageError
from quantize.evaluate import cache
from quantize.evaluate.suite import open_suite
from quantize.gates.gate import agreement_rule, check_rules, comparable_settings, decide, other_tokens_note
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
    # why no verdict is decided here from cached full scores that exist (the gate would not decide from them alone)
    verdict_withheld: str | None = None
    recipe: dict[str, Any] | None = None  # the resolved recipe its quantize.json records (None: not ours)
    # why its quantize.json is not read: it records other weights than the folder holds (copied over, or stale)
    record_stale: str | None = None
    # its config.json rounds activations (checkpoint/rounding.py): its scores are read under this CPU (entry_runtime)
    rounds_activations: bool = False


def _entry(path: Path) -> Entry:
    meta_path = path / "quantize.json"
    r = bits_report(path)
    recipe, record_stale = None, None
    meta = records.read(RunRecord, meta_path) if meta_path.is_file() else None
    if meta is not None and (held := weights_sha256(path)) != meta.weights_sha256:
        record_stale = (
            f"its quantize.json records weights {meta.weights_sha256[:12]}, the folder holds {held[:12]}: not the "
            "output it describes, so its recipe is not shown"
        )
        meta = None
    if meta is not None:
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
        record_stale=record_stale,
        rounds_activations=ggufs.find(path) is None and stored_rounds_activations(path),  # a GGUF: llama.cpp's
    )


def unique_labels(entries: list[Entry]) -> list[Entry]:
    """Every entry's label made one no other entry has: a label two folders share (a copy of a checkpoint, its
    recipe name from quantize.json; two folders of one name) gets its folder's name (where that is not the label
    itself), then, where that still
    collides, its path as given. Two rows, plot points and evidence lines of one name read as one checkpoint twice
    (a review). Returns `entries`, relabelled in place."""
    given = [e.label for e in entries]
    named = lambda e, was: was if Path(e.path).name == was else f"{was} ({Path(e.path).name})"  # noqa: E731
    for widen in (named, lambda e, was: f"{was} ({e.path})"):
        counts = Counter(e.label for e in entries)
        for e, was in zip(entries, given, strict=True):
            if counts[e.label] > 1:
                e.label = widen(e, was)
    return entries


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


def decode_bounds(  # the report's settings, and the config completion the API passes in
    entry: Entry,
    baseline: Entry | None,
    hardware: cost.Hardware,
    batch: int,
    context: int,
    gamma: int = 4,
    complete: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> DecodeBounds:
    """Decode-cost lower bounds from the entry's bytes, as `quantize cost --checkpoint` prices them: config.json read
    as `complete` returns it (the API passes checkpoint/loader.completed_config, the fields its transformers config
    class derives or defaults: the report itself imports no transformers; without it, as written), and a GGUF from
    its header alone (one whose cache is priced through the config transformers reads from it is not); empty, with
    the reason, when its KV layout is not known."""
    try:
        if ggufs.find(entry.path) is not None:
            report, kv, routed = cost.measured_checkpoint(Path(entry.path))
            nbytes, params, left = cost.checkpoint_decode_figures(Path(entry.path), report)  # less its MTP blocks
            weights = cost.Weights(nbytes, routed, tuple(report.gathered.values()))
            active = cost.active_parameter_count(params, routed) if routed and params else params
            routed_or_left = bool(routed) or left is not None
        else:
            cfg = read_config(Path(entry.path))
            cfg = complete(cfg) if complete is not None else cfg
            kv = cost.kv_layout_from_config(cfg)
            # an MoE reads k/E of its experts; MTP layers are not read at all (cost.not_read)
            weights, active, left = cost.checkpoint_weights(Path(entry.path), cfg)
            routed_or_left = weights.routed or left is not None
    except UsageError as e:
        return DecodeBounds(not_computable=str(e))
    m = cost.CostModel((active if routed_or_left else None) or entry.parameters or 1, kv, hardware, context)
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
    """Why a saved verdict is not this policy's on this pair, golden set and suite, or not a gate's own decision, or
    None when it is both. Identities are the ones computed now from the files: a candidate changed since it was
    gated makes the verdict stale. The policy: its rules (`rules_changed`), then every setting as the gate recorded
    it (`policy_changed`). The suite: its settings as the gate compared them (gate.comparable_settings,
    recorded in the verdict since it holds `suite_settings`; an older verdict is held to its suite's path), and a
    baseline score file the policy pins. Task versions are the golden set's (its manifest hash covers the task
    files). A gate's own: its gate read both sides from the checkpoints or the score cache, not from a file named on
    its command line (evaluate/cache.py file_side), and the cache holds it as a gate run with it decided it
    (holds_verdict), so a gate.json forged beside a candidate (another candidate's pass with the identity changed) is
    not evidence, nor is a gate's verdict over a relabelled score file."""
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
    if changed := rules_changed(v, policy) or policy_changed(v, policy):
        return f"policy {policy.name} changed since it was gated: {changed}"
    if p.golden.manifest_sha256 != suite.golden.manifest_sha256:
        return (
            f"another golden set's: {VERDICT_FILE} was on {p.golden.name}/{p.golden.version} "
            f"({p.golden.manifest_sha256[:12]}), the policy's suite is on {suite.golden.manifest_sha256[:12]}"
        )
    now = comparable_settings(suite.suite.settings())
    if p.suite_settings is None and p.suite != suite.path:
        return f"another suite's: {VERDICT_FILE} was on suite {p.suite}, the policy's suite is {suite.path}"
    if p.suite_settings is not None and p.suite_settings != now:
        diff = sorted(k for k in set(now) | set(p.suite_settings) if now.get(k) != p.suite_settings.get(k))
        return f"another suite's: {VERDICT_FILE} was on suite settings that differ in {', '.join(diff)}"
    pin = policy.baseline_scores_sha256
    if pin is not None and p.score_files.get("baseline") != pin:
        return (
            f"other baseline scores: {VERDICT_FILE} read the baseline's scores from "
            f"{(p.score_files.get('baseline') or 'no file')[:12]}, the policy pins {pin[:12]}"
        )
    if (why := cache.file_side(v)) is not None:
        return (
            f"not a gate's own decision on the checkpoints: {why}; run "
            "`quantize gate` on the two checkpoints (with --json > CANDIDATE/gate.json, the report shows its verdict)"
        )
    if not cache.holds_verdict(v):
        return (
            f"not a gate's own decision: no gate run with this cache ({shared_path()}) decided this {VERDICT_FILE} "
            "as it reads (one written or edited by hand, copied from another machine, or written before gates kept "
            "their verdicts in the cache, 2026-12-07)"
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
    """How the policy's rules differ from the ones the saved verdict judged (labels, then each rule's task and metric,
    then its limit and α as its evidence recorded them), or None when they are the same: a rule's `name:` is its
    label, so a rule renamed to judge another task kept its label."""
    labels = [policy.label(i) for i in range(len(policy.rules))]
    if [r.rule for r in v.rules] != labels:
        return f"{VERDICT_FILE} judged {[r.rule for r in v.rules]}, the policy's rules are {labels}"
    for r, rule in zip(v.rules, policy.rules, strict=True):
        asked = (getattr(rule, "task", None), getattr(rule, "metric", None) or getattr(rule, "agreement", None))
        judged = (getattr(r, "task", None), getattr(r, "metric", None) or asked[1])  # None: recorded before metrics
        if judged != asked:
            return f"rule {r.rule} judged (task, metric) {judged}, the policy's rule now names {asked}"
        if isinstance(r, UntestedResult):
            continue
        then, now = (_limit(r.evidence), r.evidence.alpha), (_limit(rule), policy.alpha)
        if then != now:
            return f"rule {r.rule} was judged at (limit, α) {then}, the policy now says {now}"
    return None


def policy_changed(v: Verdict, policy: Policy) -> str | None:
    """How the policy as it decides now (Policy.settings, e.g. `allow_different_tokenizer:`, `sequential:`,
    `power:`, `fail_on_inconclusive:`) differs from the one the saved verdict records (provenance.policy_settings),
    or None when it is the same; a verdict that records none (written before it did) cannot be held to it, and is
    named so. A baseline pin is held to the score file the verdict read instead (saved_mismatch): a pin added since,
    of that very file, leaves the verdict as it was."""
    then, now = v.provenance.policy_settings, policy.settings()
    if then is None:
        return f"{VERDICT_FILE} does not record the policy it applied (written before verdicts did); gate it again"
    pin = "baseline_scores_sha256"  # refuses evidence, never changes a verdict: held to the file read (saved_mismatch)
    diff = [k for k in sorted(set(then) | set(now)) if k != pin and then.get(k) != now.get(k)]
    if not diff:
        return None
    said = "; ".join(f"{k} {then.get(k)!r} then, {now.get(k)!r} now" for k in diff)
    return f"{VERDICT_FILE} was decided under other settings: {said[:400]}"


def settle_verdict(
    e: Entry, base: Entry, policy: Policy, suite: Any, needs_agreement: bool, base_file: str | None = None
) -> None:
    """A candidate's verdict: the saved one where it matches (whatever cached scores would say under the fixed
    design: a staged gate's rejection stays a rejection); else one decided here from cached full scores, labelled
    as recomputed, where the gate would decide from them (withheld: why not); else, with agreement alone, the
    policy's agreement rules (`agreement_outcome`). `base_file`: the sha256 of the baseline's cached score file."""
    saved = read_saved(Path(e.path))
    if saved is not None:
        e.verdict_stale = saved_mismatch(saved, policy, suite, base.sha256, e.sha256)
        if e.verdict_stale is None:
            e.verdict, e.verdict_origin = saved, "saved"
            return
    both = e.scores is not None and base.scores is not None
    if both and (e.agreement or not needs_agreement):
        assert e.scores is not None and base.scores is not None
        e.verdict_withheld = withheld(e, base, policy, base_file)
        if e.verdict_withheld is None:
            try:  # the gate's own refusal of these scores (other tokens, other provenance) is this entry's alone
                v = decide(policy, base.scores, e.scores, e.agreement)
            except UsageError as err:
                e.verdict_withheld = f"the gate refuses to decide from these scores: {err}"
            else:
                v.notes += other_tokens_note(base.scores, e.scores)
                if e.sha256 == base.sha256:
                    v.notes.append("baseline and candidate are one checkpoint: an A/A check")
                e.verdict, e.verdict_origin = v, "recomputed"
                return
    if e.agreement and needs_agreement:
        e.agreement_outcome = agreement_outcome(policy, e.agreement)


GATE_IT = "run `quantize gate` on the pair (with --json > CANDIDATE/gate.json, the report shows its verdict)"


def withheld(e: Entry, base: Entry, policy: Policy, base_file: str | None) -> str | None:
    """Why the gate would not decide from these cached scores alone, or None: the policy pins another baseline
    score file; a side is a GGUF (scored in llama.cpp: the gate compares both sides' tokens of every item first,
    evaluate/tokens.py, which loads tokenizers); the two sides' tokenizer files differ in bytes and their vocabularies
    (files.vocabulary_sha256: tokenizer.json through the tokenizers library) differ or do not read (the gate loads
    both tokenizers and refuses different vocabularies unless `allow_different_tokenizer:`). The report loads no
    model or tokenizer class, so where the gate would need one to decide, it shows no verdict of its own."""
    pin = policy.baseline_scores_sha256
    if pin is not None and base_file != pin:
        return (
            f"policy {policy.name} pins the baseline's score file to {pin[:12]}, and the cached one is "
            f"{(base_file or 'none')[:12]}: the gate refuses to decide on other evidence"
        )
    if any(ggufs.find(x.path) is not None for x in (e, base)):
        return f"a GGUF side: the gate compares both sides' tokens of every item before deciding; {GATE_IT}"
    if policy.allow_different_tokenizer or tokenizer_files(Path(e.path)) == tokenizer_files(Path(base.path)):
        return None
    ours, theirs = vocabulary_sha256(Path(e.path)), vocabulary_sha256(Path(base.path))
    if ours is None or ours != theirs:
        how = (
            "another vocabulary" if ours and theirs else "tokenizer files whose vocabulary is not read without loading"
        )
        return f"its tokenizer has {how} than the baseline's; the gate compares the two vocabularies; {GATE_IT}"
    return None


def agreement_outcome(policy: Policy, agreement: AgreementResult) -> str:
    """The policy's agreement rules on their own (a first picture before any scoring): a regression on any of
    them settles a rejection already; passes leave the accuracy and perplexity rules to the full gate."""
    outcomes = [
        agreement_rule(r, policy.label(i), agreement, policy.alpha).verdict
        for i, r in enumerate(policy.rules)
        if isinstance(r, AgreementRule)
    ]
    return "regression" if "regression" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"


def collect(  # noqa: PLR0913  # the report's settings, and the config completion the API passes in
    checkpoints: list[Path],
    suite_path: str,
    baseline: Path | None,
    policy_path: str | None,
    hardware: cost.Hardware,
    batch: int = 32,
    context: int = 2048,
    complete: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> list[Entry]:
    """The report's entries (`complete`: how config.json is completed for the decode bounds, decode_bounds)."""
    paths: list[Path] = []  # each folder once, however it is spelled (the baseline listed among the candidates too)
    for p in [*(p for p in [baseline] if p), *checkpoints]:
        if all(p.resolve() != q.resolve() for q in paths):
            paths.append(p)
    entries = unique_labels([_entry(p) for p in paths])
    base = entries[0] if baseline else None
    if base:
        base.is_baseline = True
    policy = load_policy(policy_path) if policy_path else None
    needs_agr = policy is not None and any(isinstance(r, AgreementRule) for r in policy.rules)
    suite = open_suite(suite_path)
    if policy is not None:
        check_rules(policy, suite)  # a rule on a task or metric the suite does not score: exit 2, as the gate says
    run = report_runtime(suite, entries, base)
    base_run = entry_runtime(suite, base, run) if base else None
    base_file = cache.score_file_sha256(suite, base.sha256, base_run) if base and base_run else None
    for e in entries:
        own = entry_runtime(suite, e, run)
        e.scores = cache.lookup_scores(suite, e.sha256, own)
        if base and not e.is_baseline:
            e.agreement = cache.lookup_agreement(suite, base.sha256, e.sha256, own, base_run)
            if policy:
                settle_verdict(e, base, policy, suite, needs_agr, base_file)
        e.decode = decode_bounds(e, base, hardware, batch, context, complete=complete)
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
