"""Time to a verdict with a cached baseline, against one plain lm-eval run of the candidate.

    python benchmarks/gate_time.py BASELINE CANDIDATE [--policy gates/ci.yaml] [--suite evaluate/smoke.yaml]

1. Scores the baseline once (cached), computes its stored top-k distributions (cached) and compares
   the baseline with itself (an A/A agreement pass, which also checks the set-up).
2. Times `quantize gate` on the candidate from a cold candidate cache: candidate scoring, agreement, decision.
3. Times one plain lm-eval `simple_evaluate` run of the candidate on the same tasks (no per-item
   records kept, no statistics).
Prints the seconds and the ratio. Uses a private cache folder, so nothing else is disturbed;
--baseline-cache DIR seeds it with the baseline's entries (scores and top-k) from an existing cache
(e.g. ~/.cache/quantize), so a full-suite run does not score the baseline again.
"""

from __future__ import annotations

import argparse
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


def seed_baseline_cache(src: Path, dst: Path, suite_path: str, baseline: Path) -> None:
    """Copy only the baseline's entries, found where score() and the agreement scorer look: its score
    file and its stored top-k, never a candidate's."""
    from quantize import cache
    from quantize.checkpoint import weights_sha256
    from quantize.suite import open_suite

    suite = open_suite(suite_path)
    sha = weights_sha256(baseline)
    # the paths the private cache (QUANTIZE_CACHE=dst) will look up, and the same entries in src
    for target in [cache.score_path(suite, sha), cache.baseline_topk_path(suite, sha)]:
        f = src / target.relative_to(dst)
        if not f.is_file():
            sys.exit(f"{f} is missing: score the baseline in {src} first, or drop --baseline-cache")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    ap.add_argument("--policy", default=str(ROOT / "gates" / "ci.yaml"))
    ap.add_argument(
        "--suite", default=str(ROOT / "evaluate" / "smoke.yaml"), help="suite to time on (the policy's rules are kept)"
    )
    ap.add_argument(
        "--baseline-cache", type=Path, help="copy the baseline's cached scores and top-k from this cache folder"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["QUANTIZE_CACHE"] = tmp
        if args.baseline_cache:
            seed_baseline_cache(args.baseline_cache.expanduser().resolve(), Path(tmp), args.suite, Path(args.baseline))
        import yaml

        from quantize.evaluate.agreement import agreement_scores
        from quantize.golden.manifest import lm_eval_tasks
        from quantize.pipeline import run_gate
        from quantize.suite import open_suite

        policy = yaml.safe_load(Path(args.policy).read_text())
        policy["suite"] = str(Path(args.suite).resolve())
        pol = Path(tmp) / "policy.yaml"
        pol.write_text(yaml.safe_dump(policy))
        from quantize.evaluate.score import score

        suite = open_suite(args.suite)
        t0 = time.perf_counter()
        score(suite, args.baseline)
        agreement_scores(suite, Path(args.baseline), Path(args.baseline))
        t_base = time.perf_counter() - t0

        t0 = time.perf_counter()
        verdict = run_gate(pol, args.baseline, args.candidate)
        t_gate = time.perf_counter() - t0

        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        golden = suite.golden
        inc = lm_eval_tasks(
            golden, Path(tmp) / "tasks", ids=golden.manifest["smoke_ids"] if suite.suite.subset == "smoke" else None
        )
        t0 = time.perf_counter()
        simple_evaluate(
            model="hf",
            model_args={"pretrained": args.candidate, "dtype": "float32"},
            tasks=suite.tasks,
            task_manager=TaskManager(include_path=str(inc), include_defaults=False),
            batch_size=suite.suite.batch_size,
            device="cpu",
            bootstrap_iters=0,
        )
        t_plain = time.perf_counter() - t0
    print(f"suite {args.suite}; verdict {verdict.verdict}")
    how = f"scores and top-k read from {args.baseline_cache}" if args.baseline_cache else "once, then cached"
    print(f"baseline, with an A/A agreement pass ({how}): {t_base:8.1f} s")
    print(f"quantize gate, candidate uncached:           {t_gate:8.1f} s")
    print(f"plain lm-eval run of the candidate:          {t_plain:8.1f} s")
    print(f"time to verdict / plain lm-eval run:         {t_gate / t_plain:8.2f}x")


if __name__ == "__main__":
    main()
