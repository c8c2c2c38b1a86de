"""Time to a verdict with a cached baseline, the sequential and the fixed design, against one plain lm-eval run.

    python benchmarks/gate_time.py BASELINE CANDIDATE [CANDIDATE ...] [--policy gates/ci.yaml]
        [--baseline-cache ~/.cache/quantize] [--full-cache ~/.cache/quantize] [--plain C ...]
        [--backend quantize|hf]

--backend: the scorer of the gate's scoring (default: the policy's suite's own, `quantize` for the shipped ones);
`hf` scores through lm-eval's stock HFLM for comparison (a copy of the suite with only `backend:` changed: its
cache keys differ, so --baseline-cache must hold the baseline scored by that backend).

For each candidate, in a private cache folder (so the candidate is never cached; the baseline's scores and
top-k are copied in from --baseline-cache, or computed once):
1. sequential design: `quantize gate` with the policy as written (its `sequential:` section): agreement in looks
   of its own, then the candidate's items in stages until the verdict is settled. Timed end to end.
2. fixed design: the same policy without `sequential:`, every item scored and the agreement measured on every
   agreement item (timed apart: `agreement_seconds`). Timed end to end, unless --full-cache holds the candidate's
   full scores: then the verdict is decided from them, and the time is their recorded scoring wall time plus that
   agreement time (stated as such in the output).
3. plain lm-eval: one `simple_evaluate` of the candidate on the golden set's tasks, same batch size and device,
   for the candidates named by --plain: in float32 (the gate's numerics on a CPU), or with --plain-dtype auto as
   users call lm-eval (`--model hf` loads the checkpoint's own dtype, bf16 for these), the denominator of
   issue #25's goals (a pass at most 0.25 of it, a clear regression 0.05).
Prints one row per candidate and the ratios; --json writes them. --plain-only times step 3 alone (no gate);
--save-staged DIR keeps each candidate's staged items (NAME.staged.json, its runs NAME.calls.json) and verdict
(NAME.gate.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def copy_entries(src: Path, dst: Path, suite, baseline: Path) -> None:
    """Copy only the baseline's cache entries (its score file and stored top-k), never a candidate's."""
    from quantize.cache import digest_path
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache

    sha = identity_sha256(baseline)
    from quantize.evaluate.score import runtime

    run = runtime(suite, False, baseline)
    entry = cache.score_path(suite, sha, run)  # served only beside its digest: without it, re-scored
    topk = cache.baseline_topk_path(suite, sha, run)
    for target in [entry, digest_path(entry), topk, digest_path(topk)]:
        f = src / target.relative_to(dst)
        if not f.is_file():
            sys.exit(f"{f} is missing: score the baseline in {src} first (`quantize gate`), or drop --baseline-cache")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)


def plain_lm_eval(suite, candidate: str, tmp: Path, dtype: str = "float32") -> float:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from quantize.checkpoint import qdq
    from quantize.golden.manifest import lm_eval_tasks

    golden = suite.golden
    inc = lm_eval_tasks(golden, tmp / "tasks", ids=golden.manifest.smoke_ids if suite.suite.subset == "smoke" else None)
    t0 = time.perf_counter()
    with qdq.library_only():  # as users run it: compressed-tensors' own fake quantization, not our faster one
        simple_evaluate(
            model="hf",
            model_args={"pretrained": candidate, "dtype": dtype},
            tasks=suite.tasks,
            task_manager=TaskManager(include_path=str(inc), include_defaults=False),
            batch_size=suite.suite.batch_size,
            device="cpu",
            bootstrap_iters=0,
        )
    return time.perf_counter() - t0


def keep_staged(out: Path) -> None:
    """Record what each staged scorer returned last (every item it scored, in its stages' batches) under
    out/NAME.staged.json, for benchmarks/batch_variance.py."""
    from quantize import records
    from quantize.evaluate import score

    out.mkdir(parents=True, exist_ok=True)
    inner = score.Staged.score

    def recording(self, ids):
        doc = inner(self, ids)
        if not self.cached:
            records.write(out / f"{Path(self.ckpt).name}.staged.json", doc)
            (out / f"{Path(self.ckpt).name}.calls.json").write_text(json.dumps(self.calls) + "\n")
        return doc

    score.Staged.score = recording


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline")
    ap.add_argument("candidates", nargs="+")
    ap.add_argument("--policy", default=str(ROOT / "gates" / "ci.yaml"))
    ap.add_argument("--baseline-cache", type=Path, help="copy the baseline's cached scores and top-k from here")
    ap.add_argument("--full-cache", type=Path, help="a cache holding candidates' full scores (the fixed design)")
    ap.add_argument("--plain", nargs="*", default=[], help="candidates to time one plain lm-eval run of")
    ap.add_argument(
        "--plain-dtype", default="float32", choices=["float32", "auto"], help="auto: the checkpoint's own, as users run"
    )
    ap.add_argument(
        "--fixed-cached-only", action="store_true", help="no fixed-design run for candidates without full scores"
    )
    ap.add_argument("--save-staged", type=Path, help="write each candidate's staged items here (NAME.staged.json)")
    ap.add_argument("--plain-only", action="store_true", help="time only one plain lm-eval run of each candidate")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--backend", choices=["quantize", "hf"], help="the gate's scorer (default: the suite's)")
    args = ap.parse_args()
    if args.save_staged:
        keep_staged(args.save_staged)
    import yaml

    from quantize import records
    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite
    from quantize.gates.gate import decide
    from quantize.gates.policy import load_policy

    policy = load_policy(args.policy)
    if policy.sequential is None:
        sys.exit(f"{args.policy} has no `sequential:` section: nothing to compare with the fixed design")
    raw = yaml.safe_load(Path(args.policy).read_text())
    raw["suite"] = policy.suite
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.backend:  # the suite with its golden set's path resolved and only the backend changed
            spec = yaml.safe_load(Path(policy.suite).read_text())
            spec["golden"] = open_suite(policy.suite).golden.path.as_posix()
            spec["backend"] = args.backend
            raw["suite"] = str(tmp / Path(policy.suite).name)
            Path(raw["suite"]).write_text(yaml.safe_dump(spec))
        seq_pol, fixed_pol = tmp / "seq.yaml", tmp / "fixed.yaml"
        seq_pol.write_text(yaml.safe_dump(raw))
        fixed_pol.write_text(yaml.safe_dump({k: v for k, v in raw.items() if k != "sequential"}))
        suite = open_suite(raw["suite"])
        full = {}
        if args.full_cache:  # read before QUANTIZE_CACHE points at the private folder
            os.environ["QUANTIZE_CACHE"] = str(args.full_cache.expanduser())
            from quantize.evaluate.score import runtime

            full = {
                c: cache.lookup_scores(suite, identity_sha256(Path(c)), runtime(suite, False, Path(c)))
                for c in args.candidates
            }
            base = Path(args.baseline)
            base_full = cache.lookup_scores(suite, identity_sha256(base), runtime(suite, False, base))
        from quantize.evaluate.agreement import agreement_scores
        from quantize.flows.gate import run_gate

        for c in args.candidates:
            private = tmp / f"cache-{len(rows)}"
            os.environ["QUANTIZE_CACHE"] = str(private)
            if args.plain_only:
                seconds = plain_lm_eval(suite, c, private, args.plain_dtype)
                rows.append({"candidate": c, "plain_seconds": round(seconds, 1), "plain_dtype": args.plain_dtype})
                print(json.dumps(rows[-1]), flush=True)
                continue
            if args.baseline_cache:
                copy_entries(args.baseline_cache.expanduser().resolve(), private, suite, Path(args.baseline))
            t0 = time.perf_counter()
            v = run_gate(seq_pol, args.baseline, c)  # agreement in looks of its own, measured by the gate itself
            t_seq = time.perf_counter() - t0
            if args.save_staged:
                records.write(args.save_staged / f"{Path(c).name}.gate.json", v)
            has_full = full.get(c) is not None and base_full is not None
            agreement, t_agree = None, None
            if has_full:  # every agreement item, as the fixed design tests it (run_gate below measures its own)
                t0 = time.perf_counter()
                agreement = agreement_scores(suite, Path(args.baseline), Path(c))
                t_agree = round(time.perf_counter() - t0, 1)
            row = {
                "candidate": c,
                "sequential_seconds": round(t_seq, 1),
                "sequential_agreement_seconds": v.sequential.agreement_seconds,
                "agreement_looks_taken": v.sequential.agreement_looks_taken,
                "agreement_seconds": t_agree,
                "sequential_verdict": v.verdict,
                "items_scored": sum(v.sequential.items_scored.values()),
                "items_total": sum(v.sequential.items_total.values()),
                "looks_taken": v.sequential.looks_taken,
                "rule_looks": {r.rule: [r.verdict, r.look] for r in v.rules},
            }
            if has_full:
                assert agreement is not None and t_agree is not None
                fv = decide(load_policy(fixed_pol), base_full, full[c], agreement)
                row |= {
                    "fixed_verdict": fv.verdict,
                    "fixed_seconds": round(full[c].wall_seconds + t_agree, 1),
                    "fixed_timing": "recorded full-scoring wall time + this run's agreement time",
                }
            elif args.fixed_cached_only:
                fv = None
            else:
                t0 = time.perf_counter()
                fv = run_gate(fixed_pol, args.baseline, c)
                row |= {
                    "fixed_verdict": fv.verdict,
                    "fixed_seconds": round(time.perf_counter() - t0, 1),
                    "fixed_timing": "measured in this run",
                }
            if fv is not None:
                row["fixed_rules"] = {r.rule: r.verdict for r in fv.rules}
            if c in args.plain:
                row["plain_seconds"] = round(plain_lm_eval(suite, c, private, args.plain_dtype), 1)
                row["plain_dtype"] = args.plain_dtype
                row["sequential_ratio"] = round(row["sequential_seconds"] / row["plain_seconds"], 3)
                if "fixed_seconds" in row:
                    row["fixed_ratio"] = round(row["fixed_seconds"] / row["plain_seconds"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"policy": str(args.policy), "rows": rows}, indent=2) + "\n")
    if args.plain_only:
        return
    print()
    print(
        f"{'candidate':<40} {'plain s':>8} {'seq s':>7} {'ratio':>6} {'items':>11} {'looks':>5} {'verdict':>12} "
        f"{'fixed s':>8} {'ratio':>6} {'verdict':>12}"
    )
    for r in rows:
        print(
            f"{Path(r['candidate']).name:<40} {r.get('plain_seconds', '-'):>8} {r['sequential_seconds']:>7} "
            f"{r.get('sequential_ratio', '-'):>6} {r['items_scored']:>5}/{r['items_total']:<5} {r['looks_taken']:>5} "
            f"{r['sequential_verdict']:>12} {r.get('fixed_seconds', '-'):>8} {r.get('fixed_ratio', '-'):>6} "
            f"{r.get('fixed_verdict', '-'):>12}"
        )


if __name__ == "__main__":
    main()
