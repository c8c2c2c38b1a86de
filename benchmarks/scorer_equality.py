"""Our scorer (`backend: quantize`, quantize/evaluate/lm.py) against lm-eval's stock HFLM (`backend: hf`), per item,
on shipped golden sets and one model (issue 45's equality table).

    python benchmarks/scorer_equality.py [--model ~/.cache/quantize/models/SmolLM2-135M-Instruct]
        [--sets core/v2 std/v1 ...] [--tasks core_kv core_facts ...] [--dtypes float32 bfloat16] [--limit N]
        [--floor | --floor-only] [--packed] [--jsonl OUT.jsonl] [--save DIR]

For each golden set and dtype, both scorers score every item (or the first --limit documents of each task) on the
CPU at batch size 16, through `quantize.evaluate.score.run_lm_eval` (the path `quantize eval` and the gate take).
Per task: the largest |Δ log-likelihood| over every item's numbers (each choice of a multiple-choice item, the
continuation of a greedy item, a document's sum), the items over 1e-4 nats, the items whose correctness differs
(score: right/wrong, is_greedy, exact match) with their ids, and for generation the responses that differ.
--floor also runs the stock scorer at batch size 1: the largest |Δ| between two stock runs (float32's noise floor
for lm-eval's own numbers) and the items whose correctness differs between them (bf16's floor for the
same-correctness figure); --floor-only runs the two stock runs alone. --model may be any checkpoint our loader
loads (a quantized one is scored through compressed-tensors' fake quantization, quantize/checkpoint/qdq.py, by
both scorers); each row says whether our scorer packed its rows (`ours_packed`, quantize/evaluate/lm.packs), and
--packed also scores with rows packed wherever the architecture allows (revision 6's rule, which ignored a
checkpoint's activation rounding) against stock (`packed_*` fields). --tasks: only these tasks of each set.
One JSON line per (set, dtype, task) goes to --jsonl as it is measured; --save DIR keeps every score document
(SET-DTYPE-SCORER.json, SCORER one of ours, stock, stock-b1, packed); a Markdown table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOL = 1e-4


def suite(tmp: Path, golden: str, dtype: str, backend: str, batch_size: int = 16, tasks: list[str] | None = None):
    from quantize.evaluate.suite import open_suite

    p = tmp / f"{golden.replace('/', '-')}-{dtype}-{backend}-b{batch_size}.yaml"
    p.write_text(
        f"golden: {ROOT / 'golden' / golden}\nbatch_size: {batch_size}\nseed: 0\nbackend: {backend}\n"
        f"dtype: {dtype}\ndevice: cpu\n" + (f"tasks: {json.dumps(tasks)}\n" if tasks else "")
    )
    return open_suite(p)


def set_tasks(golden: str, tasks: list[str] | None) -> list[str] | None:
    """Those of `tasks` the golden set has (None: all of its tasks)."""
    if not tasks:
        return None
    from quantize.golden.manifest import verify

    have = set(verify(ROOT / "golden" / golden).tasks)
    return [t for t in tasks if t in have] or sys.exit(f"{golden} has none of {tasks}")


def packed_anyway():
    """Our scorer with revision 6's rule: rows packed wherever the architecture allows, whatever the checkpoint
    rounds (quantize/evaluate/lm.rounds_activations read as False)."""
    from unittest import mock

    from quantize.evaluate import lm

    return mock.patch.object(lm, "rounds_activations", lambda config, modules=(): False)


def scored(s, model: Path, models, limit: int | None):
    from quantize.checkpoint.files import identity_sha256, weights_sha256
    from quantize.evaluate.score import run_lm_eval
    from quantize.records import CheckpointRef

    ref = CheckpointRef(path=str(model), weights_sha256=weights_sha256(model), identity_sha256=identity_sha256(model))
    samples = None
    if limit:
        sizes = {t: s.golden.manifest.files[s.golden.entry(t).data].items for t in s.tasks}
        samples = {t: list(range(min(limit, n))) for t, n in sizes.items()}
    t0 = time.perf_counter()
    doc = run_lm_eval(s, model, ref, models, samples=samples)
    return doc, time.perf_counter() - t0


def numbers(item: dict) -> list[float]:
    """An item's log-likelihoods: every choice's, else its continuation's or document's (none for generation)."""
    if item.get("lls"):
        return list(item["lls"])
    return [item["ll"]] if "ll" in item else []


def compare(ours: dict, stock: dict) -> dict:
    """Per-task comparison of two ScoreDocs' items (dumped)."""
    a = {i["id"]: i for i in ours["items"]}
    b = {i["id"]: i for i in stock["items"]}
    assert a.keys() == b.keys(), "the two scorers scored different items"
    deltas, over, wrong, responses = [], [], [], []
    for k in a:
        x, y = numbers(a[k]), numbers(b[k])
        d = max((abs(p - q) for p, q in zip(x, y, strict=True)), default=0.0)
        deltas.append(d)
        if d > TOL:
            over.append(k)
        if stock["output_type"] != "loglikelihood_rolling" and a[k]["score"] != b[k]["score"]:
            wrong.append(k)
        if "response" in a[k] and a[k]["response"] != b[k]["response"]:
            responses.append(k)
    return {
        "kind": stock["output_type"],
        "n": len(a),
        "max_abs_delta": max(deltas, default=0.0),
        "over_tol": len(over),
        "over_tol_ids": over[:10],
        "same_correctness": len(a) - len(wrong) if stock["output_type"] != "loglikelihood_rolling" else None,
        "differing_ids": wrong,
        "differing_responses": len(responses),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=Path("~/.cache/quantize/models/SmolLM2-135M-Instruct").expanduser())
    ap.add_argument("--sets", nargs="+", default=["pydoc/v1", "std/v1", "core/v1", "core/v2", "answers/v1"])
    ap.add_argument("--tasks", nargs="+", help="only these tasks of each set")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--limit", type=int, help="only the first N documents of each task")
    ap.add_argument("--floor", action="store_true", help="also stock at batch size 1: the float32 noise floor")
    ap.add_argument("--floor-only", action="store_true", help="only stock at batch sizes 16 and 1 against each other")
    ap.add_argument("--packed", action="store_true", help="also ours with rows packed by revision 6's rule")
    ap.add_argument("--jsonl", type=Path)
    ap.add_argument("--save", type=Path, help="keep every score document in this folder")
    args = ap.parse_args()
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.lm import packs

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for dtype in args.dtypes:
            models = LastModel()
            for golden in args.sets:
                tasks = set_tasks(golden, args.tasks)
                docs = {}
                if not args.floor_only:
                    docs["ours"] = scored(
                        suite(tmp, golden, dtype, "quantize", tasks=tasks), args.model, models, args.limit
                    )
                if args.packed:
                    with packed_anyway():
                        docs["packed"] = scored(
                            suite(tmp, golden, dtype, "quantize", tasks=tasks), args.model, models, args.limit
                        )
                docs["stock"] = scored(suite(tmp, golden, dtype, "hf", tasks=tasks), args.model, models, args.limit)
                if args.floor or args.floor_only:
                    docs["stock-b1"] = scored(
                        suite(tmp, golden, dtype, "hf", batch_size=1, tasks=tasks), args.model, models, args.limit
                    )
                if args.save:
                    args.save.mkdir(parents=True, exist_ok=True)
                    for name, (doc, _) in docs.items():
                        out = args.save / f"{golden.replace('/', '-')}-{dtype}-{name}.json"
                        out.write_text(doc.model_dump_json(indent=1) + "\n", encoding="utf-8")
                model, _ = models.get(args.model, dtype=dtype, on="cpu")
                packed = packs(model.config, "cpu", model.modules())
                head = {"model": args.model.name, "set": golden, "dtype": dtype, "ours_packed": packed}
                rows += compare_docs(docs, head)
                for row in rows[-len(docs["stock"][0].tasks) :]:
                    print(json.dumps(row), flush=True)
                    if args.jsonl:
                        with args.jsonl.open("a", encoding="utf-8") as f:
                            f.write(json.dumps(row) + "\n")
    print()
    print(table([r for r in rows if "max_abs_delta" in r]))


def compare_docs(docs: dict, head: dict) -> list[dict]:
    """One row per task: ours against stock (at batch 16), and each other scoring's largest |Δ|, items over 1e-4
    and items of another correctness against stock, under its own prefix (packed_, stock_floor_); with the floor,
    ours against stock at batch 1 too (ours_vs_b1_)."""
    theirs, t_theirs = docs["stock"]
    out = []
    for task in theirs.tasks:
        stock_t = theirs.tasks[task].model_dump()
        row = head | {"task": task}
        if "ours" in docs:
            row |= compare(docs["ours"][0].tasks[task].model_dump(), stock_t)
        if "packed" in docs:
            f = compare(docs["packed"][0].tasks[task].model_dump(), stock_t)
            row |= {f"packed_{k}": f[k] for k in ("max_abs_delta", "over_tol", "same_correctness", "differing_ids")}
        if "stock-b1" in docs:
            f = compare(docs["stock-b1"][0].tasks[task].model_dump(), stock_t)
            row["stock_floor_b1_b16"] = f["max_abs_delta"]
            row["stock_floor_over_tol"] = f["over_tol"]
            row["stock_floor_same_correctness"] = f["same_correctness"]
            row["stock_floor_differing_ids"] = f["differing_ids"]
            if "ours" in docs:  # ours against stock at batch 1 (no padding, as ours runs an item alone)
                f = compare(docs["ours"][0].tasks[task].model_dump(), docs["stock-b1"][0].tasks[task].model_dump())
                row |= {f"ours_vs_b1_{k}": f[k] for k in ("max_abs_delta", "over_tol", "same_correctness")}
        t_mine = docs["ours"][1] if "ours" in docs else None
        row |= {"seconds_ours": t_mine and round(t_mine, 1), "seconds_stock": round(t_theirs, 1)}
        out.append(row)
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| set | dtype | task | kind | items | max \\|Δ ll\\| (nats) | items > 1e-4 | same correctness "
        "| differing items |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        same = "-" if r["same_correctness"] is None else f"{r['same_correctness']}/{r['n']}"
        diff = ", ".join(r["differing_ids"][:10]) + (" …" if len(r["differing_ids"]) > 10 else "") or "none"
        lines.append(
            f"| {r['set']} | {r['dtype']} | {r['task']} | {r['kind']} | {r['n']} | {r['max_abs_delta']:.2e} | "
            f"{r['over_tol']} | {same} | {diff} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
