"""A gate's verdict in the candidate's model card (README.md): Hugging Face's `model-index` results in the front
matter, written with huggingface_hub's `EvalResult` and `ModelCardData`, and a human section with the verdict
table, the policy and the provenance.

One entry per rule that decided the verdict. An accuracy or perplexity rule: task, dataset = the golden set's name
and version (its manifest sha256 as the dataset's revision), metric, the candidate's value, and under `args` the
baseline's value, the change, the rule's limit and outcome, and `source: quantize gate` (model-index has no field
of its own for a baseline; its `source` needs a URL, and the mark in `args` is how a later verdict finds the entries
to replace). An agreement rule (mean KL, top-1, Σ min(p, q) against the baseline) has the golden set's prompts as
its dataset (config `agreement`), the measured value, and under `args` its bounds, limit and outcome and the
baseline's identity. A rule whose figures are not finite has no number to publish, nor has a rule the gate marked
`non_finite` (the candidate computes NaN on its task's items: lm-eval's argmax over NaN log-likelihoods picks the
first choice, so its accuracy, 1.0 where the gold is first, is finite and no score), and a rule never tested has
none: these appear in the human section only, as the regression the verdict says they are (the card is written,
not refused: a rejected verdict is one to publish). The card is rewritten whole and atomically; a card quantize wrote
before keeps its text, and an earlier verdict's section and results are replaced, not stacked.

What is read: README.md only as a regular file inside the checkpoint (a symbolic link is refused, never followed:
a README linked to /proc/self/environ would copy the process's environment into the card), at most 1 MB, strictly
UTF-8; its front matter through the YAML loader every user file goes through (safe, no aliases, depth-limited:
quantize/config.py), which constructs no Python object, with YAML 1.1's booleans, as huggingface_hub reads it
(`inference: no` is false there, and stays false in the card written back). A card that cannot be read so, or
whose front matter is not a mapping huggingface_hub accepts, or whose body holds the gate's markers other than one
start marker before one end marker, is exit 2 naming the problem; `check_card` finds that before any scoring.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from quantize.checkpoint.files import identity_sha256
from quantize.config import parse_yaml
from quantize.errors import UsageError
from quantize.gates.render import render_markdown
from quantize.io import check_writable, decode_text, read_user_file, write_text_atomic
from quantize.records import AccuracyResult, AgreementRuleResult, PerplexityResult, Verdict
from quantize.tables import md_code

CARD = "README.md"
MAX_CARD_BYTES = 1_000_000
BEGIN, END = "<!-- quantize gate: begin -->", "<!-- quantize gate: end -->"
SOURCE = "quantize gate"
EMPTY_FRONT_MATTER = re.compile(r"^\s*---[ \t]*\r?\n---[ \t]*(\r?\n|$)")  # what earlier versions left in a body
AGREEMENT_NAMES = {"kl": "mean KL to the baseline", "top1": "top-1 agreement", "sum_min": "Σ min(p, q)"}


def eval_results(v: Verdict) -> list[Any]:
    """The verdict's rules as huggingface_hub EvalResults (module docstring)."""
    from huggingface_hub import EvalResult

    g = v.provenance.golden
    base_id = v.provenance.baseline.checkpoint.identity_sha256
    out = []
    for r in v.rules:
        dataset = {"dataset_type": g.name, "dataset_revision": g.manifest_sha256}
        if isinstance(r, AccuracyResult):
            e = r.evidence
            metric = r.metric or "acc"
            value, args = e.candidate, {"baseline": e.baseline, "delta": e.delta, "margin": e.margin}
        elif isinstance(r, PerplexityResult):
            e = r.evidence
            metric = r.metric or "perplexity"
            value = e.candidate_perplexity
            args = {"baseline": e.baseline_perplexity, "ratio": e.ratio, "max_ratio": e.max_ratio}
        elif isinstance(r, AgreementRuleResult):
            a = r.evidence
            metric, value = r.metric.value, a.value
            args = {"lower_bound": a.lower_bound, "upper_bound": a.upper_bound}
            args |= {"max": a.max} if a.max is not None else {"min": a.min}
        else:
            continue  # an untested rule has no figure
        if r.non_finite or not all(math.isfinite(x) for x in (value, *args.values())):
            continue  # a non-finite figure is a regression the section shows; never a number in the front matter
        if isinstance(r, AgreementRuleResult):  # the golden prompts, against the baseline (no task of its own)
            task = "agreement"
            dataset |= {"dataset_name": f"{g.name}/{g.version} prompts", "dataset_config": task}
            name = AGREEMENT_NAMES.get(metric, metric)
            extra = {"baseline_identity": base_id, "positions": r.evidence.positions}
        else:
            task, name, extra = r.task, f"{r.task} {metric}", {}
            # results group by (task type, dataset type, config, split, revision): one group per task
            dataset |= {"dataset_name": f"{g.name}/{g.version} {r.task}", "dataset_config": r.task}
        out.append(
            EvalResult(
                task_type="text-generation",
                task_name=task,
                **dataset,
                metric_type=metric,
                metric_name=name,
                metric_value=value,
                metric_args={**args, **extra, "verdict": r.verdict, "policy": v.policy, "source": SOURCE},
                verified=False,
            )
        )
    return out


def _body_without_verdict(text: str) -> str:
    """The card's body without the gate's section (its markers checked by `_check_markers`)."""
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head.rstrip() + "\n" + rest.split(END, 1)[1].lstrip("\n")
    return EMPTY_FRONT_MATTER.sub("", text.lstrip("\n"), count=1)


def _check_markers(body: str, path: Path) -> None:
    """The gate's section in a card's body is none, or one start marker with one end marker after it: anything else
    (a marker alone, two of one, the end first) leaves no section to replace, so it is exit 2 naming the card."""
    begins, ends = body.count(BEGIN), body.count(END)
    if (begins, ends) == (0, 0) or ((begins, ends) == (1, 1) and body.index(BEGIN) < body.index(END)):
        return
    if (begins, ends) == (1, 1):
        found = f"its end marker ({END}) before its start marker ({BEGIN})"
    else:
        found = f"{begins} start marker{'s' * (begins != 1)} ({BEGIN}) and {ends} end marker{'s' * (ends != 1)} ({END})"
    raise UsageError(
        f"the model card {path} holds {found}; the gate's section is one start marker, then one end marker, and "
        "the gate replaces what lies between them. Remove the stray marker lines (or the whole section: the gate "
        "writes it again)"
    )


def read_card(checkpoint: Path) -> tuple[dict[str, Any], str]:
    """The model card of `checkpoint` as (front matter, body); ({}, "") where it has none. Read as the module
    docstring says; every refusal is a UsageError naming the card and what to do."""
    from huggingface_hub import ModelCardData
    from huggingface_hub.repocard import REGEX_YAML_BLOCK  # split where the Hub splits a card

    path = Path(checkpoint) / CARD
    if not path.is_symlink() and not path.exists():
        return {}, ""
    fix = "replace it with a regular file (a link is never followed), or remove it: the gate writes the card"
    raw = read_user_file(path, "the model card", MAX_CARD_BYTES, follow_links=False, hint=fix)
    # a byte-order mark (some editors write one) is not part of the text: the front matter starts after it
    # CRLF lines are read as LF (the card is written with LF: a CRLF card kept a stray `\r` line: a review)
    text = decode_text(raw, f"the model card {path}").removeprefix("\ufeff").replace("\r\n", "\n")
    m = REGEX_YAML_BLOCK.search(text)
    _check_markers(text if m is None else text[m.end() :], path)
    if m is None:
        return {}, text
    origin = f"the front matter of the model card {path}"
    # blank lines before the block keep YAML's line numbers those of the file
    block = "\n" * text[: m.start(2)].count("\n") + m.group(2)
    try:
        data = parse_yaml(block.encode("utf-8"), origin, yaml11_booleans=True)  # huggingface_hub's reading
    except UsageError as e:  # aliases and depth are refused without naming the file
        raise UsageError(str(e) if origin in str(e) else f"{origin}: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        what = "a mapping with keys that are not text" if isinstance(data, dict) else f"a {type(data).__name__}"
        raise UsageError(
            f"{origin} is {what}; a model card's metadata is a mapping (`key: value` lines between the `---` lines). "
            "Fix or remove it"
        )
    try:  # huggingface_hub's own reading of the metadata, model-index included
        ModelCardData(**data)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise UsageError(
            f"{origin} is not metadata huggingface_hub can read ({str(e)[:300]}); fix its `model-index:` (or the "
            "field named), or remove it: the gate writes its own results there"
        ) from None
    return data, text[m.end() :]


def check_card(checkpoint: Path, what: str = "--card") -> None:
    """Before any scoring: the card of `checkpoint` can be read (`read_card`) and written; else exit 2 naming it."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise UsageError(f"{what} writes the candidate's model card, and {checkpoint} is no checkpoint folder")
    read_card(checkpoint)
    check_writable(checkpoint / CARD, what)


def add_verdict(checkpoint: Path, v: Verdict, verdict_path: str = "the verdict") -> Path:
    """Write the verdict `v` (read from `verdict_path`, which errors name) into the model card of `checkpoint`, the
    verdict's candidate (refused otherwise: the card would claim another checkpoint's results)."""
    from huggingface_hub import ModelCardData

    checkpoint = Path(checkpoint)
    want = v.provenance.candidate.checkpoint.identity_sha256
    if not checkpoint.is_dir():
        raise UsageError(f"{checkpoint} is not a checkpoint folder; pass the folder the verdict's candidate is in")
    if (got := identity_sha256(checkpoint)) != want:
        raise UsageError(
            f"{verdict_path} is the verdict of checkpoint {want[:12]}, and {checkpoint} is {got[:12]} (weights, config "
            "or tokenizer differ): its card would claim another checkpoint's results. Gate this checkpoint, or pass "
            "the folder that was gated"
        )
    data, body = read_card(checkpoint)
    read = ModelCardData(**data)
    kept = [r for r in (read.eval_results or []) if (r.metric_args or {}).get("source") != SOURCE]
    data.pop("model-index", None)
    data.pop("eval_results", None)
    label = read.model_name or checkpoint.name
    data.update(model_name=label, eval_results=(kept + eval_results(v)) or None)
    body = _body_without_verdict(body).rstrip()
    section = "\n".join(
        [
            BEGIN,
            f"## Quality gate: {v.verdict}",
            "",
            f"Policy {md_code(v.policy)}.",
            "",
            render_markdown(v).rstrip(),
            END,
        ]
    )
    text = f"---\n{ModelCardData(**data).to_yaml()}\n---\n\n" + (f"{body}\n\n" if body else "") + f"{section}\n"
    write_text_atomic(checkpoint / CARD, text)
    return checkpoint / CARD
