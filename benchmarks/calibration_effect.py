"""Calibration's effect on the default model: GPTQ W4A16 and AWQ, each calibrated three ways, each gated.

The shipped recipes (recipes/gptq-w4a16-g128.yaml, recipes/awq-g128.yaml) with only `calibration` changed: the
built-in text (builtin:jargon), the shipped chat set (builtin:jargon-chat: the same text as conversations, rendered
through the checkpoint's chat template) and an equal-weight mixture of both; every recipe records its vocabulary
overlap with golden/core/v2. Each of the six checkpoints is gated with gates/ci.yaml against the default model.

    python benchmarks/calibration_effect.py [--only gptq-builtin ...] [--outputs outputs/calibration_effect]

A cell whose checkpoint (quantize.json) or verdict (CELL.verdict.json) is already in --outputs is not redone, so the
cells can be run one at a time. Writes benchmarks/results/calibration_effect.json (the figures of every cell done)
and, once all six are done, the section "Calibration's effect" of docs/results.md. `table` and `noise` are pure
functions of that JSON (tests/test_calibration_effect.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
METHODS = {"gptq": "recipes/gptq-w4a16-g128.yaml", "awq": "recipes/awq-g128.yaml"}
SOURCES: dict[str, dict[str, Any]] = {
    "builtin": {"source": "builtin:jargon"},
    "chat": {"source": "builtin:jargon-chat"},
    "mixture": {"mixture": [{"source": "builtin:jargon", "weight": 1}, {"source": "builtin:jargon-chat", "weight": 1}]},
}
CELLS = [f"{m}-{s}" for m in METHODS for s in SOURCES]  # GPTQ's three first
POLICY = "gates/ci.yaml"
OVERLAP = "golden/core/v2"
TASKS = {"core_facts": "facts", "core_cloze": "cloze", "core_analogy": "analogy", "core_kv": "key-value"}
SECTION = "## Calibration's effect"


def recipe_for(cell: str) -> dict[str, Any]:
    """The shipped recipe of the cell's method with its calibration source replaced (samples, seq_len, seed kept)."""
    import yaml

    method, source = cell.split("-", 1)
    recipe = yaml.safe_load((ROOT / METHODS[method]).read_text())
    cal = {k: v for k, v in recipe["calibration"].items() if k not in ("source", "mixture")}
    recipe["calibration"] = {**SOURCES[source], **cal, "overlap_with": OVERLAP}
    recipe["name"] = f"{recipe['name']}-{source}"
    return recipe


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "quantize.cli", *args], cwd=ROOT, env=env, text=True, capture_output=True
    )


def run_cell(cell: str, outputs: Path, model: Path) -> None:
    """Convert (unless done) and gate (unless done) one cell; the verdict JSON is kept beside the checkpoint."""
    import yaml

    out = outputs / cell
    if not (out / "quantize.json").is_file():
        recipe = outputs / f"{cell}.yaml"
        recipe.write_text(yaml.safe_dump(recipe_for(cell), sort_keys=False))
        t0 = time.perf_counter()
        r = _cli("run", str(recipe), "--output", str(out), "--quiet", "--force")
        if r.returncode != 0:
            raise SystemExit(f"{cell}: quantize run exited {r.returncode}:\n{r.stderr[-3000:]}")
        print(f"{cell}: converted in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    verdict = outputs / f"{cell}.verdict.json"
    if not verdict.is_file():
        t0 = time.perf_counter()
        r = _cli("gate", POLICY, "--baseline", str(model), "--candidate", str(out), "--json", "--quiet")
        if r.returncode not in (0, 1):
            raise SystemExit(f"{cell}: quantize gate exited {r.returncode}:\n{r.stderr[-3000:]}")
        json.loads(r.stdout)  # a verdict, or no file
        tmp = verdict.with_suffix(".tmp")
        tmp.write_text(r.stdout)
        tmp.replace(verdict)
        print(f"{cell}: gated in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def calibration_only(cell: str, model: Path) -> dict[str, Any]:
    """A cell's quantize.json as far as its calibration goes, without converting: the record `quantize run` writes
    for the same recipe (build_calibration with the checkpoint's tokenizer), no bits."""
    from transformers import AutoTokenizer

    from quantize.convert.calibration import build_calibration
    from quantize.convert.recipe import Calibration

    cal = Calibration(**recipe_for(cell)["calibration"])
    record = build_calibration(AutoTokenizer.from_pretrained(str(model)), cal).record
    return {"calibration": record.model_dump(mode="json"), "bits": None}


def _bounded(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": value, "lower": lo, "upper": hi}


def collect(cell: str, run: dict[str, Any], verdict: dict[str, Any] | None) -> dict[str, Any]:
    """One cell's figures from its quantize.json and its verdict (both as plain JSON; None: not gated yet)."""
    method, source = cell.split("-", 1)
    cal = run["calibration"]
    rules: dict[str, Any] = {}
    for r in verdict["rules"] if verdict else []:
        ev = r.get("evidence")
        if r["kind"] == "untested":
            key, fig = r["task"], None
        elif r["kind"] == "accuracy":
            key, fig = r["task"], _bounded(ev["delta"], ev["lower_bound"], ev["upper_bound"])
        elif r["kind"] == "perplexity":
            key, fig = r["task"], _bounded(ev["ratio"], ev["lower_bound"], ev["upper_bound"])
        else:
            key, fig = r["metric"], _bounded(ev["value"], ev["lower_bound"], ev["upper_bound"])
        rules[key] = {"verdict": r["verdict"], "look": r.get("look"), **({"figure": fig} if fig else {})}
    seq = (verdict or {}).get("sequential") or {}
    overlap = cal.get("overlap") or {}
    return {
        "cell": cell,
        "method": method,
        "calibration": source,
        "source": cal["source"],
        "samples": cal["samples"],
        "seq_len": cal["seq_len"],
        "tokens": cal["tokens"],
        "documents": cal["documents_used"],
        "template_share": cal.get("chat_template_share"),
        "vocab_distinct_share": overlap.get("distinct_share"),
        "vocab_token_share": overlap.get("token_share"),
        "token_sha256": cal["token_sha256"],
        "bits_per_weight": run["bits"]["bits_per_weight"] if run["bits"] else None,
        "verdict": verdict["verdict"] if verdict else None,
        "items_scored": sum((seq.get("items_scored") or {}).values()),
        "rules": rules,
    }


def _fig(rule: dict[str, Any] | None, fmt: str, scale: float = 1.0) -> str:
    """A rule's figure as 'value [lower, upper]', with its outcome when it is not a pass; '-' when never tested."""
    if rule is None or "figure" not in rule:
        return "untested"
    f = rule["figure"]
    text = f"{f['value'] * scale:{fmt}} [{f['lower'] * scale:{fmt}}, {f['upper'] * scale:{fmt}}]"
    return text if rule["verdict"] == "pass" else f"{text} {'regr.' if rule['verdict'] == 'regression' else 'inc.'}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(cells: list[dict[str, Any]]) -> list[str]:
    """The Markdown table: one row per cell, in the order given."""
    head = (
        "| method | calibration | tokens (docs) | template share | golden vocab (distinct / tokens) | bits/weight | "
        "KL [bounds] | top-1 [bounds] | "
        + " | ".join(f"{t} Δ pts [bounds]" for t in TASKS.values())
        + " | prose ppl ratio [bounds] | verdict (items scored) |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        r = c["rules"]
        figures = [
            ("kl", ".3f", 1.0),
            ("top1", ".3f", 1.0),
            *((t, "+.1f", 100.0) for t in TASKS),
            ("core_prose", ".3f", 1.0),
        ]
        gated = " | ".join(_fig(r.get(k), f, x) if c["verdict"] else "-" for k, f, x in figures)
        verdict = f"**{c['verdict']}** ({c['items_scored']:,})" if c["verdict"] else "not gated"
        verdict = verdict if c["bits_per_weight"] is not None else "not converted"
        rows.append(
            f"| {c['method'].upper()} | {c['calibration']} | {c['tokens']:,} ({c['documents']}) | "
            f"{_share(c['template_share'])} | {_share(c['vocab_distinct_share'])} / {_share(c['vocab_token_share'])} | "
            f"{_num(c['bits_per_weight'], '.3f')} | {gated} | {verdict} |"
        )
    return rows


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["lower"] <= b["upper"] and b["lower"] <= a["upper"]


def noise(cells: list[dict[str, Any]]) -> list[str]:
    """For each method and each figure measured on more than one calibration: whether the sources' bounds overlap
    (the difference is within noise) or not (a difference the gate's evidence resolves)."""
    out = []
    for method in dict.fromkeys(c["method"] for c in cells):
        mine = [c for c in cells if c["method"] == method]
        for key, label in {"kl": "KL", "top1": "top-1", **TASKS, "core_prose": "prose perplexity ratio"}.items():
            have = [(c["calibration"], c["rules"][key]["figure"]) for c in mine if "figure" in c["rules"].get(key, {})]
            if len(have) < 2:
                continue
            apart = [f"{a} vs {b}" for i, (a, fa) in enumerate(have) for b, fb in have[i + 1 :] if not _overlap(fa, fb)]
            names = ", ".join(n for n, _ in have)
            out.append(
                f"- {method.upper()}, {label} ({names}): "
                + (f"bounds do not overlap for {'; '.join(apart)}" if apart else "bounds overlap: within noise")
            )
    return out


def update_docs(path: Path, body: str) -> None:
    """Replace (or append) the section SECTION of docs/results.md, written beside and renamed into place."""
    text = path.read_text(encoding="utf-8")
    section = f"{SECTION}\n\n{body.strip()}\n"
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("" if nxt < 0 else "\n" + text[nxt + 1 :])
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _verdict(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outputs", default=str(ROOT / "outputs" / "calibration_effect"))
    ap.add_argument("--only", nargs="*", choices=CELLS, default=CELLS)
    ap.add_argument("--collect-only", action="store_true", help="only gather what is done; convert and gate nothing")
    ap.add_argument(
        "--calibration-only",
        action="store_true",
        help="for cells not converted: what their calibration would see (tokenization only, no conversion)",
    )
    ap.add_argument("--docs", help="a Markdown file: the section's text, written into docs/results.md")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from quantize.checkpoint.loader import prepare_default_model

    outputs = Path(args.outputs)
    outputs.mkdir(parents=True, exist_ok=True)
    model = prepare_default_model()
    if not args.collect_only:
        for cell in args.only:
            run_cell(cell, outputs, model)
    os.chdir(ROOT)  # the recipes' relative paths (golden/core/v2)
    cells = []
    for c in CELLS:
        verdict = outputs / f"{c}.verdict.json"
        if (outputs / c / "quantize.json").is_file():
            run = json.loads((outputs / c / "quantize.json").read_text())
            cells.append(collect(c, run, json.loads(verdict.read_text()) if verdict.is_file() else None))
        elif args.calibration_only:
            cells.append(collect(c, calibration_only(c, model), None))
    results = ROOT / "benchmarks" / "results" / "calibration_effect.json"
    results.write_text(
        json.dumps({"measured": time.strftime("%Y-%m-%d"), "policy": POLICY, "cells": cells}, indent=2) + "\n"
    )
    print("\n".join(table(cells) + [""] + noise(cells)))
    if args.docs:
        update_docs(ROOT / "docs" / "results.md", Path(args.docs).read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
