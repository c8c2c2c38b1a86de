"""The gate as a command runs it: open the suite once, score both sides (cached), measure agreement
when the policy asks, then decide. Evaluation (quantize/evaluate) and decisions (quantize/gates) meet in
this package (quantize/flows) and nowhere else: neither imports the other (tests/test_layers.py).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from quantize import progress, records
from quantize.checkpoint import finite, ggufs
from quantize.checkpoint.files import BlobCheck, architecture, check_loadable, check_model_dir, identity_sha256
from quantize.checkpoint.loader import LastModel, same_vocabulary
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate import cache
from quantize.evaluate.agreement import StagedAgreement, agreement_scores, baseline_topk_cached, measure_agreement
from quantize.evaluate.engine import gguf_to_score
from quantize.evaluate.samples import find_run, looks_like_samples, read_samples, run_identity, suite_items
from quantize.evaluate.score import SCORED_HERE, Staged, runtime, score
from quantize.evaluate.suite import OpenSuite, load_suite, open_suite
from quantize.gates import sequential as sq
from quantize.gates.gate import (
    check_baseline_finite,
    check_rules,
    comparable_settings,
    decide,
    other_tokens_note,
    prompts_note,
    same_prompts,
    side,
    tokens_note,
    verdict_of,
)
from quantize.gates.policy import AccuracyRule, AgreementRule, Policy, load_policy
from quantize.gates.render import is_gate_junit, render_junit
from quantize.golden.manifest import item_id
from quantize.io import check_output_file, sha256_file, write_text_atomic
from quantize.kinds import KINDS
from quantize.records import JUNIT_FILE, VERDICT_FILE, ScoreDoc, SideRef, Verdict, is_verdict_file, to_json
from quantize.report.card import add_verdict


def is_checkpoint(p: Path) -> bool:
    """A side that is scored (a checkpoint folder, or a GGUF file: ggufs.find), not read (a score file, or lm-eval's
    output with its samples: evaluate/samples.py)."""
    return (p.is_dir() and not looks_like_samples(p)) or ggufs.find(p) is not None


SAMPLES_HAVE_NO_LOGITS = (
    "agreement rules (KL, top-1 and Σ min against the baseline's top-k) need both sides' token distributions, which "
    "lm-eval's samples do not hold (per-item scores only); gate samples with a policy without agreement rules, or "
    "pass checkpoint folders"
)


def check_target(p: Path, checkpoint_only: str | None = None) -> None:
    """A side of a comparison exists and is a checkpoint folder, a GGUF, a score file or lm-eval's output with its
    samples (one run: evaluate/samples.find_run); `checkpoint_only`: why only a checkpoint will do."""
    if not p.exists():
        raise UsageError(
            f"{p} does not exist; pass a checkpoint folder, a score file (.json) or lm-eval's --output_path folder"
        )
    if looks_like_samples(p):
        if checkpoint_only:
            raise UsageError(f"{checkpoint_only}: {p} is lm-eval's output (its samples), not a checkpoint")
        find_run(p)  # one run, named before anything is scored
        return
    if gguf_to_score(p) is not None:  # llama.cpp installed, the header sound
        return
    if p.is_dir():
        check_model_dir(p)
        check_loadable(p)
    elif checkpoint_only:
        raise UsageError(f"{checkpoint_only}: {p}")
    elif p.suffix != ".json":
        raise UsageError(
            f"{p} is neither a checkpoint folder nor a score file (.json written by "
            "`quantize eval SUITE CKPT --json --items`)"
        )


def check_targets(policy: Policy, baseline: Path, candidate: Path) -> bool:
    """Both sides exist and are checkpoints or score files; returns whether agreement is needed."""
    needs_agreement = any(isinstance(r, AgreementRule) for r in policy.rules)
    why = f"policy {policy.name} has agreement rules, which need checkpoints, not score files"
    for p in (baseline, candidate):
        if needs_agreement and looks_like_samples(p):
            raise UsageError(f"policy {policy.name}: {p} is lm-eval's samples, and {SAMPLES_HAVE_NO_LOGITS}")
        check_target(p, why if needs_agreement else None)
    return needs_agreement


def comparison_notes(
    policy: Policy, suite: OpenSuite, baseline: Path, candidate: Path, trust_remote_code: bool = False
) -> tuple[list[str], bool]:
    """What the gate compares, said in the verdict: one checkpoint on both sides (an A/A check), or two of
    different architectures. Two vocabularies are refused (agreement and paired items over different
    tokenizations mean nothing) unless the policy allows it (`allow_different_tokenizer: true`). Where a side is
    a GGUF (scored in llama.cpp), every item's tokens are compared before anything is scored
    (evaluate/tokens.py): one difference is exit 2, whatever the policy. Returns the notes and whether the two
    sides' tokens were compared (then their engines may differ: gate.check_provenance). A side that is a score file
    or lm-eval's samples has no tokenizer to read: the items' recorded token hashes are compared once the scores are
    in (gates/gate.check_provenance, `files_tokens_note`)."""
    if not (is_checkpoint(baseline) and is_checkpoint(candidate)):
        return [], False

    base_id = identity_sha256(baseline)
    if base_id == identity_sha256(candidate):  # one identity: the same config and tokenizer files too
        return [
            f"baseline and candidate are one checkpoint (identity {base_id[:12]}): an A/A check, which says "
            "nothing about a conversion"
        ], False
    if ggufs.find(baseline) is not None or ggufs.find(candidate) is not None:
        from quantize.evaluate.tokens import check_same_tokens

        with progress.stage("gate: both sides' tokens of every item"):
            n = check_same_tokens(suite, baseline, candidate, trust_remote_code)
        engines = "llama.cpp" if ggufs.find(baseline) and ggufs.find(candidate) else "transformers and llama.cpp"
        return [f"scored in {engines}: both sides tokenize all {sum(n.values())} items alike (checked first)"], True
    notes = []
    a, b = architecture(baseline), architecture(candidate)
    if a != b:
        diff = ", ".join(f"{k} {a[k]} vs {b[k]}" for k in a if a[k] != b[k])
        notes.append(f"baseline and candidate are different architectures ({diff}): not one model at two precisions")
    if (different := other_tokenizer(baseline, candidate)) is not None:
        if not policy.allow_different_tokenizer:
            raise UsageError(
                f"{different}: their per-item scores and token agreement cannot be paired. Gate a candidate that keeps "
                "its baseline's tokenizer, or set `allow_different_tokenizer: true` in the policy (agreement rules "
                "still need one vocabulary)"
            )
        notes.append("baseline and candidate have different tokenizers (allowed by the policy)")
    return notes, False


def other_tokenizer(baseline: Path, candidate: Path) -> str | None:
    """Before any scoring, where two checkpoint folders (scored in transformers: a GGUF's tokens are compared item by
    item, evaluate/tokens.py) map tokens to other ids: the sentence saying so, else None. The gate's and `agree`'s
    one check (loader.same_vocabulary)."""
    if same_vocabulary(baseline, candidate):
        return None
    return f"{baseline} and {candidate} have different tokenizers (vocabularies differ)"


def load_scores(
    suite: OpenSuite,
    target: Path,
    models: LastModel,
    use_cache: bool = True,
    before_store: Callable[[], None] | None = None,
) -> ScoreDoc:
    """A checkpoint folder is scored (or read from the cache; `use_cache=False`: scored, the cache neither read nor
    written; `before_store` runs before scores computed here are cached, and may raise); lm-eval's output with its
    samples is read as the policy's suite's items (evaluate/samples.py); a .json file is a
    saved `quantize eval --json --items`, which must come from the policy's suite: same
    settings, same golden set, same tasks."""
    if is_checkpoint(target):
        return score(suite, target, models=models, use_cache=use_cache, before_store=before_store).doc
    if looks_like_samples(target):
        return read_samples(suite, target)
    doc = records.read(ScoreDoc, target)
    p = doc.provenance
    for field, theirs, ours in (
        ("suite settings", comparable_settings(p.suite.settings), comparable_settings(suite.suite.settings())),
        ("golden manifest sha256", p.golden.manifest_sha256, suite.golden.manifest_sha256),
        ("tasks", sorted(doc.tasks), sorted(suite.tasks)),
    ):
        if theirs != ours:
            raise UsageError(
                f"{target} was scored with another suite than the policy's {suite.path} ({field}: "
                f"{theirs} vs {ours}); score it with `quantize eval {suite.path} CHECKPOINT --json --items`"
            )
    if problems := score_file_problems(suite, doc):
        raise UsageError(
            f"{target} is not a score file of {suite.path}'s items as `quantize eval` writes one: "
            f"{'; '.join(problems[:4])}{' ...' if len(problems) > 4 else ''}; score it again with "
            f"`quantize eval {suite.path} CHECKPOINT --json --items`"
        )
    return doc


def score_file_problems(suite: OpenSuite, doc: ScoreDoc) -> list[str]:
    """What a score file a user names gets wrong against the suite, which the suite's own scorer cannot: task
    figures its items do not give (cache.summary_mismatches), a task of another output type or version than the
    file's provenance and the golden set give, and items other than the golden items the suite scores, each once
    and in its golden cluster (a duplicate read its last copy; a fabricated or dropped item, or a cluster of the
    file's own, was judged as if the golden set had it so)."""
    problems = cache.summary_mismatches(doc)
    for task, t in doc.tasks.items():
        if t.output_type != (kind := suite.golden.entry(task).output_type):
            problems.append(f"{task} holds {t.output_type} items, the golden set's are {kind}")
        if t.version != (recorded := doc.provenance.task_versions.get(task)):
            problems.append(f"{task} is version {t.version}, its provenance says {recorded}")
        ids = Counter(i.id for i in t.items)
        key = suite.golden.item_key(task)
        wanted = {i: item_id(d, key)[1] for i, d in suite_items(suite, task).items()}  # id -> its cluster
        for what, found in (
            ("twice", [i for i, n in ids.items() if n > 1]),
            ("not in the golden set", [i for i in ids if i not in wanted]),
            ("missing", [i for i in wanted if i not in ids]),
            # a cluster is what the SE is clustered by: one of the file's own could narrow the interval
            (
                "in another cluster than the golden set's",
                [i.id for i in t.items if wanted.get(i.id, i.cluster) != i.cluster],
            ),
        ):
            if found:
                problems.append(f"{task}: {len(found)} item(s) {what} (e.g. {', '.join(sorted(found)[:3])})")
    return problems


def check_sample_metrics(policy: Policy, doc: ScoreDoc, target: Path) -> None:
    """A side read from lm-eval's samples holds every per-item metric the policy's accuracy rules name (lm-eval
    computes what the task YAML's metric_list lists: a run on edited YAMLs may lack one): else exit 2 naming the
    rule, the task and the items."""
    if doc.provenance.samples is None:
        return
    for i, rule in enumerate(policy.rules):
        if not isinstance(rule, AccuracyRule) or rule.task not in doc.tasks:
            continue
        task = doc.tasks[rule.task]
        if rule.metric in KINDS[task.output_type].scored_as:
            continue
        if lacking := [item.id for item in task.items if rule.metric not in item.metrics]:
            raise UsageError(
                f"policy {policy.name}: rule {i + 1} ({policy.label(i)}) needs {rule.metric} per item of {rule.task}, "
                f"and the lm-eval samples in {target} lack it for {len(lacking)} item(s) (e.g. "
                f"{', '.join(lacking[:3])}): run lm-eval on the unchanged tasks `quantize golden export` writes, "
                "whose metric_list computes it"
            )


def open_policy(policy_path: str | Path) -> tuple[Policy, OpenSuite]:
    """A policy and its suite, opened and checked against each other before any scoring (bad input: exit 2)."""
    policy = load_policy(policy_path)
    suite = open_suite(policy.suite)
    check_rules(policy, suite)
    return policy, suite


def save_verdict(v: Verdict, junit: Path | None = None, record: Path | None = None, card: Path | None = None) -> None:
    """Where a verdict goes besides the terminal, each file written whole: the JUnit XML (one test case per rule),
    the verdict record (what `--json` prints) and the candidate's model card (`card`: its folder). The one writer
    for `quantize gate`, the GitHub Action's step and a sweep's gate tasks."""
    if junit is not None:
        write_text_atomic(junit, render_junit(v))
    if record is not None:
        write_text_atomic(record, to_json(v))
    if card is not None:
        add_verdict(card, v, str(record) if record is not None else "the verdict")


def check_verdict_files(
    policy_path: str | Path, sides: tuple[Path, ...], junit: tuple[str, Path] | None, record: tuple[str, Path] | None
) -> None:
    """Before any scoring (and again before writing): the JUnit file and the verdict record a user names, each
    (its flag, its path), may be written there (io.check_output_file): no link, nothing inside the checkpoints
    compared (`sides`) or the policy's golden set, and an existing file only where it is one the gate wrote
    (gates/render.is_gate_junit, records.is_verdict_file): `--junit CANDIDATE/model.safetensors` replaced the
    candidate's weights, `--junit POLICY.yaml` the policy. The one place inside a checkpoint each may be is its own
    home beside a candidate folder, CANDIDATE/gate.xml (JUNIT_FILE) and CANDIDATE/gate.json (VERDICT_FILE): where
    `make gate-these` and a sweep save a verdict and the report reads it; no loader reads a file of those names. The
    policy is read for its golden set (a bad one is the exit 2 the gate gives)."""
    golden = load_suite(load_policy(policy_path).suite)[0].golden
    apart = [(f"the {w} checkpoint", p) for w, p in zip(("baseline", "candidate"), sides, strict=False)]
    apart.append(("the policy's golden set", Path(golden)))
    if junit is not None and record is not None and junit[1].absolute() == record[1].absolute():
        raise UsageError(
            f"{junit[0]} and {record[0]} are one path, {junit[1]}: the verdict would replace the JUnit XML"
        )
    for given, ours, kind, home in (
        (junit, is_gate_junit, "a JUnit file the gate wrote", JUNIT_FILE),
        (record, is_verdict_file, "a verdict the gate wrote", VERDICT_FILE),
    ):
        if given is not None:
            here = apart
            if len(sides) > 1 and given[1].name == home and _same_folder(given[1].parent, sides[1]):
                here = [a for a in apart if a[1] is not sides[1]]  # its home beside the candidate
            check_output_file(given[1], given[0], ours, kind, here)


def _same_folder(a: Path, b: str | Path) -> bool:
    """Whether `a` and `b` are one folder, links resolved (False where either cannot be resolved or is none)."""
    try:
        return a.resolve().is_dir() and a.resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False


def score_baseline(policy_path: str | Path, baseline: Path) -> bool:
    """A baseline's full scores on the policy's suite, and its top-k where the policy has agreement rules, into the
    cache (what every later gate against it reads). Returns whether its scores were there already."""
    policy, suite = open_policy(policy_path)
    models = LastModel(False)
    names = BlobCheck([baseline])  # a Hub blob whose name lies: nothing cached under the identity it borrowed
    doc, cached = score(suite, baseline, models=models, before_store=names.wait)
    if any(isinstance(r, AgreementRule) for r in policy.rules):
        base_id = doc.provenance.checkpoint.identity_sha256
        baseline_topk_cached(suite, baseline, base_id, models, before_store=names.wait)
    names.wait()
    return cached


def scored_here() -> list[str]:
    """The checkpoint identities this process scored in full, not from the cache (quantize.evaluate.score)."""
    return list(SCORED_HERE)


def run_gate(
    policy_path: str | Path,
    baseline: str | Path,
    candidate: str | Path,
    trust_remote_code: bool = False,
    trust_cached_candidate: bool = False,
) -> Verdict:
    """trust_remote_code: run the checkpoints' own Python at load; only the command line can ask for it.
    The candidate is scored in this run (in full or in stages), never read from the cache, unless
    `trust_cached_candidate` (--trust-cached-candidate): a restored cache supplies the baseline's evidence only
    (docs/reliability.md). Weights identified by Hub blob names are read back in a background thread while the
    gate scores (files.BlobCheck): a name that lies is exit 2 and no verdict. The verdict is kept in the cache
    (evaluate/cache.py store_verdict) where both sides are checkpoints (scored here, or read from the score cache
    under its trust model), never where a side is a score file or lm-eval's samples named here: a gate.json is the
    report's and a sweep's evidence only as a gate's own on the checkpoints themselves."""
    policy, suite = open_policy(policy_path)  # a bad suite or golden set is a usage error before any scoring
    base_path, cand_path = Path(baseline), Path(candidate)
    needs_agreement = check_targets(policy, base_path, cand_path)
    if is_checkpoint(base_path):  # before anything is scored (verdict_of checks the scores' record again)
        check_baseline_finite(str(base_path), finite.non_finite_tensors(base_path))
    names = BlobCheck([p for p in (base_path, cand_path) if is_checkpoint(p)])  # lm-eval's samples have no blobs
    try:
        v, store = _gate(
            policy, suite, (base_path, cand_path), needs_agreement, (trust_remote_code, trust_cached_candidate), names
        )
    except (UsageError, RuntimeFailure):
        names.wait()  # a blob whose name lies explains whatever failed after it
        raise
    names.wait()
    if store is not None:  # the candidate's computed evidence, kept for the report once its identity holds
        store()
    # what makes a gate.json of it evidence for the report and a sweep (holds_verdict): only a verdict on two
    # checkpoints' evidence is kept, never one over a score file the user named (cache.checkpoints_evidence)
    cache.store_verdict(v)
    return v


def _gate(
    policy: Policy,
    suite: OpenSuite,
    paths: tuple[Path, Path],
    needs_agreement: bool,
    trusts: tuple[bool, bool],
    names: BlobCheck,
) -> tuple[Verdict, Callable[[], None] | None]:
    """run_gate's scoring and decision; returns the verdict and what stores the candidate's computed evidence in
    the cache (only where the cache has no entry for it yet), or None. `trusts`: (trust_remote_code,
    trust_cached_candidate). The baseline's evidence computed here is cached only after `names` (the blob check)
    holds, so a blob whose name lies leaves nothing in the cache under the identity it borrowed."""
    trust_remote_code, trust_cached_candidate = trusts
    base_path, cand_path = paths
    notes, across_engines = comparison_notes(policy, suite, base_path, cand_path, trust_remote_code)
    # one load per checkpoint: the baseline's top-k right after its scores, the candidate's agreement
    # right after its scores, while each is the model in memory
    models = LastModel(trust_remote_code)

    def run_of(p: Path) -> cache.Runtime | None:  # only a checkpoint is scored or read from the cache (its runtime)
        return runtime(suite, trust_remote_code, p) if is_checkpoint(p) else None

    base_run, run = run_of(base_path), run_of(cand_path)
    base_id = identity_sha256(base_path) if is_checkpoint(base_path) else ""
    if policy.baseline_scores_sha256 is not None:  # before any scoring: another file is refused, not scored first
        found = scores_sha256(suite, base_path, base_id, base_run)
        if found != policy.baseline_scores_sha256:
            raise UsageError(
                f"policy {policy.name} pins the baseline's score file to sha256 {policy.baseline_scores_sha256}, and "
                f"the scores of {base_path} would come from {found or 'no file (they would be scored here)'}: "
                "refusing to gate on other evidence. Score the pinned baseline, or update `baseline_scores_sha256:` "
                "in the policy after checking the new scores"
            )
    with progress.stage(f"gate: baseline scores ({base_path.name})"):
        base = load_scores(suite, base_path, models, before_store=names.wait)
    check_sample_metrics(policy, base, base_path)
    base_file = scores_sha256(suite, base_path, base.provenance.checkpoint.identity_sha256, base_run)
    in_stages = (
        policy.sequential is not None
        and is_checkpoint(cand_path)
        and not all(isinstance(r, AgreementRule) for r in policy.rules)
    )
    if needs_agreement:  # before the candidate loads; in stages StagedAgreement then finds it in the cache
        with progress.stage(f"gate: baseline top-k ({base_path.name})") as st:
            baseline_topk_cached(
                suite, base_path, base.provenance.checkpoint.identity_sha256, models, before_store=names.wait
            )
            st.note = "" if st.inner else "read from the cache"  # computing it is a stage of its own
    computed = is_checkpoint(cand_path) and not trust_cached_candidate
    store = None
    if in_stages:
        v = run_sequential(
            policy, suite, base, (base_path, cand_path), models, (needs_agreement, not computed, across_engines)
        )
        staged_here = v.sequential is not None and v.sequential.candidate_seconds is not None
        cand_id = v.provenance.candidate.checkpoint.identity_sha256
        cand_file = None if staged_here else scores_sha256(suite, cand_path, cand_id, run)
    else:
        # on --trust-cached-candidate, an entry there before scoring is what the candidate's scores are read from
        cached = not is_checkpoint(cand_path) or (
            not computed and scores_sha256(suite, cand_path, identity_sha256(cand_path), run) is not None
        )
        with progress.stage(f"gate: candidate scores ({cand_path.name})"):
            # trusting the cache, scores computed where none was cached are stored: only after the blob check
            cand = load_scores(suite, cand_path, models, use_cache=not computed, before_store=names.wait)
        check_sample_metrics(policy, cand, cand_path)
        cand_id = cand.provenance.checkpoint.identity_sha256
        agreement = None
        if needs_agreement:
            with progress.stage(f"gate: candidate agreement ({cand_path.name})"):
                agreement = candidate_agreement(
                    suite, base, (base_path, cand_path), cand_id, models, not computed, before_store=names.wait
                )
        with progress.stage("gate: decision"):
            v = decide(policy, base, cand, agreement, across_engines)
        v.notes += files_tokens_note(paths, base, cand)  # in stages, run_sequential's
        cand_file = scores_sha256(suite, cand_path, cand_id, run) if cached else None
        if computed:
            store = functools.partial(_keep, suite, cand, agreement, (run, base_run))
    v.provenance.score_files = {"baseline": base_file, "candidate": cand_file}
    v.provenance.candidate_scores, v.provenance.baseline_scores = (
        ("computed" if cand_file is None else "cache") if is_checkpoint(cand_path) else "file",
        "checkpoint" if is_checkpoint(base_path) else "file",  # a score file or lm-eval's samples: the user's
    )
    if v.provenance.candidate_scores == "cache":
        v.notes.append(
            "the candidate's scores were read from the score cache (--trust-cached-candidate), not computed in this "
            "run: the verdict is as good as whoever wrote that cache"
        )
    v.notes += notes + samples_notes(policy, base_path, cand_path, v)
    return v, store


def files_tokens_note(paths: tuple[Path, Path], base: ScoreDoc, cand: ScoreDoc | None) -> list[str]:
    """Where a side is a score file or lm-eval's samples (no tokenizer the gate could read), what the verdict says
    of the items' tokens: compared by their recorded hashes (gates/gate.check_provenance refused a difference unless
    the policy allows different tokenizers), or not compared, and why. Two checkpoints: a note only where their items
    were scored on other tokens (allowed by the policy: gates/gate.other_tokens_note)."""
    if cand is None:
        return []
    if all(is_checkpoint(p) for p in paths):
        return other_tokens_note(base, cand)
    return [tokens_note(base, cand)]


def samples_notes(policy: Policy, base_path: Path, cand_path: Path, v: Verdict) -> list[str]:
    """What the verdict says where a side is lm-eval's samples: every item was scored, so a `sequential:` policy
    decided on the fixed design; one set of samples on both sides is an A/A check."""
    notes = []
    if policy.sequential is not None and looks_like_samples(cand_path):
        notes.append(
            "the candidate is lm-eval's samples, which score every item: the policy's `sequential:` design was not "
            "used, and every rule decided on the full items at level alpha (the fixed design)"
        )
    p = v.provenance
    base_id = p.baseline.checkpoint.identity_sha256
    if base_id == p.candidate.checkpoint.identity_sha256 and looks_like_samples(cand_path):
        notes.append(
            f"baseline and candidate are the same lm-eval samples (identity {base_id[:12]}): an A/A check, which "
            "says nothing about a conversion"
        )
    return notes


def _keep(
    suite: OpenSuite,
    cand: ScoreDoc,
    agreement: records.AgreementResult | None,
    runs: tuple[cache.Runtime | None, cache.Runtime | None],
) -> None:
    """A candidate's scores and agreement computed in a gate, into the cache where it has no entry for them (an
    entry there is never replaced: its sha256 may be pinned), for the report and later commands. `runs`: the
    candidate's runtime and the baseline's (None for a side that is not a checkpoint)."""
    cache.store_scores(suite, cand, replace=False)
    run, base_run = runs
    if agreement is not None and run is not None and base_run is not None:
        cache.store_agreement(suite, agreement, run, base_run, replace=False)


def scores_sha256(suite: OpenSuite, target: Path, ckpt_id: str, run: cache.Runtime | None) -> str | None:
    """The sha256 of the file a side's scores were read from: the score file given, or its cache entry (under
    `run`, which a checkpoint side always has)."""
    if looks_like_samples(target):  # the identity of the files read: "NAME SHA256" per file (evaluate/samples.py)
        return ckpt_id or run_identity(target)
    if not is_checkpoint(target):
        return sha256_file(target)
    assert run is not None, "a checkpoint side is read from the cache under this process's runtime"
    return cache.score_file_sha256(suite, ckpt_id, run)


def candidate_agreement(
    suite: OpenSuite,
    base: ScoreDoc,
    paths: tuple[Path, Path],
    cand_id: str,
    models: LastModel,
    from_cache: bool = False,
    before_store: Callable[[], None] | None = None,
) -> records.AgreementResult:
    """The candidate's agreement with the baseline, through the gate's one loader: measured here, or with
    `from_cache` read from the cache where it is there (and cached, after `before_store`: the blob check)."""
    (base_path, cand_path), base_id = paths, base.provenance.checkpoint.identity_sha256
    if not from_cache:
        return measure_agreement(suite, base_path, cand_path, (base_id, cand_id), models)
    return agreement_scores(suite, base_path, cand_path, base_id, cand_id, models=models, before_store=before_store)


def run_sequential(
    policy: Policy,
    suite: OpenSuite,
    base: ScoreDoc,
    paths: tuple[Path, Path],
    models: LastModel,
    flags: tuple[bool, bool, bool],
) -> Verdict:
    """The policy's `sequential:` design (quantize/gates/sequential.py): agreement first, in looks of its own (one
    load of the candidate serves them and every stage; a regression there settles the gate before any item is
    scored), then the candidate's items in stages until the verdict is settled.
    With `from_cache` (--trust-cached-candidate), a candidate whose full scores are cached is read from the cache,
    look by look, at no cost; its agreement is always measured here, in stages (quantize/evaluate/agreement.py
    `StagedAgreement`). `flags`: (whether agreement rules need it, `from_cache`, whether the two sides' engines may
    differ: gate.check_provenance's `across_engines`)."""
    needs_agreement, from_cache, across_engines = flags

    assert policy.sequential is not None
    tasks = sq.rule_tasks(policy)
    base_path, cand_path = paths
    staged = Staged(suite, cand_path, {t: [i.id for i in base.tasks[t].items] for t in tasks}, models, from_cache)
    agreement = None
    if needs_agreement:
        ids = (base.provenance.checkpoint.identity_sha256, staged.ref.identity_sha256)
        agreement = StagedAgreement(suite, base_path, cand_path, ids, models, policy.sequential.looks)
    looks = len(policy.sequential.looks)
    agree = _agreement_looks(agreement.look, looks, cand_path.name) if agreement is not None else None
    score = _score_looks(staged.score, looks, cand_path.name)
    with progress.stage(f"gate: candidate in stages ({cand_path.name}, up to {looks} looks)"):
        results, taken, plans, bounds, cand, agreement_looks = sq.run(policy, base, agree, score, across_engines)
    scored = {t: len(v) for t, v in staged.items.items()}
    seconds = None if staged.cached else round(staged.seconds, 1)
    if cand is not None:
        candidate = side(cand)
    else:  # stopped by agreement before any look: the agreement was computed where a scoring would have been
        at = runtime(suite, models.trust_remote_code, cand_path)
        candidate = SideRef(checkpoint=staged.ref, batch_size=suite.suite.batch_size, cpu=at.cpu, threads=at.threads)
    record = sq.record(policy.sequential, bounds, taken, plans, scored, seconds, agreement_looks)
    runs: dict[str, object] = {"batch_size": suite.suite.batch_size, "stage_runs": staged.calls}
    if agreement is not None:
        runs |= {"agreement_runs": agreement.calls, "agreement_seconds": round(agreement.seconds, 1)}
    record = record.model_copy(update=runs)
    v = verdict_of(policy, base, candidate, results, record)
    if cand is not None and base.provenance.samples is not None:  # each look checked the prompts (check_provenance)
        v.notes.append(prompts_note(base, cand, same_prompts(base, cand)))
    v.notes += files_tokens_note(paths, base, cand)
    return v


def _score_looks(score: Callable[[dict[str, list[str]]], ScoreDoc], looks: int, name: str) -> Callable[..., ScoreDoc]:
    """A staged scorer whose calls (one per look, in order) are progress stages: look k of K, items per task."""
    taken: list[int] = []

    def look(ids: dict[str, list[str]]) -> ScoreDoc:
        taken.append(1)
        what = ", ".join(f"{len(v)} items of {t} in all" for t, v in ids.items())
        with progress.stage(f"gate: look {len(taken)} of {looks} ({name}): {what}"):
            return score(ids)

    return look


def _agreement_looks(
    agree: Callable[[int], records.AgreementResult], looks: int, name: str
) -> Callable[[int], records.AgreementResult]:
    """A staged agreement whose looks are progress stages."""

    def look(k: int) -> records.AgreementResult:
        with progress.stage(f"gate: agreement look {k + 1} of {looks} ({name})"):
            return agree(k)

    return look
