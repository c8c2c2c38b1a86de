"""A gate's verdict in the candidate's model card (README.md): Hugging Face's `model-index` results in the front
matter, written with huggingface_hub's `EvalResult` and `ModelCardData`, and a human section with the verdict
table, the policy and the provenance.

One entry per accuracy and perplexity rule: task, dataset = the golden set's name and version (its manifest
sha256 as the dataset's revision), metric, the candidate's value, and under `args` the baseline's value, the
change, the rule's limit and outcome, and `source: quantize gate` (model-index has no field of its own for a
baseline; its `source` needs a URL, and the mark in `args` is how a later verdict finds the entries to replace).
Agreement rules (KL, top-1) compare two models and have no dataset score of the candidate alone, and a rule whose
figures are not finite has no number to publish: both appear in the human section only. The card is rewritten
whole and atomically; a card quantize wrote before keeps its text, and an
earlier verdict's section and results are replaced, not stacked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quantize.checkpoint.files import identity_sha256
from quantize.errors import UsageError
from quantize.gates.render import render_markdown
from quantize.io import write_text_atomic
from quantize.records import AccuracyResult, PerplexityResult, Verdict

CARD = "README.md"
BEGIN, END = "<!-- quantize gate: begin -->", "<!-- quantize gate: end -->"
SOURCE = "quantize gate"


def eval_results(v: Verdict) -> list[Any]:
    """The verdict's accuracy and perplexity rules as huggingface_hub EvalResults (module docstring)."""
    from huggingface_hub import EvalResult

    g = v.provenance.golden
    out = []
    for r in v.rules:
        if isinstance(r, AccuracyResult):
            e = r.evidence
            metric = r.metric or "acc"
            value, args = e.candidate, {"baseline": e.baseline, "delta": e.delta, "margin": e.margin}
        elif isinstance(r, PerplexityResult):
            e = r.evidence
            metric = r.metric or "perplexity"
            value = e.candidate_perplexity
            args = {"baseline": e.baseline_perplexity, "ratio": e.ratio, "max_ratio": e.max_ratio}
        else:
            continue
        if not all(math.isfinite(x) for x in (value, *args.values())):
            continue  # a non-finite figure is a regression the section shows; never a number in the front matter
        out.append(
            EvalResult(
                task_type="text-generation",
                task_name=r.task,
                dataset_type=g.name,
                dataset_name=f"{g.name}/{g.version} {r.task}",
                dataset_config=r.task,  # results group by (task type, dataset type, config, split, revision)
                dataset_revision=g.manifest_sha256,
                metric_type=metric,
                metric_name=f"{r.task} {metric}",
                metric_value=value,
                metric_args={**args, "verdict": r.verdict, "policy": v.policy, "source": SOURCE},
                verified=False,
            )
        )
    return out


def _body_without_verdict(text: str) -> str:
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head.rstrip() + "\n" + rest.split(END, 1)[1].lstrip("\n")
    return text


def add_verdict(checkpoint: Path, v: Verdict, verdict_path: str = "the verdict") -> Path:
    """Write the verdict `v` (read from `verdict_path`, which errors name) into the model card of `checkpoint`, the
    verdict's candidate (refused otherwise: the card would claim another checkpoint's results)."""
    from huggingface_hub import ModelCard, ModelCardData

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
    path = checkpoint / CARD
    card = ModelCard(path.read_text(encoding="utf-8")) if path.is_file() else ModelCard("---\n---\n")
    data = card.data.to_dict() if card.data else {}
    kept = [r for r in (ModelCardData(**data).eval_results or []) if (r.metric_args or {}).get("source") != SOURCE]
    data.pop("model-index", None)
    data.pop("eval_results", None)
    label = data.get("model_name") or checkpoint.name
    data.update(model_name=label, eval_results=kept + eval_results(v))
    body = _body_without_verdict(card.text).rstrip()
    section = "\n".join(
        [BEGIN, f"## Quality gate: {v.verdict}", "", f"Policy `{v.policy}`.", "", render_markdown(v).rstrip(), END]
    )
    text = f"---\n{ModelCardData(**data).to_yaml()}\n---\n\n{body}\n\n{section}\n"
    write_text_atomic(path, text)
    return path
