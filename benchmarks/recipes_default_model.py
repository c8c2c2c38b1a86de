"""Convert the default model with every shipped recipe and measure each result.

For each recipe: wall time and peak memory of `quantize run` (from quantize.json), true bits
per weight (whole model and quantized linears), and perplexity on held-out local text (the
Jargon File's held-out split, never used for calibration), after reloading the checkpoint
with plain transformers.AutoModelForCausalLM on the CPU. The bf16 source model is the
first row. Prints a Markdown table (the one in the README) and writes it with the raw
figures to benchmarks/results/recipes_default_model.{md,json}.

    python benchmarks/recipes_default_model.py [--outputs outputs] [--recipes recipes/*.yaml]

Conversions already present in --outputs (with a quantize.json) are measured, not redone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
HELDOUT_SAMPLES, HELDOUT_LEN = 24, 256


def perplexity(checkpoint: Path) -> float:
    """exp(mean token NLL) over HELDOUT_SAMPLES × HELDOUT_LEN held-out tokens."""
    from importlib import resources

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantize.convert.calibration import HELD_OUT_FILE, build_calibration
    from quantize.convert.recipe import Calibration

    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    model.eval()
    held_out = str(resources.files("quantize") / "data" / HELD_OUT_FILE)  # the file: no recipe may name the split
    cal = Calibration(source=held_out, samples=HELDOUT_SAMPLES, seq_len=HELDOUT_LEN, seed=0)
    x = build_calibration(tok, cal).input_ids  # (N, T)
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), 4):
            batch = x[i : i + 4]
            logits = model(input_ids=batch).logits[:, :-1].float()  # (B, T-1, V)
            if not torch.isfinite(logits).all():
                return math.nan
            lp = torch.log_softmax(logits, -1).gather(-1, batch[:, 1:, None]).squeeze(-1)
            nll -= lp.sum().item()
            n += lp.numel()
    return math.exp(nll / n)


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outputs", default=str(ROOT / "outputs"))
    import yaml

    from quantize.convert.recipe import FILE_METHODS

    # the recipes transformers reloads (a GGUF recipe's file is llama.cpp's: tests/convert/test_gguf_recipes.py)
    gguf = {m.value for m in FILE_METHODS}
    every = sorted((ROOT / "recipes").glob("*.yaml"))
    shipped = [p for p in every if yaml.safe_load(p.read_text()).get("method") not in gguf]
    ap.add_argument("--recipes", nargs="*", default=[str(p) for p in shipped])
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from quantize import records
    from quantize.checkpoint.accounting import bits_report
    from quantize.checkpoint.loader import prepare_default_model
    from quantize.convert.provenance import library_versions
    from quantize.records import RunRecord

    source = prepare_default_model()
    rows = []
    src = bits_report(source)
    t0 = time.perf_counter()
    rows.append(
        {
            "recipe": "bf16 source",
            "method": "-",
            "scheme": "bf16",
            "wall_s": None,
            "peak_rss_mib": None,
            "bits_per_weight": src.bits_per_weight,
            "qlinear_bits": None,
            "mib": src.total_bytes / 2**20,
            "ppl": perplexity(source),
        }
    )
    print(f"source measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for recipe in args.recipes:
        name = Path(recipe).stem
        out = Path(args.outputs) / name
        if not (out / "quantize.json").is_file():
            print(f"converting {name} ...", file=sys.stderr)
            subprocess.run(
                [sys.executable, "-m", "quantize.cli", "run", recipe, "--output", str(out), "--quiet"],
                check=True,
                cwd=ROOT,
            )
        meta = records.read(RunRecord, out / "quantize.json")
        b = meta.bits
        rows.append(
            {
                "recipe": name,
                "method": meta.method,
                "scheme": meta.scheme,
                "wall_s": meta.time_seconds["total"],
                "peak_rss_mib": meta.memory.peak_rss_bytes / 2**20,
                "bits_per_weight": b.bits_per_weight,
                "qlinear_bits": b.quantized_linear_bits_per_weight,
                "mib": b.total_bytes / 2**20,
                "ppl": perplexity(out),
            }
        )
        print(f"measured {name}", file=sys.stderr)
    header = (
        "| recipe | method | scheme | wall time (s) | peak RSS (MiB) | bits/weight (whole) | "
        "bits/weight (quantized linears) | tensor MiB | held-out perplexity |"
    )
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | {r['method']} | {r['scheme']} | {_f(r['wall_s'], '.0f')} | "
            f"{_f(r['peak_rss_mib'], ',.0f')} | {r['bits_per_weight']:.3f} | {_f(r['qlinear_bits'], '.3f')} | "
            f"{r['mib']:.1f} | {r['ppl']:.3f} |"
        )
    table = "\n".join(lines)
    print(table)
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    note = (
        f"\n\nMeasured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPU cores; perplexity over "
        f"{HELDOUT_SAMPLES} × {HELDOUT_LEN} held-out Jargon File tokens; versions {library_versions()}\n"
    )
    (results / "recipes_default_model.md").write_text(table + note)
    (results / "recipes_default_model.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
