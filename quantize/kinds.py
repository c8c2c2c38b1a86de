"""The output kinds a golden-set task can have (lm-eval's `output_type`), in one registry: each kind's records, how
an item is read from lm-eval's sample, the task summary, the baseline's margin on an item (the sequential gate's
stratum), the metrics a rule may name, the metrics an item's score is, its headline figure for display (`headline`:
none where an item is not finite), and the template `golden new` writes a user's items of (its `--type` name, the
JSONL fields, the lm-eval task config). Evaluation, gates, `golden new`, the CLI and the report read what a kind is
here; adding a kind touches this module and its records (quantize/records/scores.py). What lm-eval does with a
kind's requests is lm-eval's: the agreement measure (evaluate/agreement.py) reads lm-eval's request types, and
`golden verify` checks a multiple-choice task's answers against its choices (golden/manifest.py); a kind that needs
either adds it there.

    multiple_choice        score = acc (0/1): the gold choice has the highest log-likelihood; lls of every choice
    loglikelihood          score = 1 if the target is the greedy continuation; ll = log p(target | context)
    loglikelihood_rolling  ll = log p(document), with its words and bytes (perplexity is per document)
    generate_until         score = exact match (0/1) of the greedy response after the task's first filter

Every item also keeps lm-eval's per-item values of the task's other metrics (`item_metrics`: acc_norm, the exact
match after each filter pipeline, named as `metric_name` says), and an accuracy rule may name any of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from quantize.records import (
    ChoiceItem,
    ChoiceTask,
    DocumentItem,
    GenerationItem,
    GenerationTask,
    GreedyItem,
    GreedyTask,
    RollingTask,
    TaskScores,
    non_finite_items,
)


@dataclass(frozen=True)
class Headline:
    """The figure a kind is shown by: its name, value and standard error (None: none is estimated). A task whose
    items hold NaN or infinity has none (`headline`): value NaN, no SE, and `non_finite` of its `n` items."""

    metric: str
    value: float
    se: float | None
    higher_is_better: bool
    non_finite: int = 0  # items holding NaN or infinity: the figure is no score
    n: int = 0  # the task's items (set where non_finite is)

    def text(self, spec: str = ".4f") -> str:
        """The value as `spec` formats it, or "non-finite (k of n items)"."""
        return f"non-finite ({self.non_finite} of {self.n} items)" if self.non_finite else format(self.value, spec)


# lm-eval's metrics of a rolling-perplexity task, as every golden set writes them
ROLLING_METRICS: list[dict[str, Any]] = [
    {"metric": m, "aggregation": agg, "higher_is_better": False}
    for m, agg in (
        ("word_perplexity", "weighted_perplexity"),
        ("byte_perplexity", "weighted_perplexity"),
        ("bits_per_byte", "bits_per_byte"),
    )
]
_ACC = {"metric": "acc", "aggregation": "mean", "higher_is_better": True}


@dataclass(frozen=True)
class Template:
    """How `golden new --type NAME` writes a user's items of a kind: the JSONL fields of one item (the checks are
    golden/new.py's) and the lm-eval task config of the set, from the generation settings (`regex`, `stop`,
    `max_gen_toks`), which only a kind with `generation` takes (`golden new --regex/--stop/--max-gen-toks`)."""

    name: str
    fields: tuple[str, ...]
    config: Callable[[str | None, list[str], int], dict[str, Any]]
    generation: bool = False


@dataclass(frozen=True)
class Kind:
    output_type: str
    task_record: type  # the ScoreDoc task record of this kind
    item_record: type  # its per-item record
    right_wrong: bool  # items score 0/1: accuracy rules, flips and McNemar apply
    metrics: tuple[str, ...]  # what a rule may name on a task of this kind
    scored_as: tuple[str, ...]  # the metrics an item's `score` is (the rest are its item_metrics)
    item: Callable[[dict[str, Any]], dict[str, Any]]  # an item's own fields from one lm-eval sample
    summary: Callable[[list[dict[str, Any]], str | None], dict[str, Any]]  # task figures from its items
    headline: Callable[[Any], Headline]  # from the task record as computed; shown through `headline(task)`
    margin: Callable[[Any], float | None] = lambda item: None  # the baseline's margin on an item (None: no stratum)
    one_filter: bool = False  # lm-eval writes a sample per filter pipeline: the first pipeline's are kept
    template: Template | None = None  # how `golden new` writes items of this kind (None: it does not)


def metric_name(metric: str, filt: str) -> str:
    """A per-item metric as rules name it: lm-eval's metric (`acc_norm`), after a filter pipeline other than
    lm-eval's default "none" joined to it by @ (`exact_match@strict-match`: lm-eval's "exact_match,strict-match")."""
    return metric if filt == "none" else f"{metric}@{filt}"


def item_metrics(samples: list[dict[str, Any]], own: tuple[str, ...] = ()) -> dict[str, float]:
    """One document's numeric per-item metric values over all its samples (lm-eval writes one per filter
    pipeline), but the kind's own metrics (`own`, already the item's score) under the "none" filter."""
    out = {}
    for s in samples:
        for m in s.get("metrics", []):
            v = s.get(m)
            if isinstance(v, bool | int | float) and not (s["filter"] == "none" and m in own):
                out[metric_name(m, s["filter"])] = float(v)
    return out


def _metric_means(items: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics = the mean of each per-item metric over the items that carry it."""
    names = sorted({m for i in items for m in i.get("metrics", {})})
    per = {m: [i["metrics"][m] for i in items if m in i.get("metrics", {})] for m in names}
    return {"metrics": {m: sum(v) / len(v) for m, v in per.items()}}


def _accuracy(items: list[dict[str, Any]]) -> dict[str, Any]:
    """acc = mean score; its binomial SE √(acc(1 − acc)/(n − 1)), None for a single item (no estimate)."""
    n = len(items)
    acc = sum(i["score"] for i in items) / n
    return {"acc": acc, "acc_se": math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else None}


def _choice_item(s: dict[str, Any]) -> dict[str, Any]:
    lls = [float(r[0]) for r in s["filtered_resps"]]
    return {"score": float(s["acc"]), "ll": lls[int(s["target"])], "lls": lls}


def _choice_summary(items: list[dict[str, Any]], _filt: str | None) -> dict[str, Any]:
    n = len(items)
    chance = sum(1 / len(i["lls"]) for i in items) / n
    return _accuracy(items) | {"chance": chance, "mean_ll": _mean_ll(items)} | _metric_means(items)


def _mean_ll(items: list[dict[str, Any]]) -> float:
    return sum(i["ll"] for i in items) / len(items)


def _choice_margin(item: ChoiceItem) -> float:
    """ℓ_gold − max_{j ≠ gold} ℓ_j: how far the baseline's right (or wrong) choice is from flipping."""
    gold = item.lls.index(item.ll)
    return abs(item.ll - max((x for j, x in enumerate(item.lls) if j != gold), default=-math.inf))


def _greedy_item(s: dict[str, Any]) -> dict[str, Any]:
    ll, greedy = s["filtered_resps"][0]
    return {"score": float(bool(greedy)), "ll": float(ll)}


def _greedy_summary(items: list[dict[str, Any]], _filt: str | None) -> dict[str, Any]:
    return _accuracy(items) | {"chance": 0.0, "mean_ll": _mean_ll(items)} | _metric_means(items)


def _greedy_margin(item: GreedyItem) -> float:
    """|logit p(target)| signed by the outcome: the target's log-odds, positive when the baseline is right."""
    logit = math.inf if item.ll >= 0 else item.ll - math.log(-math.expm1(item.ll))
    return logit if item.score >= 0.5 else -logit


def _rolling_item(s: dict[str, Any]) -> dict[str, Any]:
    r = s["filtered_resps"][0]
    ll = float(r[0] if isinstance(r, list | tuple) else r)
    text = s["arguments"][0][0]  # the document lm-eval scored (the task's doc_to_target)
    return {"score": ll, "ll": ll, "words": len(text.split()), "bytes": len(text.encode("utf-8"))}


def _rolling_summary(items: list[dict[str, Any]], _filt: str | None) -> dict[str, Any]:
    """bits per byte = −Σℓ / (Σ bytes · ln 2); word perplexity = exp(−Σℓ / Σ words)."""
    ll = sum(i["ll"] for i in items)
    nbytes, words = sum(i["bytes"] for i in items), sum(i["words"] for i in items)
    return {"bits_per_byte": -ll / nbytes / math.log(2), "word_perplexity": math.exp(-ll / words)}


def _generation_item(s: dict[str, Any]) -> dict[str, Any]:
    resps = s["filtered_resps"]
    response = resps if isinstance(resps, str) else resps[0]
    return {"score": float(s["exact_match"]), "response": str(response)[:200]}


def _generation_summary(items: list[dict[str, Any]], filt: str | None) -> dict[str, Any]:
    return _accuracy(items) | {"filter": filt} | _metric_means(items)


def _choice_config(_regex: str | None, _stop: list[str], _max: int) -> dict[str, Any]:
    return {
        "output_type": "multiple_choice",
        "doc_to_text": "question",
        "doc_to_choice": "choices",
        "doc_to_target": "answer",
        "metric_list": [dict(_ACC)],
    }


def _greedy_config(_regex: str | None, _stop: list[str], _max: int) -> dict[str, Any]:
    return {
        "output_type": "loglikelihood",
        "doc_to_text": "context",
        "doc_to_target": "target",
        "target_delimiter": "",
        "metric_list": [dict(_ACC), {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False}],
    }


def _rolling_config(_regex: str | None, _stop: list[str], _max: int) -> dict[str, Any]:
    return {
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "text",
        "metric_list": [dict(m) for m in ROLLING_METRICS],
    }


def _generation_config(regex: str | None, stop: list[str], max_gen_toks: int) -> dict[str, Any]:
    """Greedy generation until a stop sequence; exact match (case and outer spaces ignored) after `regex`."""
    steps: list[dict[str, Any]] = []
    if regex is not None:
        steps.append({"function": "regex", "regex_pattern": regex, "group_select": 0, "fallback": "[no match]"})
    steps.append({"function": "take_first"})
    return {
        "output_type": "generate_until",
        "doc_to_text": "prompt",
        "doc_to_target": "answer",
        "generation_kwargs": {"until": stop, "do_sample": False, "max_gen_toks": max_gen_toks},
        "filter_list": [{"name": "regex" if regex is not None else "raw", "filter": steps}],
        "metric_list": [
            {
                "metric": "exact_match",
                "aggregation": "mean",
                "higher_is_better": True,
                "ignore_case": True,
                "regexes_to_ignore": [r"^\s+", r"\s+$"],
            }
        ],
    }


KINDS: dict[str, Kind] = {
    k.output_type: k
    for k in (
        Kind(
            "multiple_choice",
            ChoiceTask,
            ChoiceItem,
            right_wrong=True,
            metrics=("acc",),
            scored_as=("acc",),
            item=_choice_item,
            summary=_choice_summary,
            headline=lambda d: Headline("acc", d.acc, d.acc_se, True),
            margin=_choice_margin,
            template=Template("multiple_choice", ("question", "choices", "answer"), _choice_config),
        ),
        Kind(
            "loglikelihood",
            GreedyTask,
            GreedyItem,
            right_wrong=True,
            metrics=("acc", "perplexity"),
            scored_as=("acc",),
            item=_greedy_item,
            summary=_greedy_summary,
            headline=lambda d: Headline("acc", d.acc, d.acc_se, True),
            margin=_greedy_margin,
            template=Template("greedy", ("context", "target"), _greedy_config),
        ),
        Kind(
            "loglikelihood_rolling",
            RollingTask,
            DocumentItem,
            right_wrong=False,
            metrics=("perplexity", "word_perplexity", "byte_perplexity"),
            scored_as=(),
            item=_rolling_item,
            summary=_rolling_summary,
            headline=lambda d: Headline("bits/byte", d.bits_per_byte, None, False),
            template=Template("perplexity", ("text",), _rolling_config),
        ),
        Kind(
            "generate_until",
            GenerationTask,
            GenerationItem,
            right_wrong=True,
            metrics=("acc", "exact_match"),
            scored_as=("acc", "exact_match"),
            item=_generation_item,
            summary=_generation_summary,
            headline=lambda d: Headline(metric_name("exact_match", d.filter), d.acc, d.acc_se, True),
            one_filter=True,
            template=Template("generate", ("prompt", "answer"), _generation_config, generation=True),
        ),
    )
}
OUTPUT_TYPES = tuple(KINDS)


def kind_of(task: TaskScores) -> Kind:
    return KINDS[task.output_type]


def headline(task: TaskScores) -> Headline:
    """A task's headline figure, as every display, report and card shows it: its kind's, or none where an item holds
    NaN or infinity (a broken checkpoint): lm-eval's argmax over NaN log-likelihoods picks the first choice, so
    its accuracy (1.0 where the gold is the first) is no score. The records keep what was computed."""
    h = kind_of(task).headline(task)
    if bad := non_finite_items(task):
        return replace(h, value=math.nan, se=None, non_finite=len(bad), n=task.n)
    return h


def kind_of_item(item: object) -> Kind | None:
    return next((k for k in KINDS.values() if type(item) is k.item_record), None)


def templates() -> dict[str, Kind]:
    """The kinds `golden new` writes items of, by their template's name (its `--type`), in registry order."""
    return {k.template.name: k for k in KINDS.values() if k.template is not None}


def kinds_for(metric: str) -> tuple[str, ...]:
    """The output types a rule naming `metric` applies to."""
    return tuple(t for t, k in KINDS.items() if metric in k.metrics)
