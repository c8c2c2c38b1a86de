"""Token-distribution agreement of a few conversions with the default model: where does 4-bit lose?

    python benchmarks/agreement_probe.py [RECIPE ...]

For each recipe (default: the 4-bit references in benchmarks/references plus the shipped AWQ and
GPTQ recipes): `quantize run` unless its output already exists, then the agreement scorer of
`quantize gate` with evaluate/core.yaml's settings (the baseline's top-k is cached). Prints mean KL
(a lower bound), top-1 agreement and Σ min(p, q), each with its clustered SE, as a Markdown table.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT = [
    "benchmarks/references/rtn-w4a16-g128.yaml",
    "recipes/gptq-w4a16-g128.yaml",
    "benchmarks/references/rtn-w4a16-g128-asym.yaml",
    "benchmarks/references/gptq-w4a16-g128-asym.yaml",
    "recipes/awq-g128.yaml",
]


def main() -> None:
    from quantize.checkpoint.loader import prepare_default_model
    from quantize.cli import main as cli
    from quantize.evaluate.agreement import agreement_scores
    from quantize.evaluate.suite import open_suite

    os.chdir(ROOT)  # recipes name their outputs relative to the repository
    base = prepare_default_model(quiet=True)
    print("| recipe | grid | calibration | mean KL (lower bound) | top-1 agreement | Σ min(p, q) |")
    print("|---|---|---|---|---|---|")
    for recipe in sys.argv[1:] or DEFAULT:
        r = yaml.safe_load((ROOT / recipe).read_text())
        out = ROOT / r["output"]
        if not (out / "quantize.json").is_file() and cli(["run", str(ROOT / recipe), "--quiet"]) != 0:
            sys.exit(f"quantize run {recipe} failed")
        a = agreement_scores(open_suite(ROOT / "evaluate" / "core.yaml"), base, out)
        cal = r.get("calibration")
        cal = f"{cal['samples']} × {cal['seq_len']}" if cal else "none"
        grid = "symmetric" if r.get("symmetric", True) else "zero points"
        print(
            f"| {r['name']} | {grid} | {cal} | {a.kl_mean:.3f} ± {a.kl_se:.3f} | {a.top1:.3f} ± {a.top1_se:.3f} "
            f"| {a.sum_min:.3f} ± {a.sum_min_se:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
