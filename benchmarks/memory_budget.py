"""A memory budget is a bound: a ~1.4 GB random-weight source through `quantize run` under several budgets
(`--max-memory`), each run in a child process whose peak RSS is its own ru_maxrss (os.wait4), against the plan's
estimate (convert/memory.py, from the headers alone, before the run) and the budget. The cases (`--paths`):

    streamed      FP8 dynamic, `streaming: on`
    in-memory     FP8 dynamic, `streaming: off`
    kv            FP8 dynamic with an FP8 KV cache (recipes/fp8-kv.yaml's scheme; 16 x 128 calibration tokens of
                  builtin:jargon), whose KV scales are calibrated through llm-compressor's sequential pipeline;
                  `offload: auto` (the weights offloaded to disk where the model does not fit)
    kv-in-memory  the same, `offload: off`

    python benchmarks/memory_budget.py [--work DIR] [--budgets 1GiB 2GiB none] [--paths streamed kv]

The source is a Llama built from transformers' LlamaConfig (hidden 2048, intermediate 5632, 16 heads, 4 KV heads,
13 layers, vocabulary 32000, untied: 717 M parameters, 1.43 GB in bf16) with seeded random weights (no download),
saved by save_pretrained in shards of at most 100 MB, with the tests' word-level tokenizer; it is written once
into --work and reused. A budget the plan refuses is a row too (exit 2, nothing run). Prints the table and writes
it to benchmarks/results/memory_budget.txt.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # conftest.tokenizer_for: the tests' word-level tokenizer

MiB = 2**20
SHAPE = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    num_hidden_layers=13,
    vocab_size=32000,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=1,
)
FP8 = {"method": "fp8", "scheme": "FP8_DYNAMIC", "calibration": None}
KV = {
    "method": "fp8",
    "scheme": "FP8_DYNAMIC",
    "kv_cache": {"scheme": "FP8"},
    "calibration": {"source": "builtin:jargon", "samples": 16, "seq_len": 128, "seed": 0},
}
CASES = {
    "streamed": {**FP8, "streaming": "on"},
    "in-memory": {**FP8, "streaming": "off"},
    "kv": {**KV, "offload": "auto"},
    "kv-in-memory": {**KV, "offload": "off"},
}


def build_source(path: Path, seed: int = 0) -> Path:
    """The random-weight Llama of SHAPE in bf16, saved in shards of at most 100 MB (once: an existing one is kept)."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from conftest import tokenizer_for

    torch.manual_seed(seed)
    cfg = LlamaConfig(**SHAPE)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp, max_shard_size="100MB")
    tokenizer_for(cfg.vocab_size).save_pretrained(tmp)
    tmp.rename(path)
    return path


def parse_budget(text: str) -> int | None:
    from quantize.convert.recipe import parse_size

    return None if text == "none" else parse_size(text)


def planned(src: Path, path: str, budget: int | None) -> tuple[str, str, str]:
    """What the plan says before the run, from the headers alone: (path chosen or "refused", its estimate (a
    refusal's as its message gives it), the reload check it plans: "full" or "streamed")."""
    from quantize.convert import memory
    from quantize.convert.recipe import parse_recipe
    from quantize.errors import UsageError

    recipe = parse_recipe({"model": str(src), **CASES[path]})
    try:
        p = memory.plan(recipe, src, budget)
    except UsageError as e:
        return "refused", str(e).split("would need about ", 1)[-1].split(" of memory", 1)[0], "-"
    return p.path, mib(p.need_bytes), "full" if p.full_reload else "streamed"


def convert(src: Path, work: Path, path: str, budget: str) -> tuple[int, int, float, dict]:
    """One `quantize run` in a child process: (exit code, its peak RSS in bytes from wait4, wall seconds,
    its quantize.json's memory_plan or {})."""
    name = f"{path}-{budget}"
    out = work / "out" / name
    shutil.rmtree(out, ignore_errors=True)
    rfile = work / f"{name}.yaml"
    fields = {"name": name, "model": str(src), "output": str(out), **CASES[path]}
    rfile.write_text(json.dumps(fields))  # JSON is YAML
    cmd = [sys.executable, "-m", "quantize.cli", "run", str(rfile), "--quiet"]
    if budget != "none":
        cmd += ["--max-memory", budget]
    log = (work / f"{name}.log").open("w")
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    plan = {}
    if (out / "quantize.json").is_file():
        plan = json.loads((out / "quantize.json").read_text())["memory_plan"]
    shutil.rmtree(out, ignore_errors=True)
    return child.returncode, usage.ru_maxrss * 1024, wall, plan


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:,.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/quantize-memory-budget"))
    ap.add_argument("--budgets", nargs="+", default=["1GiB", "1.2GiB", "2GiB", "3GiB", "4GiB", "none"])
    ap.add_argument("--paths", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "memory_budget.txt")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reused = (args.work / "llama-1.4gb" / "config.json").is_file()
    src = build_source(args.work / "llama-1.4gb")
    built = "source reused from --work" if reused else f"source built in {time.perf_counter() - t0:.0f} s"
    from quantize.convert.memory import read_checkpoint

    ckpt = read_checkpoint(src)
    head = (
        f"# quantize run of a random-weight Llama (transformers LlamaConfig {SHAPE}): "
        f"{ckpt.model_bytes:,} bytes ({mib(ckpt.model_bytes)}) in {len(ckpt.shard_bytes)} shards, largest "
        f"{mib(ckpt.largest_shard[1])}\n# {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; {built}\n"
        "# peak: the child's ru_maxrss (os.wait4); estimate: the memory plan's need (headers only, before the run)\n"
    )
    cols = ["case", "budget", "path chosen", "reload check", "planned estimate", "measured peak",
            "under budget", "exit", "wall"]  # fmt: skip
    rows = []
    print(head, flush=True)
    for path in args.paths:
        for budget in args.budgets:
            chosen, need, reload = planned(src, path, parse_budget(budget))
            if chosen == "refused":
                rc, peak, wall, plan = 2, None, 0.0, {}
            else:
                rc, peak, wall, plan = convert(src, args.work, path, budget)
            limit = parse_budget(budget)
            under = "-" if limit is None or peak is None else ("yes" if peak <= limit else "NO")
            row = [path, budget, plan.get("path", chosen), plan.get("reload", reload), need,
                   mib(peak), under, str(rc), f"{wall:.0f} s"]  # fmt: skip
            rows.append(row)
            print(" | ".join(row), flush=True)
    table = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    table += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(head + "\n" + table)
    print("\n" + table)


if __name__ == "__main__":
    main()
