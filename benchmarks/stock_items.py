"""A candidate's items scored by lm-eval's stock HFLM at batch size 1 (each request its own unpadded pass: stock
per-item scores), restricted to the items a saved gate scored, and compared with that gate's own per-item scores.

    python benchmarks/stock_items.py POLICY BASELINE CANDIDATE STAGED.json [--out STOCK.json] [--json CMP.json]

STAGED.json: the candidate's items as a gate scored them (benchmarks/scorer_verdict.py --out writes
NAME.quantize.staged.json). The suite is the policy's with `backend: hf` and `batch_size: 1`; its items are
scored through the same staged scorer a gate uses (quantize/evaluate/score.Staged, the baseline's document
order from BASELINE's cached scores under the policy's own suite, QUANTIZE_CACHE). Prints per task: items, items
whose correctness differs (ids), the largest |Δ log-likelihood| over items (documents: their rolling ll).
The gate's accuracy rules read per-item correctness and its perplexity rule the documents' ll, so where no item
differs, the candidate's side of the verdict is the same under either scorer's per-item scores.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("policy", type=Path)
    ap.add_argument("baseline", type=Path)
    ap.add_argument("candidate", type=Path)
    ap.add_argument("staged", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from scorer_verdict import policy_for

    from quantize import records
    from quantize.checkpoint.files import identity_sha256
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate import cache, score
    from quantize.flows.gate import open_policy

    ours = records.read(records.ScoreDoc, args.staged)
    _, own = open_policy(args.policy)
    base = cache.lookup_scores(own, identity_sha256(args.baseline), score.runtime(own, False))
    if base is None:
        sys.exit(f"{args.baseline}: no cached scores under {args.policy}'s suite in QUANTIZE_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        _, suite = open_policy(policy_for(args.policy, "hf", Path(tmp), 1))
        order = {t: [i.id for i in base.tasks[t].items] for t in ours.tasks}
        staged = score.Staged(suite, args.candidate, order, LastModel(False))
        t0 = time.time()
        stock = staged.score({t: [i.id for i in d.items] for t, d in ours.tasks.items()})
        seconds = time.time() - t0
    if args.out:
        records.write(args.out, stock)
    rows = {}
    for task, d in sorted(ours.tasks.items()):
        a = {i.id: i.model_dump() for i in d.items}
        b = {i.id: i.model_dump() for i in stock.tasks[task].items}
        row = {"items": len(a), "stock_items": len(b)}
        if d.output_type == "loglikelihood_rolling":
            row["max_abs_delta_ll"] = max(abs(a[k].get("ll", a[k]["score"]) - b[k].get("ll", b[k]["score"])) for k in a)
        else:
            row["differing"] = [[k, a[k]["score"], b[k]["score"]] for k in sorted(a) if a[k]["score"] != b[k]["score"]]
        rows[task] = row
        print(json.dumps({"task": task, **row}), flush=True)
    out = {"candidate": str(args.candidate), "policy": str(args.policy), "seconds": round(seconds, 1), "tasks": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
