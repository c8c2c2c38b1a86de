"""Every shipped recipe on a tiny seeded model of every family (tests/families.py: dense Llama, Qwen2, Qwen3,
Mistral, Gemma 2, Gemma 3, Phi-3; MoE Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss, Llama 4 text), built from
transformers' config classes (no download).

For each (family, recipe): the exit code of `quantize run` (in this process, through the CLI's own main) and
the last line it printed on an error; for a conversion, the true bits per weight (whole model, and the routed
experts' from the accounting by part), whether the run's own reload check found finite logits, and the KL of the
converted model from its source on the smoke suite (evaluate/smoke.yaml through `quantize agree`: the golden set's
smoke items; the tiny models' word-level tokenizer reads that text as well as any, so the KL is measured, not
replaced by a finiteness check). Rows go to benchmarks/results/families.json as each finishes (resumable: a row
already there is kept unless --redo; a kept row without a KL gets one unless --no-kl), and the table to
docs/families.md between its markers (the rest of that page is prose, kept).

    python benchmarks/families.py                       # everything (hours on a 2-core CPU)
    python benchmarks/families.py --families qwen3_moe mixtral --recipes fp8-e4m3 awq-g128 --no-kl
    python benchmarks/families.py --table               # the doc's table from the results so far
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/families.py: the builders the tests use

RESULTS = ROOT / "benchmarks" / "results" / "families.json"
DOC = ROOT / "docs" / "families.md"
BEGIN, END = "<!-- families table: benchmarks/families.py -->", "<!-- end of families table -->"
SMOKE = ROOT / "evaluate" / "smoke.yaml"
FIRST_DATE = "2026-12-04"  # when the rows without a date of their own were measured
FIRST_MACHINE = "AMD EPYC"  # what the rows without a machine of their own were measured on (before 2026-12-06's last)


def shipped_recipes() -> dict[str, Path]:
    """Every recipe in recipes/ that `quantize run` takes on a tiny family: not a search spec (with `base:`), nor a
    recipe whose backend converts a file (a GGUF recipe: llama.cpp's quantizer reads a GGUF, and the tiny families
    are safetensors checkpoints; `quantize run` would refuse each, naming llama.cpp's convert_hf_to_gguf.py)."""
    import yaml

    from quantize.convert.backends import backend_named, converts_files
    from quantize.convert.recipe import load_recipe

    out = {}
    for p in sorted((ROOT / "recipes").glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        if "base" not in data and not converts_files(backend_named(load_recipe(p)[0].backend)):
            out[p.stem] = p
    return out


def cli(*args: str) -> tuple[int, str, str]:
    """`quantize ARGS` in this process (imports paid once for the whole table): exit code, stdout, stderr."""
    import contextlib
    import io

    from quantize.cli import main as quantize_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = quantize_main(list(args))
    return code, out.getvalue(), err.getvalue()


def last_line(text: str) -> str:
    """The message the CLI printed for its exit (its `quantize COMMAND: ...` line), else the last line."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("quantize ")] or [ln for ln in lines if "warn" not in ln.lower()]
    return said[-1][:400] if said else ""


def convert(family: str, recipe: Path, source: Path, work: Path) -> dict:
    """One conversion and its measures: exit, bits (whole, routed experts), reload, as a row."""
    import yaml

    from quantize import api, records
    from quantize.records import RunRecord

    out = work / "out" / family / recipe.stem
    data = yaml.safe_load(recipe.read_text()) | {"model": str(source), "output": str(out)}
    path = work / "recipes" / family / recipe.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    started = time.monotonic()
    code, _, err = cli("run", str(path), "--quiet", "--force")
    said = last_line(err)
    row: dict = {
        "exit": code,
        "wall_s_under_load": round(time.monotonic() - started, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    if code != 0:
        return row | {"error": said, "reload_ok": False}
    meta = records.read(RunRecord, out / "quantize.json")
    report = api.inspect(out)
    routed = report.bytes_by_part.get("routed_experts")
    row |= {
        "bits_per_weight": meta.bits.bits_per_weight,
        "bits_quantized_linears": meta.bits.quantized_linear_bits_per_weight,
        "routed_experts_bits": None if not routed else round(8 * routed["bytes"] / routed["parameters"], 3),
        "routed_expert_share": None if report.routed_expert_share is None else round(report.routed_expert_share, 3),
        "quantized_layers": meta.layer_plan.quantized_layers,
        "kept_layers": len(meta.layer_plan.kept_16bit),
        "reload_ok": all(c.finite for c in meta.finite_checks) and bool(meta.finite_checks),
        "format": report.format,
        "output": str(out),
    }
    return row


def kl(source: Path, out: Path) -> dict:
    code, stdout, err = cli("agree", str(SMOKE), "--baseline", str(source), str(out), "--json", "--quiet")
    if code != 0:
        return {"kl_error": last_line(err)}
    a = json.loads(stdout)[0]["agreement"]
    return {
        "kl_smoke": a["kl_mean"],
        "kl_smoke_se": a["kl_se"],
        "top1_smoke": a["top1"],
        "kl_positions": a["positions"],
    }


def load_results() -> dict:
    if RESULTS.is_file():
        return json.loads(RESULTS.read_text())
    return {"rows": {}}


def save(results: dict, key: str) -> None:
    """The row `key` of `results` into the file as it is now (another run's rows since ours began are kept)."""
    from quantize.io import write_text_atomic

    now = load_results()
    now["rows"][key] = results["rows"][key]
    now |= {k: v for k, v in results.items() if k != "rows"}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(RESULTS, json.dumps(now, indent=1, sort_keys=True) + "\n")


def fmt(x, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def cell(row: dict | None) -> str:
    """One table cell: exit code, bits (routed experts' after a slash), reload, KL."""
    if row is None:
        return "not run"
    if row["exit"] != 0:
        return f"exit {row['exit']}"
    bits = fmt(row["bits_per_weight"])
    if row.get("routed_experts_bits") is not None:
        bits += f" / {fmt(row['routed_experts_bits'])}"
    kl_s = f", KL {row['kl_smoke']:.1e}" if row.get("kl_smoke") is not None else ""
    return f"{bits}{'' if row['reload_ok'] else ', reload FAILED'}{kl_s}"


def table(results: dict, families: list[str], recipes: list[str]) -> str:
    head = "| family | " + " | ".join(recipes) + " |\n|---|" + "---|" * len(recipes) + "\n"
    body = "".join(
        f"| {f} | " + " | ".join(cell(results["rows"].get(f"{f}/{r}")) for r in recipes) + " |\n" for f in families
    )
    rows = results["rows"].items()
    errors = sorted(
        (k, v["exit"], v.get("error", "")) for k, v in rows if v["exit"] != 0 and k.split("/")[0] in families
    )
    notes = "".join(f"- `{k}` exit {e}: {msg}\n" for k, e, msg in errors)
    return head + body + ("\nWhy each failed run stopped (the last line it printed):\n\n" + notes if notes else "")


def write_doc(results: dict, families: list[str], recipes: list[str]) -> None:
    from quantize.io import write_text_atomic

    text = DOC.read_text() if DOC.is_file() else f"# Families\n\n{BEGIN}\n{END}\n"
    before, _, rest = text.partition(BEGIN)
    _, _, after = rest.partition(END)
    # each row's own date and machine where it has them (older rows carry FIRST_DATE and FIRST_MACHINE)
    rows = results["rows"].values()
    dates = sorted({r.get("date", FIRST_DATE) for r in rows}) or [results.get("date", "")]
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]} (each row's date in {RESULTS.name})"
    machines = sorted({r.get("machine", FIRST_MACHINE) for r in rows})
    meta = machines[0] if len(machines) == 1 else f"{' and '.join(machines)} (each row's machine there)"
    block = f"{BEGIN}\n\nMeasured {when} on {meta}.\n\n{table(results, families, recipes)}\n{END}"
    write_text_atomic(DOC, before + block + after)


def main() -> None:
    from families import FAMILIES, build

    recipes = shipped_recipes()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    ap.add_argument("--recipes", nargs="+", choices=list(recipes), default=list(recipes))
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "families", help="sources, recipes, outputs")
    ap.add_argument("--no-kl", action="store_true", help="skip the smoke-suite KL (quantize agree)")
    ap.add_argument("--redo", action="store_true", help="run again the rows already in the results")
    ap.add_argument("--table", action="store_true", help="only write docs/families.md from the results so far")
    args = ap.parse_args()

    results = load_results()
    if args.table:
        write_doc(results, list(FAMILIES), list(recipes))
        return
    from quantize.machine import cpu_name

    machine = cpu_name()  # each row records its own (write_doc)
    results["date"] = time.strftime("%Y-%m-%d")
    todo = [(f, r) for f in args.families for r in args.recipes]
    for i, (family, recipe) in enumerate(todo, 1):
        key = f"{family}/{recipe}"
        source = args.work / "src" / family
        if key in results["rows"] and not args.redo:
            row = results["rows"][key]
            if row["exit"] == 0 and "kl_smoke" not in row and not args.no_kl and Path(row["output"]).is_dir():
                row |= kl(source, Path(row["output"]))  # a row first measured with --no-kl
                save(results, key)
            print(f"[{i}/{len(todo)}] {key}: kept ({cell(row)})", flush=True)
            continue
        if not (source / "config.json").is_file():
            build(family, source)
        row = convert(family, recipes[recipe], source, args.work)
        if row["exit"] not in (0, 1, 2, 3):  # stopped by a signal (the CLI's main returns 128 + its number)
            sys.exit(f"stopped at {key} (exit {row['exit']}); rows so far are in {RESULTS}")
        if row["exit"] == 0 and not args.no_kl:
            row |= kl(source, Path(row["output"]))
        results["rows"][key] = row | {"machine": machine}
        save(results, key)
        print(f"[{i}/{len(todo)}] {key}: {cell(row)}{'  ' + row.get('error', '') if row['exit'] else ''}", flush=True)
    write_doc(results, list(FAMILIES), list(recipes))
    print(f"wrote {RESULTS.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
