"""lm-eval's stock HF backend, run by lm-eval's own CLI on the golden tasks `quantize golden export` writes
(--log_samples), against `quantize eval`'s scores of the same default-model folder (issue #59, item-level
equality): item by item, and `quantize gate` over the samples.

    .venv/bin/python benchmarks/hf_samples.py [--suite evaluate/smoke.yaml] [--work DIR]

lm-eval runs `--model hf` with the folder, float32 on the CPU and batch size 1 (each request its own unpadded pass,
stock per-item scores), seed 0 as the suite's. Reuses benchmarks/server_samples.py's policy (gates/ci.yaml's rules
but agreement: samples hold no logits), gate and comparison. Writes benchmarks/results/hf_samples.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from server_samples import (  # benchmarks/, the script's own folder, is on sys.path
    RULES,
    SUITE,
    compare,
    gate,
    quantize,
    run_lm_eval,
    samples_scores,
    scores,
    summary,
    write_policy,
)

ROOT = Path(__file__).resolve().parent.parent


def lm_eval_hf(folder: Path, tasks_dir: Path, out: Path) -> float:
    """lm-eval's CLI, `--model hf` on the folder, samples kept; returns the wall seconds."""
    model = ["--model", "hf", "--model_args", f"pretrained={folder},dtype=float32", "--device", "cpu"]
    return run_lm_eval([*model, "--batch_size", "1"], tasks_dir, [r["task"] for r in RULES], out, 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=SUITE)
    p.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    a = p.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="hf-samples-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(quantize("model", "path").stdout.strip())
    tasks_dir = work / "tasks"
    export = quantize("golden", "export", a.suite, str(tasks_dir), "--force")
    if export.returncode:
        raise SystemExit(export.stderr)
    policy = write_policy(work / "policy.yaml", a.suite)
    ours = scores(a.suite, folder)  # scored (or read from the cache) first
    results = work / "results-hf"
    wall = lm_eval_hf(folder, tasks_dir, results)
    report = {
        "suite": a.suite,
        "folder": str(folder),
        "rules": RULES,
        "lm_eval_wall_s": round(wall, 1),
        "gate_samples_vs_folder": summary(gate(policy, folder, results)),
        "items": compare(ours, samples_scores(a.suite, results)),
    }
    import importlib.metadata as md

    report["versions"] = {d: md.version(d) for d in ("lm_eval", "transformers", "torch")}
    out = (
        ROOT
        / "benchmarks"
        / "results"
        / ("hf_samples.json" if a.suite == SUITE else f"hf_samples_{Path(a.suite).stem}.json")
    )
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    g = report["gate_samples_vs_folder"]
    print(f"lm-eval hf {report['lm_eval_wall_s']} s; gate {g.get('verdict')} (exit {g['exit']})")
    for task, r in report["items"].items():
        print(f"  {task}: {r['items']} items, score flips {r['score_flips']}, max |dll| {r['max_abs_dll']:.2e}")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
