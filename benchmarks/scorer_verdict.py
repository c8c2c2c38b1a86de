"""A gate's verdict under our scorer and under lm-eval's stock HFLM, and the items that make them differ.

    python benchmarks/scorer_verdict.py BASELINE CANDIDATE [CANDIDATE ...] [--policy gates/ci.yaml]
        [--backends quantize hf] [--hf-batch-size N] [--cache DIR] [--out DIR] [--json OUT.json]

For each backend, `quantize.flows.gate.run_gate` (what `quantize gate POLICY --baseline B --candidate C` runs)
gates every candidate with the policy as written (`quantize`: the policy's own suite, our scorer) or with a copy
of it whose suite differs only in `backend:` (`hf`: lm-eval's stock HFLM scores both sides), sequential design
included. --hf-batch-size sets the copy's `batch_size:` too: 1 gives stock HFLM's per-item scores (each request
its own unpadded pass, what an item scores alone); the suite's own (16) pads requests into shared batches, which
moves an activation-quantized model's scores with its neighbours. The score cache is --cache (default: a
temporary folder): each backend scores the baseline once, in full, and every candidate is scored afresh in its
stages. --out keeps, per candidate and backend, the verdict
(NAME.BACKEND.gate.json), the candidate's staged items (NAME.BACKEND.staged.json) and the baseline's full scores
(baseline.BACKEND.json).

Then, per candidate, the two verdicts side by side: each rule's verdict, estimate and bounds, and per task the
items both gates scored: the candidate's items whose correctness differs between the two scorers (ids, and
which way), the baseline's likewise, and the items one gate drew that the other did not (the sequential design
draws by the baseline's margins, which each scorer computes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def policy_for(policy: Path, backend: str, tmp: Path, batch_size: int | None = None) -> Path:
    """The policy itself for the suite's own backend, else a copy whose suite differs only in `backend:` (and
    `batch_size:` where one is given)."""
    import yaml

    from quantize.evaluate.suite import open_suite
    from quantize.gates.policy import load_policy

    pol = load_policy(policy)
    spec = yaml.safe_load(Path(pol.suite).read_text())
    if spec.get("backend", "quantize") == backend and batch_size is None:
        return policy
    spec["golden"] = open_suite(pol.suite).golden.path.as_posix()
    spec["backend"] = backend
    if batch_size is not None:
        spec["batch_size"] = batch_size
    suite = tmp / f"suite-{backend}.yaml"
    suite.write_text(yaml.safe_dump(spec))
    raw = yaml.safe_load(policy.read_text()) | {"suite": str(suite)}
    out = tmp / f"policy-{backend}.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def recording(last: dict):
    """Staged.score, recording what it returned last per checkpoint (every item scored, all stages)."""
    from quantize.evaluate import score

    inner = score.Staged.score

    def wrapped(self, ids):
        doc = inner(self, ids)
        last[str(self.ckpt)] = doc
        return doc

    return wrapped


def rules(v) -> dict:
    out = {}
    for r in v.rules:
        e = r.evidence.model_dump() if r.evidence is not None else {}
        keep = ("n", "delta", "ratio", "value", "lower_bound", "upper_bound", "flips_right_to_wrong")
        keep += ("flips_wrong_to_right", "margin", "max_ratio")
        out[r.rule] = {"verdict": r.verdict, "look": r.look, **{k: e[k] for k in keep if k in e}}
    return out


def right(item: dict):
    """An item's correctness (accuracy-like kinds), else its log-likelihood (documents)."""
    return item["score"] if "score" in item else item.get("ll")


def item_diff(a, b, base_a, base_b) -> dict:
    """Per task: the candidate's and the baseline's items whose correctness differs between scorers a and b,
    among the items both gates scored; and the items only one of them scored."""
    out = {}
    for task in sorted(set(a.tasks) | set(b.tasks)):
        ia = {i.id: i.model_dump() for i in a.tasks[task].items} if task in a.tasks else {}
        ib = {i.id: i.model_dump() for i in b.tasks[task].items} if task in b.tasks else {}
        ba = {i.id: i.model_dump() for i in base_a.tasks[task].items}
        bb = {i.id: i.model_dump() for i in base_b.tasks[task].items}
        both = sorted(ia.keys() & ib.keys())
        row = {"scored_a": len(ia), "scored_b": len(ib), "both": len(both)}
        row["only_a"], row["only_b"] = sorted(ia.keys() - ib.keys()), sorted(ib.keys() - ia.keys())
        if task in a.tasks and a.tasks[task].output_type == "loglikelihood_rolling":
            row["max_abs_delta_ll"] = max((abs(ia[k]["ll"] - ib[k]["ll"]) for k in both), default=0.0)
        else:
            row["candidate_flips"] = [[k, right(ia[k]), right(ib[k])] for k in both if right(ia[k]) != right(ib[k])]
            row["baseline_flips"] = [[k, right(ba[k]), right(bb[k])] for k in both if right(ba[k]) != right(bb[k])]
        out[task] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline", type=Path)
    ap.add_argument("candidates", type=Path, nargs="+")
    ap.add_argument("--policy", type=Path, default=ROOT / "gates" / "ci.yaml")
    ap.add_argument("--backends", nargs="+", default=["quantize", "hf"], choices=["quantize", "hf"])
    ap.add_argument("--hf-batch-size", type=int, help="the hf copy's batch_size (1: stock per-item scores)")
    ap.add_argument("--cache", type=Path, help="the score cache (default: a temporary folder)")
    ap.add_argument("--out", type=Path, help="keep verdicts, staged items and the baseline's scores here")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["QUANTIZE_CACHE"] = str((args.cache or tmp / "cache").expanduser().resolve())
        from quantize import records
        from quantize.checkpoint.files import identity_sha256
        from quantize.evaluate import cache, score
        from quantize.flows.gate import open_policy, run_gate

        last: dict = {}
        score.Staged.score = recording(last)
        got: dict = {}
        for backend in args.backends:
            pol = policy_for(args.policy, backend, tmp, args.hf_batch_size if backend == "hf" else None)
            _, suite = open_policy(pol)
            for c in args.candidates:
                v = run_gate(pol, args.baseline, c)
                base = cache.lookup_scores(suite, identity_sha256(args.baseline), score.runtime(suite, False))
                got[(str(c), backend)] = (v, last.get(str(c)), base)
                print(json.dumps({"candidate": str(c), "backend": backend, "verdict": v.verdict}), flush=True)
                if args.out:
                    args.out.mkdir(parents=True, exist_ok=True)
                    records.write(args.out / f"{c.name}.{backend}.gate.json", v)
                    if last.get(str(c)) is not None:
                        records.write(args.out / f"{c.name}.{backend}.staged.json", last[str(c)])
                    if base is not None:
                        records.write(args.out / f"baseline.{backend}.json", base)
        rows = []
        for c in args.candidates:
            row = {"candidate": str(c)}
            for backend in args.backends:
                v = got[(str(c), backend)][0]
                scored = v.sequential.items_scored if v.sequential is not None else None
                row[backend] = {"verdict": v.verdict, "rules": rules(v), "items_scored": scored}
            if len(args.backends) == 2:
                (_, a, base_a), (_, b, base_b) = (got[(str(c), k)] for k in args.backends)
                if a is not None and b is not None and base_a is not None and base_b is not None:
                    row["items"] = item_diff(a, b, base_a, base_b)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "policy": str(args.policy),
                    "backends": args.backends,
                    "hf_batch_size": args.hf_batch_size,
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
