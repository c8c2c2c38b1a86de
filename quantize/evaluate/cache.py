"""The evaluation cache: where scores and agreement results live, keyed by their provenance.

The one place that builds their keys and paths (tests/test_layers.py enforces it). Scorers store through it, the
gate and the report look up through it. Nothing here loads a model or imports torch or lm-eval (the layering test
holds it to that: gates, the report and flows read it). A cache may be restored from a store other people write
(CI), so what it serves is checked on every read (quantize/cache.py `checked_bytes`): a score file must hash to the
sha256 beside it, carry the key and checkpoint identity it was asked for, and its task summaries must follow from
its items. What a restored cache may supply to a gate (the baseline's scores and top-k, never the candidate's
unless asked for) is docs/reliability.md's trust model, which quantize/flows/gate.py enforces.

    scores     $QUANTIZE_CACHE/scores/KEY.json    KEY = sha256(checkpoint identity, suite settings, golden manifest,
                                                               tasks, runtime, scorer_id, library_versions
                                                               (lm-eval's among them))
               $QUANTIZE_CACHE/scores/KEY.sha256  the sha256 of KEY.json's bytes, written after it
    agreement  $QUANTIZE_CACHE/agreement/base-B-K.npz       the baseline's top-k, K = agreement settings, the
                                                             suite's backend, batch size and max_length, runtime,
                                                             library_versions
               $QUANTIZE_CACHE/agreement/cmp-B-C-K.json     a candidate against it
               each with a .sha256 beside it, checked on read as a score file's is, and a comparison must name
               the two identities it was asked for
    search     $QUANTIZE_CACHE/search/sensitivity-KEY.json  KEY = sha256(model identity, base recipe, options,
                                                               unit, golden manifest, suite, per_task, top_k,
                                                               device kind, dtype, library_versions); sealed
                                                               (.sha256) and holding its whole key
    verdicts   $QUANTIZE_CACHE/verdicts/SHA256.json         a verdict a gate run with this cache decided on two
                                                             checkpoints' evidence (`file_side`), as
                                                             `to_json` writes it read back, named by the sha256
                                                             of those bytes: what makes a gate.json beside a
                                                             candidate the report's and a sweep's evidence
                                                             (`holds_verdict`; docs/reliability.md)

The runtime (`Runtime`) is what changes a computed number besides the checkpoint and the suite's text: the device
kind the model ran on (kernels differ between a CPU and an accelerator), the dtype it was loaded in (the suite's
"auto" resolves to float32 on a CPU and the checkpoint's own dtype elsewhere), whether the checkpoint's own
code ran (--trust-remote-code), for a GGUF the engine that scored it (llama.cpp: its version, its build's native
libraries, threads and decode chunk; dtype "gguf": the file's own types), and for a model that rounds its
activations on a CPU the CPU as its kernels see it and torch's thread count (`Runtime.rounding`: its numbers move
with both).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize import machine, records
from quantize.cache import cache_dir, checked_bytes, content_path, read_digest, seal_record
from quantize.errors import UsageError
from quantize.evaluate.engine import llamacpp_engine, llamacpp_version
from quantize.evaluate.suite import DEVICE_KINDS, OpenSuite, device_kind
from quantize.io import read_user_file, sha256_bytes, sha256_json, write_text_atomic
from quantize.kinds import KINDS
from quantize.records import AgreementResult, ScoreDoc, SensitivityRecord, Verdict


def lm_eval_version() -> str:
    return metadata.version("lm_eval")


# The installed packages whose versions can change a score: this one (its scoring code), the scorer, the model
# code and its kernels, the tokenizers, the formats' decompression, the datasets reader. Pinned in pyproject.toml.
SCORING_DISTRIBUTIONS = (
    "quantize",
    "lm_eval",
    "torch",
    "transformers",
    "tokenizers",
    "compressed-tensors",
    "datasets",
)
# Those whose installed versions key every score and agreement entry besides our revisions (SCORER_REVISION,
# AGREEMENT_REVISION key our own code): an upgrade scores again instead of serving what another release computed.
# Before 2026-12-07 only lm-eval's version keyed an entry, and the CI restore key alone held the others.
KEYED_DISTRIBUTIONS = tuple(d for d in SCORING_DISTRIBUTIONS if d != "quantize")


@functools.cache
def library_versions() -> tuple[tuple[str, str], ...]:
    """(distribution, installed version or "none") of each of KEYED_DISTRIBUTIONS."""
    out = []
    for d in KEYED_DISTRIBUTIONS:
        try:
            out.append((d, metadata.version(d)))
        except metadata.PackageNotFoundError:
            out.append((d, "none"))
    return tuple(out)


# Bumped when our scorer (`backend: quantize`, quantize/evaluate/lm.py) changes what it computes (a score computed
# the old way is another number, if only in its last bits). 1-3: lm-eval's HFLM with our overrides. 4: our own
# lm-eval model, each distinct context computed once from its keys and values. 5 (reverted): rows of several items
# share a pass, each padded to a width of its own. 6: 5's packed passes for dense full-attention models on the
# CPU, 4's passes elsewhere. 7: a checkpoint that rounds activations or its KV cache (lm.rounds_activations: FP8,
# W8A8, W4AFP8, NVFP4, MXFP4, a kv_cache_scheme) is scored one request a pass, a whole unpadded row (HFLM's at batch
# size 1), its rounding having turned a packed row's padding into other answers (FP8 dynamic: 1.29 nats from stock
# HFLM, docs/results.md "Revision 7"); every other checkpoint's numbers are 6's, but the key moves, so entries of
# revision 6 are scored again. 8: a model with a layer whose cache is not per-position keys and values (linear
# attention, Mamba2, short convolutions, DeepSeek-V3.2's indexer: lm.shares_contexts) shares no context either,
# each request a whole row alone; before, such a model failed in transformers' cache copy or (Falcon-H1) scored
# 0.02 nats from stock HFLM. Every other checkpoint's numbers are 7's. 9: every item records the hash of the tokens
# it scored (evaluate/engine.ScoredTokens), which a gate compares where a side is a score file; the numbers are 8's,
# but the key moves, so every entry served carries the hashes. 10: a generated item records the log-likelihood of
# its generated tokens (`generated_ll`, from each step's raw logits: NaN where they were, which a gate counts as a
# regression; before, a NaN model's empty answers scored as a finite model's wrong ones and passed an exact_match
# rule); the answers and every other number are 9's, but the key moves, so every entry served carries it.
SCORER_REVISION = 10


def scorer_id(suite: OpenSuite) -> str:
    """Which scorer computed a suite's scores, in its keys: ours at its revision, or lm-eval's own backend (lm-eval's
    version keys it)."""
    backend = suite.suite.backend.value
    return f"{backend}-{SCORER_REVISION}" if backend == "quantize" else backend


def restore_key_parts(suite: OpenSuite) -> dict[str, Any]:
    """What a CI cache of a suite's scores is saved and restored under (`quantize cache-key POLICY`): everything
    that keys its score and agreement entries except the checkpoints and the runtime (module docstring), and the
    installed versions of SCORING_DISTRIBUTIONS. A policy's own rules key nothing: two policies on one suite
    share their scores. The runtime is the runner's (device kind, dtype; a model that rounds activations also its
    CPU and thread count, which key its entries alone): where runners differ, the action's `cache-key-extra` tells
    them apart."""
    a = suite.suite.agreement
    return {
        "suite_settings_sha256": suite.sha256,
        "golden_manifest_sha256": suite.golden.manifest_sha256,
        "tasks": sorted(suite.tasks),
        "agreement": [sorted(suite.agreement_tasks), a.per_task, a.top_k],
        "versions": {d: metadata.version(d) for d in SCORING_DISTRIBUTIONS},
        "scorer_revision": SCORER_REVISION,
    }


def restore_key(suite: OpenSuite) -> str:
    return f"quantize-scores-{sha256_json(restore_key_parts(suite))[:32]}"


@dataclass(frozen=True)
class Runtime:
    """Where and how a model computed a cached number (module docstring): part of every score and agreement key."""

    device_kind: str  # cpu, cuda, xpu, npu, mps: the device without its index
    dtype: str  # the suite's dtype resolved for that device ("auto": the checkpoint's own, fixed by its identity)
    trust_remote_code: bool = False
    engine: str | None = None  # another engine than transformers: a GGUF's llama.cpp (evaluate/engine.llamacpp_engine)
    # a model that rounds activations, on a CPU (`rounding`): the CPU as its kernels see it (machine.cpu_kernels:
    # its name, SIMD extensions and kernel variables) and torch's thread count
    cpu: str | None = None
    threads: int | None = None

    @classmethod
    def on(cls, suite: OpenSuite, device: str, trust_remote_code: bool = False, rounds: bool = False) -> Runtime:
        """The runtime of a model run on `device` (a resolved device: "cpu", "cuda:1", ...) under the suite;
        `rounds`: the model rounds its activations (checkpoint/rounding.py), so a CPU's runtime names the
        machine (`rounding`)."""
        kind = device_kind(device)
        return cls(kind, suite.suite.model_dtype(kind), trust_remote_code).rounding(rounds)

    def rounding(self, rounds: bool) -> Runtime:
        """This runtime for a model that rounds its activations (`rounds`) or does not. Where it does, on a CPU, the
        runtime names this machine's CPU as its kernels see it (its name, SIMD extensions and kernel variables:
        a masked name covers CPUs with other kernels) and the thread count torch computes with there
        (quantize/machine.py, pinned at each load): a last-bit change from other kernels or another split of a
        matmul's sums can cross a rounding boundary and move a score by a nat or more (docs/results.md). A model
        that rounds only its weights moved by at most 3.8e-5 nats between thread counts or kernels on the default
        model (a tiny seeded model's rolling document, a sum of about 1,880 nats: 1.2e-4 under ATEN_CPU_CAPABILITY
        =default, a review's figure), and its entries stay shared between machines (a CI cache restored on another
        runner): differences of that size, not a rounding boundary crossed. On an accelerator the device kind
        alone keys it (not measured across accelerator models)."""
        if not rounds or self.device_kind != "cpu" or self.engine is not None:
            return replace(self, cpu=None, threads=None)
        return replace(self, cpu=machine.cpu_kernels(), threads=machine.threads())

    def key(self) -> list[Any]:
        trust = ["trust_remote_code"] if self.trust_remote_code else []
        on = ["machine", self.cpu, self.threads] if self.cpu is not None else []
        return [self.device_kind, self.dtype, *trust, *(["engine", self.engine] if self.engine else []), *on]


def runtimes(suite: OpenSuite) -> list[Runtime]:
    """Every runtime a suite's scores may have been computed under, for a reader that loads no model (the report):
    the suite's own device, or on "auto" every device kind; without and then with the checkpoint's own code; and
    llama.cpp's where it is installed (a GGUF's). A checkpoint that rounds activations is read under one of these
    `rounding(True)`: this machine's CPU and thread count."""
    device = suite.suite.device
    kinds = DEVICE_KINDS if device == "auto" else (device_kind(device),)
    gguf = [llamacpp_runtime(suite)] if llamacpp_version() is not None else []
    return [Runtime.on(suite, k, trust) for trust in (False, True) for k in kinds] + gguf


def on_this_cpu(run: Runtime) -> list[Runtime]:
    """Where a reader that loads no model (the report, a sweep's driver) looks for a rounding model's scores
    computed on this CPU: `run` (this process's thread count), then every other count up to this machine's CPUs
    (a sweep's task scores at its own). `run` alone where it names no machine."""
    if run.threads is None:
        return [run]
    counts = range(1, max(os.cpu_count() or 1, run.threads) + 1)
    return [run, *(replace(run, threads=n) for n in counts if n != run.threads)]


def llamacpp_runtime(suite: OpenSuite) -> Runtime:
    """The runtime of a GGUF scored in llama.cpp under the suite: on the CPU, in the file's own types, no
    checkpoint code (a GGUF has none), the engine named (evaluate/engine.llamacpp_engine)."""
    return Runtime("cpu", "gguf", False, llamacpp_engine(suite.suite))


def score_key(suite: OpenSuite, ckpt_id: str, run: Runtime) -> str:
    parts = [ckpt_id, suite.sha256, suite.golden.manifest_sha256, sorted(suite.tasks)]  # lm-eval: library_versions
    return sha256_json([*parts, "runtime", *run.key(), "scorer", scorer_id(suite), "libraries", *library_versions()])


REFRESH = "score it again with `quantize eval SUITE CHECKPOINT --refresh` (or delete the file)"


def score_path(suite: OpenSuite, ckpt_id: str, run: Runtime) -> Path:
    return cache_dir() / "scores" / f"{score_key(suite, ckpt_id, run)[:32]}.json"


def lookup_scores(suite: OpenSuite, ckpt_id: str, run: Runtime) -> ScoreDoc | None:
    """The cached scores of a checkpoint on a suite, checked (module docstring); None when there are none, or when
    the entry has no digest beside it (written before entries were hashed, or copied without it: nothing vouches for
    it, so it is scored again and replaced)."""
    p = score_path(suite, ckpt_id, run)
    if (raw := checked_bytes(p, REFRESH, "score file")) is None:
        return None
    doc = records.loads(ScoreDoc, raw, p)
    key = score_key(suite, ckpt_id, run)
    if doc.key != key or doc.provenance.checkpoint.identity_sha256 != ckpt_id or ran(doc) != run:
        raise UsageError(
            f"cached score file {p} holds another checkpoint's or suite's scores (its key "
            f"{doc.key[:16]}, identity {doc.provenance.checkpoint.identity_sha256[:16]}, {ran(doc)}; asked for "
            f"{key[:16]}, {ckpt_id[:16]}, {run}); {REFRESH}"
        )
    if wrong := summary_mismatches(doc):
        raise UsageError(f"cached score file {p} does not add up: {'; '.join(wrong[:3])}; {REFRESH}")
    return doc


def ran(doc: ScoreDoc) -> Runtime:
    """The runtime a score document says it was computed under."""
    p = doc.provenance
    return Runtime(device_kind(p.device), p.dtype, p.trust_remote_code, p.engine, p.cpu, p.threads)


def summary_mismatches(doc: ScoreDoc) -> list[str]:
    """Task figures that do not follow from the task's items (the kind's own summary, quantize/kinds.py)."""
    out = []
    for name, t in doc.tasks.items():
        items = [i.model_dump() for i in t.items]
        if t.n != len(items):
            out.append(f"{name}: n = {t.n} but {len(items)} items")
            continue
        for field, derived in KINDS[t.output_type].summary(items, getattr(t, "filter", None)).items():
            stored = getattr(t, field)
            same = stored == derived or (
                isinstance(stored, float) and isinstance(derived, float) and math.isnan(stored) and math.isnan(derived)
            )
            if not same:
                out.append(f"{name}: {field} is {stored} but its items give {derived}")
    return out


def score_file_sha256(suite: OpenSuite, ckpt_id: str, run: Runtime) -> str | None:
    """The sha256 of a checkpoint's cached score file as its digest says (the file checked against it by
    lookup_scores), or None when there is none; a digest that holds no sha256 is exit 2 (quantize/cache.py
    `read_digest`), as a file that does not hash to it is."""
    return read_digest(score_path(suite, ckpt_id, run), REFRESH, "score file")


def store_scores(suite: OpenSuite, doc: ScoreDoc, replace: bool = True) -> None:
    """A score entry sealed (quantize/cache.py `seal_record`: `replace=False` only where none is there yet; else
    the caller, score, holds the claim)."""
    seal_record(score_path(suite, doc.provenance.checkpoint.identity_sha256, ran(doc)), doc, replace)


# What our agreement forward pass computes, revised: 2 (2026-12-03) truncates a document to the model's context
# length when the suite sets none (scoring's rule), where 1 kept its last 2,048 tokens whatever the model's.
# 3 (2026-12-04) applies the head to the scored positions only and cuts a batch where their logits would pass a
# budget (evaluate/agreement.py, Scorer): the same quantities, other float rounding and batches. It keys the
# search's sensitivities too (the same scorer's KL).
AGREEMENT_REVISION = 3


def _agreement_key(suite: OpenSuite, run: Runtime) -> str:
    s = suite.suite
    a = s.agreement
    parts = [sorted(suite.agreement_tasks), a.per_task, a.top_k, suite.golden.manifest_sha256]
    # what the agreement scorer reads of the suite besides its items: which scorer, the rows a batch pads to one
    # width and the context window that cuts them (each moved a KL in review; they were not in the key)
    scorer = [s.backend.value, s.batch_size, s.max_length]
    libraries = ["libraries", *library_versions()]
    # our own forward pass: AGREEMENT_REVISION keys it, SCORER_REVISION (lm-eval's path) does not
    key = [*parts, "scorer", *scorer, "runtime", *run.key(), "agreement", AGREEMENT_REVISION, *libraries]
    return sha256_json(key)[:16]


def baseline_topk_path(suite: OpenSuite, base_id: str, run: Runtime) -> Path:
    return cache_dir() / "agreement" / f"base-{base_id[:16]}-{_agreement_key(suite, run)}.npz"


def _comparison_key(suite: OpenSuite, run: Runtime, baseline_run: Runtime | None) -> str:
    """A comparison's key: the candidate's runtime, and the baseline's where it differs (a GGUF on one side,
    scored in llama.cpp: its engine's version, build and settings computed the baseline's top-k the comparison used)."""
    if baseline_run is None or baseline_run == run:
        return _agreement_key(suite, run)
    return sha256_json([_agreement_key(suite, run), "baseline runtime", *baseline_run.key()])[:16]


def agreement_path(
    suite: OpenSuite, base_id: str, cand_id: str, run: Runtime, baseline_run: Runtime | None = None
) -> Path:
    """The comparison of a candidate computed under `run` with a baseline computed under `baseline_run` (None:
    the same runtime)."""
    key = _comparison_key(suite, run, baseline_run)
    return cache_dir() / "agreement" / f"cmp-{base_id[:16]}-{cand_id[:16]}-{key}.json"


def lookup_agreement(
    suite: OpenSuite, base_id: str, cand_id: str, run: Runtime, baseline_run: Runtime | None = None
) -> AgreementResult | None:
    p = agreement_path(suite, base_id, cand_id, run, baseline_run)
    fix = "delete it, and the next `quantize agree` (or `quantize gate`) measures it again"
    if (raw := checked_bytes(p, fix)) is None:
        return None
    found = records.loads(AgreementResult, raw, p)
    if (found.baseline_identity, found.candidate_identity) != (base_id, cand_id):
        raise UsageError(
            f"cached agreement {p} compares other checkpoints (baseline {found.baseline_identity[:16]}, candidate "
            f"{found.candidate_identity[:16]}; asked for {base_id[:16]}, {cand_id[:16]}); {fix}"
        )
    return found


def store_agreement(
    suite: OpenSuite, result: AgreementResult, run: Runtime, baseline_run: Runtime | None = None, replace: bool = True
) -> None:
    """An agreement entry sealed (`seal_record`: `replace=False` only where none is there yet)."""
    path = agreement_path(suite, result.baseline_identity, result.candidate_identity, run, baseline_run)
    seal_record(path, result, replace)


def sensitivity_key(suite: OpenSuite, model_id: str, measured: dict[str, Any]) -> str:
    """`measured`: what the search's sensitivities depend on besides the model and suite (its base recipe,
    options, unit, items per task, top-k, and the device kind and dtype the model ran in)."""
    return sha256_json(
        {
            "v": 3,  # 3: the installed libraries' versions, as the score and agreement keys hold them
            "agreement": AGREEMENT_REVISION,
            "model": model_id,
            "golden": suite.golden.manifest_sha256,
            "suite": suite.sha256,
            "libraries": library_versions(),
            **measured,
        }
    )


def sensitivity_path(key: str) -> Path:
    return cache_dir() / "search" / f"sensitivity-{key[:32]}.json"


def lookup_sensitivity(key: str) -> SensitivityRecord | None:
    """A search's sensitivities stored under `key`, checked as score and agreement entries are: sealed (its
    `.sha256` beside it; a file that does not hash to it is exit 2 naming it, one without it is measured again),
    and holding `key` itself (the file name keeps 32 of its characters: another entry copied over it is refused)."""
    p = sensitivity_path(key)
    fix = "delete it, and the next `quantize search` measures the sensitivities again"
    if (raw := checked_bytes(p, fix)) is None:
        return None
    found = records.loads(SensitivityRecord, raw, p)
    if found.key != key:
        raise UsageError(f"cached sensitivities {p} were stored under key {found.key[:16]}, not {key[:16]}; {fix}")
    return found


def store_sensitivity(record: SensitivityRecord) -> None:
    """A sensitivity entry sealed (`seal_record`)."""
    seal_record(sensitivity_path(record.key), record, True)


def _verdict_text(v: Verdict) -> tuple[str, Path]:
    """A verdict's JSON as a reader of its file gets it back (`to_json` of the record read from `to_json`'s bytes:
    one form whoever wrote the file, an indented copy or a re-dumped one alike), and where the cache keeps it."""
    text = records.to_json(records.loads(Verdict, records.to_json(v).encode("utf-8"), Path("the gate's verdict")))
    return text, content_path("verdicts", sha256_bytes(text.encode("utf-8")), ".json")


def file_side(v: Verdict) -> str | None:
    """Why a verdict is not a gate's own decision on two checkpoints, from its provenance: a side's scores read from a
    score file or lm-eval's samples named on the command line (whose numbers and identity are whatever the user
    wrote: another checkpoint's scores relabelled with the baseline's identity passed a rejected candidate), or a
    baseline whose origin the verdict does not record (written before the gate recorded it); None where both sides'
    evidence was computed here or read from the score cache under its trust model (docs/reliability.md)."""
    p = v.provenance
    for side, came, ours in (
        ("candidate", p.candidate_scores, ("computed", "cache")),
        ("baseline", p.baseline_scores, ("checkpoint",)),
    ):
        if came is None:
            return f"it does not record where the {side}'s scores came from (written before the gate said so)"
        if came not in ours:
            return f"the {side}'s scores came from a file named on the gate's command line"
    return None


def store_verdict(v: Verdict) -> None:
    """Keep a verdict the gate decided (quantize/flows/gate.py run_gate, after its blob check held): the one
    mark by which a gate.json read later is known for a gate's own decision and not a file anyone wrote
    (`holds_verdict`). Only a verdict on two checkpoints' evidence is kept (`file_side`): a gate over a score file
    the user named decides on the user's numbers, and is the user's claim, not the gate's. A cache that cannot be
    written keeps nothing: a gate.json of that verdict is then not taken as evidence (the report decides from
    cached scores or shows none; a sweep gates the candidate again)."""
    if file_side(v) is not None:
        return
    text, path = _verdict_text(v)
    try:
        if not path.is_file():
            write_text_atomic(path, text)
    except OSError:
        pass


def holds_verdict(v: Verdict) -> bool:
    """Whether a gate run with this cache decided exactly this verdict (`store_verdict`): its every field, the
    identities, policy, rules, evidence and outcome among them. A gate.json edited after the gate, written by
    hand, or copied from a machine whose cache this is not, is not held. The cache is what vouches: whoever can
    write it can also write the cached scores the report decides from (docs/reliability.md). A verdict over a
    score file the user named (`file_side`) is never held, whatever an older version kept in the cache."""
    if file_side(v) is not None:
        return False
    text, path = _verdict_text(v)
    data = text.encode("utf-8")
    if not path.exists():
        return False
    try:  # a regular file of those bytes: a FIFO or a larger file in its place holds nothing, and is not read
        return read_user_file(path, "cached verdict", len(data)) == data
    except (OSError, UsageError):
        return False
