"""Per-item score differences that come from how items are batched, not from the checkpoint: one checkpoint scored
in full at the suite's batch size, in full at another batch size, and in the gate's stages.

    python benchmarks/batch_variance.py BASELINE CHECKPOINT [--policy gates/ci.yaml] [--batch 8]
        [--staged NAME.staged.json] [--json OUT]

lm-eval sorts a run's requests by length (over every task of the run) and cuts them into batches, so the same item
meets other neighbours, other padding and so other matrix shapes when the run holds other items: in a run at
another batch size, and in the gate's stages (each stage is one lm-eval run of the items not scored before,
quantize/evaluate/score.py `Staged`). On a CPU those shapes change the order of float sums; where activations are
quantized, a last-bit change upstream can cross a rounding boundary.

Scored here, all through the score cache: the full run at the suite's batch size and at --batch (the suite copied
with that batch size: another cache key; --batch 0 skips it), and the staged run: --staged (what benchmarks/gate_time.py
--save-staged recorded of a real gate), or else every look of the policy's plan for every rule task, scored in
stages as a gate that never stops early would (quantize/gates/sequential.py `plan`). Per task and pair of runs:
items in both, items whose 0/1 score differs each way, the largest |Δ log-likelihood| and the share of items with
any |Δll| > 1e-4; per document task the perplexity ratio. `flip_rates` (per task: P(right→wrong | right) and
P(wrong→right | wrong) between the full run and the staged one) feed benchmarks/gate_sim.py --staged-noise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def batch_copy(suite, batch: int, out: Path) -> Path:
    """The suite's file with another batch size and its golden path absolute (the copy lives elsewhere)."""
    import yaml

    data = yaml.safe_load(Path(suite.path).read_text())
    data.update(batch_size=batch, golden=str(Path(suite.golden.path).resolve()), name=f"{suite.suite.name}-b{batch}")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def max_dll(x, y) -> float:
    """The largest |Δ log-likelihood| of one item: over every choice of a choice item, else its ll."""
    a, b = getattr(x, "lls", None), getattr(y, "lls", None)
    if a is not None and b is not None:
        return max(abs(u - v) for u, v in zip(a, b, strict=True))
    return abs(x.ll - y.ll)


def compare(a, b) -> dict:
    """Task by task, run a against run b over the items both scored."""
    rows = {}
    for task, ta in a.tasks.items():
        if task not in b.tasks:
            continue
        by_id = {i.id: i for i in b.tasks[task].items}
        pairs = [(i, by_id[i.id]) for i in ta.items if i.id in by_id]
        if not pairs:
            continue
        d = [max_dll(x, y) for x, y in pairs]
        row = {"n": len(pairs), "max_abs_dll": max(d), "share_dll_over_1e-4": sum(v > 1e-4 for v in d) / len(d)}
        if hasattr(pairs[0][0], "words"):
            lla, llb = sum(x.ll for x, _ in pairs), sum(y.ll for _, y in pairs)
            row["ppl_ratio"] = math.exp(-(llb - lla) / sum(x.words for x, _ in pairs))
        else:
            right = [x for x, _ in pairs if x.score > 0.5]
            row |= {
                "right_to_wrong": sum(x.score > 0.5 >= y.score for x, y in pairs),
                "wrong_to_right": sum(y.score > 0.5 >= x.score for x, y in pairs),
                "right": len(right),
                "wrong": len(pairs) - len(right),
            }
            row["flip_rate"] = (row["right_to_wrong"] + row["wrong_to_right"]) / len(pairs)
        rows[task] = row
    return rows


def staged_scores(policy, suite, base, ckpt: Path):
    """Every look of the policy's plan for every rule task, in stages, as a gate that never stops early."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.score import Staged
    from quantize.gates import sequential as sq

    tasks = sq.rule_tasks(policy)
    plans = sq.plan(policy.sequential, base, tasks, base.provenance.seed)
    staged = Staged(suite, ckpt, {t: [i.id for i in base.tasks[t].items] for t in tasks}, LastModel(False))
    doc = None
    for k in range(len(policy.sequential.looks)):
        doc = staged.score({t: plans[t].draws[k] for t in tasks})
    return doc, staged.calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline", type=Path)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--policy", default=str(ROOT / "gates" / "ci.yaml"))
    ap.add_argument("--batch", type=int, default=8, help="the other batch size of a full run (0: none)")
    ap.add_argument("--staged", type=Path, help="a staged ScoreDoc from benchmarks/gate_time.py --save-staged")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from quantize import records
    from quantize.evaluate.score import score
    from quantize.evaluate.suite import open_suite
    from quantize.flows.gate import open_policy

    policy, suite = open_policy(args.policy)
    base, _ = score(suite, args.baseline)
    full, cached = score(suite, args.checkpoint)
    print(f"full b{suite.suite.batch_size}: {full.wall_seconds} s{' (cached)' if cached else ''}", flush=True)
    other = None
    if args.batch:
        with tempfile.TemporaryDirectory() as tmp:
            batched = open_suite(batch_copy(suite, args.batch, Path(tmp) / "suite.yaml"))
            other, cached = score(batched, args.checkpoint)
        print(f"full b{args.batch}: {other.wall_seconds} s{' (cached)' if cached else ''}", flush=True)
    calls = None
    if args.staged:
        staged = records.read(records.ScoreDoc, args.staged)
        calls_file = args.staged.with_name(args.staged.name.replace(".staged.json", ".calls.json"))
        calls = json.loads(calls_file.read_text()) if calls_file.is_file() else None
    else:
        staged, calls = staged_scores(policy, suite, base, args.checkpoint)
    print(f"staged: {staged.wall_seconds} s, runs {calls}", flush=True)
    out = {
        "checkpoint": str(args.checkpoint),
        "suite": str(suite.path),
        "dtype": full.provenance.dtype,
        "batch_size": suite.suite.batch_size,
        "other_batch_size": args.batch or None,
        "staged_runs": calls,
        "seconds": {
            "full": full.wall_seconds,
            "other_batch": other.wall_seconds if other else None,
            "staged": staged.wall_seconds,
        },
        "full_vs_other_batch": compare(full, other) if other else None,
        "full_vs_staged": compare(full, staged),
    }
    out["flip_rates"] = {
        t: {
            "right_to_wrong": r["right_to_wrong"] / max(r["right"], 1),
            "wrong_to_right": r["wrong_to_right"] / max(r["wrong"], 1),
        }
        for t, r in out["full_vs_staged"].items()
        if "right" in r
    }
    for name in ("full_vs_other_batch", "full_vs_staged"):
        print(name)
        for t, r in (out[name] or {}).items():
            flips = (
                f"flips {r['right_to_wrong']:>3} r->w {r['wrong_to_right']:>3} w->r ({100 * r['flip_rate']:.2f}%)"
                if "right" in r
                else f"ppl ratio {r['ppl_ratio']:.5f}"
            )
            print(
                f"  {t:<14} n {r['n']:>5}  {flips:<40} max|dll| {r['max_abs_dll']:.2e}  "
                f"|dll|>1e-4 {100 * r['share_dll_over_1e-4']:.1f}%"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
