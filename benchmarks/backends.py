"""The same conversion through every backend that runs here, side by side, on the embedded default model.

GPTQ W4A16, group 64, symmetric, no act-order, dampening 0.01; AWQ W4A16, group 64, asymmetric, 20 grid points;
all on the same calibration tokens (builtin:jargon, 32 × 256, seed 0). Group 64 because GPTQModel writes a group
that does not divide every layer as a `dynamic` override transformers cannot load (576 % 128 != 0 here). Rows:

    plain-oneshot        plain llm-compressor as a user calls it: the model loaded in its stored dtype (bf16), the
                         same GPTQModifier and tokens, oneshot, save_pretrained(save_compressed=True): nothing else
    run-gptq             `quantize run`, backend llmcompressor, calibration dtype chosen from the machine
    run-gptq-fp32        the same recipe with `dtype: float32` (the CPU rule before the machine was asked)
    run-gptqmodel-gptq   `quantize run`, backend gptqmodel (in .venv-gptq)
    run-awq              `quantize run`, backend llmcompressor, AWQ (float32 on a CPU)
    run-gptqmodel-awq    `quantize run`, backend gptqmodel, AWQ (bf16: its AWQ packer refuses float32)
    autoawq              AutoAWQ 0.2.9 as its users call it (benchmarks/autoawq_cost.py --save), in its own
                         environment: only with --autoawq-python (it cannot live in the project's environments)

Each conversion runs alone, in its own process, one after the other (wall time and the process's peak RSS from
wait4); then every output is measured in .venv-gptq (it loads every format): true bits per weight from the headers,
mean KL and top-1 agreement with the baseline (`quantize agree`, golden/core/v2, top-20 + tail), and the verdict of
`quantize gate gates/ci.yaml`.

    python benchmarks/backends.py [--rows ROW ...] [--skip-convert]

Writes benchmarks/results/backends.{md,json} after every step (a stopped run keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")

ROOT = Path(__file__).resolve().parent.parent
CORE, GPTQ_ENV = ROOT / ".venv" / "bin", ROOT / ".venv-gptq" / "bin"
OUT = ROOT / "outputs" / "backends"
RESULTS = ROOT / "benchmarks" / "results"
CALIB = {"source": "builtin:jargon", "samples": 32, "seq_len": 256, "seed": 0}
GPTQ = {"method": "gptq", "scheme": "W4A16", "group_size": 64, "symmetric": True, "act_order": False}
AWQ = {"method": "awq", "scheme": "W4A16", "group_size": 64, "symmetric": False, "awq_grid": 20}
# row -> (environment, recipe fields or None for the plain script, what it is)
ROWS: dict[str, tuple[Path, dict | None, str]] = {
    "plain-oneshot": (CORE, None, "GPTQ: plain llm-compressor oneshot (bf16, as stored)"),
    "run-gptq": (CORE, {**GPTQ, "dampening_frac": 0.01}, "GPTQ: quantize run, llmcompressor"),
    "run-gptq-fp32": (CORE, {**GPTQ, "dampening_frac": 0.01, "dtype": "float32"}, "GPTQ: quantize run, float32"),
    "run-gptqmodel-gptq": (
        GPTQ_ENV,
        {**GPTQ, "dampening_frac": 0.01, "backend": "gptqmodel"},
        "GPTQ: quantize run, gptqmodel",
    ),
    "run-awq": (CORE, AWQ, "AWQ: quantize run, llmcompressor"),
    "run-gptqmodel-awq": (
        GPTQ_ENV,
        {k: v for k, v in AWQ.items() if k != "awq_grid"} | {"backend": "gptqmodel"},
        "AWQ: quantize run, gptqmodel",
    ),
    "autoawq": (Path("-"), None, "AWQ: AutoAWQ 0.2.9 as its users call it"),
}


def plain_oneshot(out: Path) -> None:
    """What a user of llm-compressor writes: no quantize code but the calibration tokens (the same ids)."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantize.checkpoint.loader import default_model_dir
    from quantize.convert.calibration import build_calibration
    from quantize.convert.recipe import Calibration

    src = default_model_dir()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype="auto")
    tok = AutoTokenizer.from_pretrained(str(src))
    ids = build_calibration(tok, Calibration(**CALIB)).input_ids.tolist()
    weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=64)
    modifier = GPTQModifier(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=["lm_head"],
        dampening_frac=0.01,
        actorder=None,
    )
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(ids[0])] * len(ids)})
    torch.manual_seed(0)
    oneshot(model=model, dataset=ds, recipe=[modifier], num_calibration_samples=len(ids), max_seq_length=len(ids[0]))
    model.save_pretrained(out, save_compressed=True)
    tok.save_pretrained(out)


def timed(cmd: list[str], log: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS bytes of the process (wait4: this child alone) and its exit code."""
    t = time.perf_counter()
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    return time.perf_counter() - t, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def convert(row: str, autoawq_python: Path | None = None) -> dict:
    env, fields, _ = ROWS[row]
    out = OUT / row
    OUT.mkdir(parents=True, exist_ok=True)
    if fields is None:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        cmd = [str(env / "python"), str(Path(__file__).resolve()), "--plain-oneshot", str(out)]
        if row == "autoawq":
            assert autoawq_python is not None, "the autoawq row needs --autoawq-python"
            model = subprocess.run([str(CORE / "quantize"), "model", "path"], capture_output=True, text=True)
            script = Path(__file__).resolve().parent / "autoawq_cost.py"
            cmd = [str(autoawq_python), str(script), model.stdout.strip(), "--save", str(out)]
    else:
        import yaml

        recipe = OUT / f"{row}.yaml"
        recipe.write_text(yaml.safe_dump({"name": row, **fields, "calibration": CALIB, "output": str(out)}))
        cmd = [str(env / "quantize"), "run", str(recipe), "--force", "--quiet"]
    wall, rss, code = timed(cmd, OUT / f"{row}.convert.log")
    got = {"wall_s": round(wall, 1), "peak_rss_mib": round(rss / 2**20), "exit": code}
    if code == 0 and fields is not None:
        from quantize.records import RunRecord, read

        meta = read(RunRecord, out / "quantize.json")
        got["calibration_dtype"] = meta.engine.calibration_dtype
        got["quantize_phase_s"] = round(meta.time_seconds["quantize"], 1)
    elif code == 0:
        got["calibration_dtype"] = "bfloat16 (stored)"
        if row == "autoawq":
            log = (OUT / f"{row}.convert.log").read_text().splitlines()
            got["layer_s"] = json.loads(next(ln for ln in reversed(log) if ln.startswith("{")))["layer_s"]
    return got


def measure(row: str, baseline: str) -> dict:
    """Bits (inspect's JSON), agreement and the verdict, read back through their records."""
    from quantize.errors import UsageError
    from quantize.records import AgreementResult, Verdict, parse

    out = OUT / row
    got: dict = {}
    r = subprocess.run([str(CORE / "quantize"), "inspect", str(out), "--json"], capture_output=True, text=True)
    bits = json.loads(r.stdout)
    got["bits_per_weight"] = bits["bits_per_weight"]
    got["quantized_linear_bits"] = bits["quantized_linear_bits_per_weight"]
    got["format"] = bits["format"]
    r = subprocess.run(
        [str(GPTQ_ENV / "quantize"), "agree", "evaluate/core-v2.yaml", str(out), "--baseline", baseline, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    a = parse(AgreementResult, json.loads(r.stdout)[0]["agreement"], "quantize agree --json")
    got |= {"kl_mean": a.kl_mean, "kl_se": a.kl_se, "top1": a.top1, "top1_se": a.top1_se}
    t = time.perf_counter()
    cmd = ["gate", "gates/ci.yaml", "--baseline", baseline, "--candidate", str(out), "--json"]
    r = subprocess.run([str(GPTQ_ENV / "quantize"), *cmd], cwd=ROOT, capture_output=True, text=True)
    got["gate_s"] = round(time.perf_counter() - t, 1)
    try:
        v = parse(Verdict, json.loads(r.stdout), "quantize gate --json")
        failed = [f"{x.rule}: {x.verdict}" for x in v.rules if x.verdict not in ("pass", "untested")]
        got["verdict"] = v.verdict + (f" ({', '.join(failed)})" if failed and v.verdict != "pass" else "")
    except (json.JSONDecodeError, UsageError):
        got["verdict"] = f"gate exit {r.returncode}: {r.stderr.strip().splitlines()[-1:] or ''}"
    return got


def table(results: dict) -> str:
    lines = [
        "| row | what | calibration dtype | wall (s) | × plain | peak RSS (MiB) | bits/weight (whole) | "
        "bits/weight (q. linears) | mean KL | top-1 | gate (ci.yaml) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    plain = results.get("plain-oneshot", {}).get("wall_s")
    for row, r in results.items():
        if row.startswith("_"):
            continue

        def f(key: str, fmt: str, r: dict = r) -> str:
            return format(r[key], fmt) if isinstance(r.get(key), int | float) else "-"

        gptq = row == "plain-oneshot" or (ROWS[row][1] or {}).get("method") == "gptq"
        ratio = f"{r['wall_s'] / plain:.2f}" if plain and r.get("wall_s") and gptq else "-"
        dtype = {"auto": "bfloat16 (its own)"}.get(r.get("calibration_dtype", "-"), r.get("calibration_dtype", "-"))
        lines.append(
            f"| {row} | {ROWS[row][2]} | {dtype} | {f('wall_s', '.0f')} | {ratio} | "
            f"{f('peak_rss_mib', ',')} | {f('bits_per_weight', '.3f')} | {f('quantized_linear_bits', '.3f')} | "
            f"{f('kl_mean', '.3f')} ± {f('kl_se', '.3f')} | {f('top1', '.3f')} | {r.get('verdict', '-')} |"
        )
    return "\n".join(lines)


def save(results: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "backends.json").write_text(json.dumps(results, indent=2) + "\n")
    text = table(results) + "\n\n" + results["_about"] + "\n"
    if pair := results.get("_pair"):
        text += (
            f"\nquantize run against plain llm-compressor, GPTQ: median {pair['median_s']['run-gptq']:.1f} s against "
            f"{pair['median_s']['plain-oneshot']:.1f} s, ratio {pair['ratio']:.3f} ({pair['about']}; walls "
            f"{pair['walls_s']})\n"
        )
    (RESULTS / "backends.md").write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", choices=list(ROWS), help="default: every row (autoawq with --autoawq-python)")
    ap.add_argument("--autoawq-python", type=Path, help="the python of an environment with autoawq 0.2.9")
    ap.add_argument("--skip-convert", action="store_true", help="measure the outputs already there")
    ap.add_argument("--table", action="store_true", help="print and rewrite the table from backends.json only")
    ap.add_argument(
        "--pair",
        type=int,
        metavar="N",
        help="time plain-oneshot and run-gptq N times each, alternating, and record the median ratio",
    )
    ap.add_argument("--plain-oneshot", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_oneshot:
        plain_oneshot(args.plain_oneshot)
        return
    if args.rows is None:
        args.rows = [r for r in ROWS if r != "autoawq" or args.autoawq_python]
    baseline = subprocess.run([str(CORE / "quantize"), "model", "path"], capture_output=True, text=True).stdout.strip()
    path = RESULTS / "backends.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    if args.table:
        save(results)
        print(table(results))
        return
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    results["_about"] = (
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores of {cpu}; conversions one after the other "
        "in one run of benchmarks/backends.py (wall time and peak RSS of each process); KL/top-1: quantize agree on "
        "golden/core/v2 (200 items, top-20 + tail: a lower bound of the full KL); gate: gates/ci.yaml."
    )
    if args.pair:
        walls: dict[str, list[float]] = {"plain-oneshot": [], "run-gptq": []}
        for i in range(args.pair):
            for row in walls:
                walls[row].append(convert(row)["wall_s"])
                print(f"   pair {i + 1}: {row} {walls[row][-1]} s", flush=True)
        med = {row: statistics.median(w) for row, w in walls.items()}
        results["_pair"] = {
            "walls_s": walls,
            "median_s": med,
            "ratio": round(med["run-gptq"] / med["plain-oneshot"], 3),
            "about": f"{args.pair} alternating runs of each on an otherwise idle machine, {time.strftime('%Y-%m-%d')}",
        }
        save(results)
        print(json.dumps(results["_pair"], indent=2))
        return
    for row in args.rows:
        if not args.skip_convert:
            print(f"== convert {row}", flush=True)
            results[row] = convert(row, args.autoawq_python)
            save(results)
            print(f"   {results[row]}", flush=True)
    for row in args.rows:
        if results.get(row, {}).get("exit") == 0:
            print(f"== measure {row}", flush=True)
            results[row] |= measure(row, baseline)
            save(results)
            print(f"   {results[row]}", flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
