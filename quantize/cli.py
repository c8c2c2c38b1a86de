"""The `quantize` command line: parse, call one function, render the result.

Exit codes: 0 ok, 1 gate rejected, 2 bad input, 3 runtime failure.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from quantize.errors import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, RuntimeFailure, UsageError
from quantize.tables import text_table as table

# OS errors that say a path given on the command line or in a file cannot name a file.
BAD_PATH = {errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR}
TRUST_HELP = "run the checkpoints' own Python code at load (off unless given here: only for checkpoints you trust)"
# Commands that write an output folder (atomically): only these can promise to leave nothing half-written.
WRITES_OUTPUT = {"run", "report", "model", "golden new", "golden freeze", "search"}


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _quiet_progress() -> None:
    """No progress bars: tqdm, datasets and the Hub read these once, when they are first imported,
    which is after this (the CLI imports them inside the commands)."""
    for var in ("TQDM_DISABLE", "HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS"):
        os.environ[var] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


# --- run ----------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from quantize.convert.engine import convert, output_dir
    from quantize.convert.recipe import load_recipe

    recipe, sha = load_recipe(args.recipe)
    out = output_dir(recipe, args.output)
    _leftovers(out, args.clean)
    if recipe.trust_remote_code:
        print(
            f"quantize run: warning: trust_remote_code is on: {recipe.model or 'the model'}'s own Python code "
            "will run at load; use it only for checkpoints you trust",
            file=sys.stderr,
        )
    meta = convert(recipe, sha, str(args.recipe), out, force=args.force, quiet=args.quiet or args.json)
    if args.json:
        _print_json({"output": str(out), **meta.model_dump()})
        return EXIT_OK
    b, plan = meta.bits, meta.layer_plan
    q = b.quantized_linear_bits_per_weight
    print(f"{recipe.name}: {meta.method} {meta.scheme or ''} -> {out}")
    print(
        f"  true bits per weight: {b.bits_per_weight:.3f} whole model"
        + (f", {q:.3f} quantized linear layers" if q else "")
    )
    print(
        f"  size: {_mib(b.total_bytes)} of tensors; {plan.quantized_layers} layers quantized, "
        f"{len(plan.kept_16bit)} kept at 16 bits"
    )
    print(f"  wall time {meta.time_seconds['total']:.1f} s, peak memory {_mib(meta.memory.peak_rss_bytes)}")
    return EXIT_OK


def _leftovers(out: Path, clean: bool) -> None:
    """Report (or, with --clean, remove) what killed runs left beside the output; put back an output
    that a killed --force had moved aside."""
    import shutil

    from quantize.io import leftovers, recover

    if (restored := recover(out)) is not None:
        print(
            f"quantize run: {out} was missing after an interrupted --force; restored it from {restored.name}",
            file=sys.stderr,
        )
    found = leftovers(out)
    if found and clean:
        for p in found:
            shutil.rmtree(p, ignore_errors=True)
        print(
            f"quantize run: removed {len(found)} folder(s) left by killed runs: {', '.join(p.name for p in found)}",
            file=sys.stderr,
        )
    elif found:
        print(
            f"quantize run: warning: {len(found)} folder(s) left by killed runs beside {out}: "
            f"{', '.join(p.name for p in found)}; pass --clean to remove them",
            file=sys.stderr,
        )


# --- inspect ------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    from quantize.checkpoint.accounting import bits_report

    r = bits_report(args.checkpoint)
    if args.json:
        _print_json(r.to_dict(modules=args.modules))
        return EXIT_OK
    fmt = lambda x: f"{x:.3f}" if x is not None else "unknown"  # noqa: E731
    print(
        f"{r.checkpoint}  ({r.format}; {len(r.files)} file(s), {r.header_bytes_read:,} header bytes read of "
        f"{r.file_bytes:,})"
    )
    print(f"  total tensor bytes     {r.total_bytes:,} ({_mib(r.total_bytes)})")
    print(
        f"  logical parameters     {r.parameters:,}" if r.parameters is not None else "  logical parameters     unknown"
    )
    print(
        f"  bits per weight        {fmt(r.bits_per_weight)}  (8 × all bytes / parameters: embeddings, norms and "
        "scales included)"
    )
    if r.bits_per_source_parameter:
        print(
            f"  per source parameter   {fmt(r.bits_per_source_parameter)}  (a tied output layer's stored copy left out)"
        )
    print(
        f"  quantized linears      {fmt(r.quantized_linear_bits_per_weight)} bits per weight over "
        f"{r.quantized_linear_parameters:,} parameters"
    )
    print()
    print(
        table(
            [[role, f"{n:,}", f"{100 * n / r.total_bytes:.2f}%"] for role, n in r.bytes_by_role.items()],
            ["bytes by role", "bytes", "share"],
        )
    )
    if args.modules:
        print()
        print(
            table(
                [[m.module, m.format, f"{m.parameters:,}", f"{m.bytes:,}", fmt(m.bits_per_weight)] for m in r.modules],
                ["module", "format", "parameters", "bytes", "bits/weight"],
            )
        )
    for note in r.notes:
        print(f"  note: {note}")
    return EXIT_OK


# --- cost ---------------------------------------------------------------------------------------


def _formats(spec: str) -> dict[str, float]:
    out = {}
    for part in spec.split(","):
        name, _, bits = part.partition("=")
        try:
            out[name.strip()] = float(bits)
        except ValueError:
            raise UsageError(f"--formats expects name=bits pairs like bf16=16,int4_g128=4.15; got {part!r}") from None
    return out


def cmd_cost(args: argparse.Namespace) -> int:
    from quantize.cost import bounds as cost

    if args.hardware not in cost.HARDWARE:
        raise UsageError(f"--hardware {args.hardware!r} is unknown; choose one of {', '.join(cost.HARDWARE)}")
    hw = cost.HARDWARE[args.hardware]
    work = cost.Workload(args.context, args.batch, args.alpha, args.gamma, args.draft_cost, args.plain_step_ms)
    if args.checkpoint:
        result = cost.checkpoint_cost(Path(args.checkpoint), hw, work, args.project_params, args.project_share)
    else:
        kv = cost.KVLayout(args.layers, args.kv_heads, args.head_dim, args.kv_bytes)
        result = cost.token_cost(args.params, _formats(args.formats), kv, hw, work)
    if args.sweep:
        result["sweeps"] = cost.exercise_sweeps(args.gamma, args.draft_cost, args.alpha)
    if args.json:
        _print_json(result)
        return EXIT_OK
    from quantize.cost.render import render

    print(render(result))
    return EXIT_OK


# --- model --------------------------------------------------------------------------------------


def cmd_model(args: argparse.Namespace) -> int:
    from quantize.checkpoint.loader import default_model_dir, prepare_default_model

    if args.action == "prepare":
        path = prepare_default_model(force=args.force)
        print(path)
    else:
        print(default_model_dir())
    return EXIT_OK


# --- eval ---------------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from quantize.records import GenerationTask, RollingTask, to_json
    from quantize.suite import open_suite

    suite = open_suite(args.suite)
    from quantize.evaluate.score import score
    from quantize.quiet import quiet_libraries

    with quiet_libraries(args.quiet):
        doc, cached = score(suite, args.checkpoint, refresh=args.refresh, trust_remote_code=args.trust_remote_code)
    if args.json:
        print(to_json(doc) if args.items else json.dumps(doc.summary(), indent=2, default=str))
        return EXIT_OK
    p = doc.provenance
    took = "cached" if cached else f"{doc.wall_seconds:.0f} s"
    print(
        f"{p.checkpoint.path}  (identity {p.checkpoint.identity_sha256[:12]}; golden {p.golden.name}/"
        f"{p.golden.version}; lm-eval {p.lm_eval_version}; {took})"
    )
    rows = []
    for task, d in doc.tasks.items():
        if isinstance(d, RollingTask):
            rows.append([task, "bits/byte", f"{d.bits_per_byte:.4f}", "", d.n, "", f"v{d.version}"])
        elif isinstance(d, GenerationTask):
            em = f"exact_match,{d.filter}"
            rows.append([task, em, f"{d.acc:.4f}", f"± {d.acc_se:.4f}", d.n, "", f"v{d.version}"])
        else:
            rows.append([task, "acc", f"{d.acc:.4f}", f"± {d.acc_se:.4f}", d.n, f"{d.chance:.2f}", f"v{d.version}"])
    print(table(rows, ["task", "metric", "value", "SE", "n", "chance", "version"]))
    return EXIT_OK


# --- gate ---------------------------------------------------------------------------------------


def cmd_gate(args: argparse.Namespace) -> int:
    from quantize.flows.gate import run_gate
    from quantize.gates.render import render_text, write_junit
    from quantize.quiet import quiet_libraries
    from quantize.records import to_json

    with quiet_libraries(args.quiet):
        v = run_gate(args.policy, args.baseline, args.candidate, trust_remote_code=args.trust_remote_code)
    if args.junit:
        write_junit(Path(args.junit), v)
    print(to_json(v) if args.json else render_text(v))
    return v.exit_code


# --- report -------------------------------------------------------------------------------------


def checkpoint_folders(given: list[str]) -> list[Path]:
    """Checkpoint folders, each given or found one level below a folder given (such as outputs/)."""
    paths: list[Path] = []
    for c in given:
        p = Path(c)
        if p.is_dir() and not (p / "config.json").is_file():
            found = sorted(d for d in p.iterdir() if (d / "config.json").is_file())
            if not found:
                raise UsageError(
                    f"{p} is neither a checkpoint nor a folder of checkpoints (no config.json in it or in "
                    "its subfolders); pass checkpoint folders, or a folder holding them such as outputs"
                )
            paths += found
        elif p.is_dir():
            paths.append(p)
        else:
            raise UsageError(
                f"{p} is not a checkpoint folder{'' if p.exists() else ' (it does not exist)'}; "
                "pass checkpoint folders, or a folder holding them such as outputs"
            )
    return list(dict.fromkeys(paths))


# --- agree --------------------------------------------------------------------------------------


def cmd_agree(args: argparse.Namespace) -> int:
    """Token-distribution agreement of each candidate with the baseline: a minute or two per checkpoint
    on a CPU, where accuracy scores take a quarter of an hour. Cached, so the report and the gate reuse it."""
    from quantize import cache
    from quantize.checkpoint.files import check_loadable, check_model_dir, identity_sha256
    from quantize.suite import open_suite

    suite = open_suite(args.suite)
    baseline = Path(args.baseline)
    check_model_dir(baseline)
    check_loadable(baseline)
    found = [c for c in checkpoint_folders(args.candidates) if c.resolve() != baseline.resolve()]
    candidates, skipped = [], []
    for c in found:
        check_model_dir(c)
        try:
            check_loadable(c)
        except UsageError as e:
            # one of several (a folder of outputs): measured elsewhere (cached) or skipped, not the whole run
            if len(found) == 1:
                raise
            if cache.lookup_agreement(suite, identity_sha256(baseline), identity_sha256(c)) is None:
                skipped.append(f"{c}: not measured here: {e}")
                continue
        candidates.append(c)
    from quantize.evaluate.agreement import agreement_scores
    from quantize.quiet import quiet_libraries

    rows, results = [], []
    for c in candidates:
        with quiet_libraries(args.quiet):
            a = agreement_scores(suite, baseline, c, trust_remote_code=args.trust_remote_code)
        results.append((c, a))
        rows.append(
            [
                str(c),
                f"{a.kl_mean:.4f} ± {a.kl_se:.4f}",
                f"{a.kl_p99:.3f}",
                f"{a.top1:.3f}",
                f"{a.sum_min:.3f}",
                a.positions,
            ]
        )
    for line in skipped:
        print(line, file=sys.stderr)
    if args.json:
        _print_json([{"checkpoint": str(c), "agreement": a.model_dump()} for c, a in results])
        return EXIT_OK
    print(
        f"agreement with {baseline} on {suite.golden.path} ({suite.suite.agreement.per_task} items per task; "
        "KL is a lower bound from the baseline's top-k, Σ min(p, q) the acceptance rate as a draft)"
    )
    print(table(rows, ["checkpoint", "mean KL ± SE", "KL p99", "top-1", "Σ min(p, q)", "positions"]))
    return EXIT_OK


def report_suite(suite: str | None, policy: str | None) -> str:
    """The report's suite: --suite, else the policy's, else evaluate/core.yaml; a policy on another suite than
    --suite would judge scores of one golden set by rules sized for another, so that is refused."""
    if policy is None:
        return suite or "evaluate/core.yaml"
    from quantize.gates.policy import load_policy

    theirs = load_policy(policy).suite
    if suite is not None and Path(suite).resolve() != Path(theirs).resolve():
        raise UsageError(
            f"--suite {suite} and --policy {policy} (suite {theirs}) name different suites; drop --suite to report "
            "on the policy's suite, or pass a policy written for this one"
        )
    return theirs


def cmd_report(args: argparse.Namespace) -> int:
    from quantize.cost import bounds as cost
    from quantize.report.collect import collect
    from quantize.report.render import write_report

    if args.hardware not in cost.HARDWARE:
        raise UsageError(f"--hardware {args.hardware!r} is unknown; choose one of {', '.join(cost.HARDWARE)}")
    args.suite = report_suite(args.suite, args.policy)
    entries = collect(
        checkpoint_folders(args.checkpoints),
        args.suite,
        Path(args.baseline) if args.baseline else None,
        args.policy,
        cost.HARDWARE[args.hardware],
    )
    data = write_report(entries, Path(args.out), args.x, args.suite, args.hardware)
    if args.json:
        _print_json(data)
    else:
        print(f"wrote {args.out}/report.md and {args.out}/report.html ({len(entries)} checkpoints)")
    return EXIT_OK


# --- golden -------------------------------------------------------------------------------------


def cmd_golden(args: argparse.Namespace) -> int:
    if args.action == "verify":
        from quantize.golden.manifest import verify

        g = verify(args.path)
        counts = ", ".join(
            f"{Path(n).stem} {f['items']}" for n, f in sorted(g.manifest["files"].items()) if f["items"] is not None
        )
        print(
            f"{g.path}: verified {len(g.manifest['files'])} files ({counts}); manifest sha256 {g.manifest_sha256[:16]}"
        )
        return EXIT_OK
    if args.action in ("new", "freeze"):
        if args.action == "new":
            from quantize.golden.new import new_version

            stops = [s.replace("\\n", "\n").replace("\\t", "\t") for s in args.stop or []]
            m = new_version(
                args.out, Path(args.source), args.type, args.task, args.regex, stops, args.max_gen_toks, args.seed
            )
        else:
            from quantize.golden.freeze import freeze
            from quantize.quiet import quiet_libraries

            include = Path(args.include_path).expanduser() if args.include_path else None
            with quiet_libraries(True):
                m = freeze(args.task, Path(args.out), include, args.id_field, args.cluster_field, args.seed)
        tasks = ", ".join(
            f"{t} ({e['output_type']}, {m['files'][e['data']]['items']} items"
            + (f", {len(e['fewshot_ids'])} few-shot" if e.get("fewshot") else "")
            + ")"
            for t, e in m["tasks"].items()
        )
        print(f"{args.out}: wrote golden set {m['name']}/{m['version']}: {tasks}")
        print(f"score it with a suite whose `golden:` is {args.out} (see README, 'Your own golden set')")
        return EXIT_OK
    if args.action == "size":
        from quantize.flows.gate import run_sizing
        from quantize.quiet import quiet_libraries

        with quiet_libraries(args.quiet):
            report = run_sizing(
                args.suite, Path(args.baseline), Path(args.candidate), args.margin, args.alpha, args.power
            )
        print(json.dumps(report, indent=2) if args.json else sizing_text(report))
        return EXIT_OK
    from quantize.golden.build import main as build_main

    if not args.sources:
        raise UsageError("golden build needs --sources DIR, a folder written by golden/core/fetch_sources.sh")
    return build_main(["--sources", args.sources, "--out", args.path, "--seed", str(args.seed)])


def sizing_text(report: dict) -> str:
    a, pw, m = report["alpha"], report["power"], report["margin"]
    rows = []
    for t in report["tasks"]:
        if t["kind"] == "right/wrong":
            rows.append(
                [
                    t["task"],
                    t["n"],
                    t["clusters"],
                    f"{t['flip_rate']:.3f}",
                    f"{t['delta']:+.3f}",
                    f"{t['min_detectable_drop']:.3f}",
                    t["items_needed"],
                ]
            )
        else:
            rows.append(
                [
                    t["task"],
                    t["n"],
                    t["clusters"],
                    "-",
                    f"ppl x{t['ratio']:.4f}",
                    f"+{t['half_width']:.2%} (upper bound)",
                    f"{t['documents_needed']} for ±{report['ppl_half_width']:.0%}",
                ]
            )
    head = [
        "task",
        "items",
        "clusters",
        "flip rate",
        "Δ candidate−baseline",
        "smallest drop detected",
        f"items for {m:.3f}",
    ]
    return (
        f"sizing {report['golden']} from {report['baseline']} vs {report['candidate']} "
        f"(one-sided α = {a}, power {pw}, margin {m}):\n"
        + table(rows, head)
        + "\nitems needed: to resolve a drop of the margin with this pair's measured flip rate and clustering; "
        "use a harmless candidate (e.g. 8-bit) to size for passes."
    )


# --- search -------------------------------------------------------------------------------------


def cmd_search(args: argparse.Namespace) -> int:
    from quantize.records import to_json
    from quantize.search.run import run_search

    report = run_search(args.spec, args.budget, quiet=args.quiet, policy=args.policy)
    print(to_json(report) if args.json else search_text(report))
    return EXIT_OK if report.result else 1


def search_text(r: Any) -> str:
    def opts(a: Any) -> str:
        return ", ".join(f"{n} {o}" for o, n in sorted(a.options.items()))

    lines = [
        f"search {r.spec}: {len(r.units)} layer groups, sensitivity on {r.items['sensitivity']} agreement items "
        f"({r.sensitivity_seconds:.0f} s, cached), checks on {r.items['holdout']} held-out items; smallest model "
        f"{r.smallest_bits_per_weight:.3f} bits/weight, budget {', '.join(f'{b:g}' for b in r.budgets_bits)}",
        "",
        "most sensitive layer groups (mean KL, alone):",
    ]
    top = sorted(r.units, key=lambda u: -max(u.kl.values()))[:8]
    lines.append(
        table(
            [[u.name, *[f"{u.kl[o]:.4f}" for o in sorted(u.kl) if o != "keep"]] for u in top],
            ["layer group", *[o for o in sorted(top[0].kl) if o != "keep"]],
        )
    )
    if r.comparisons:
        rand = [c.holdout_kl for c in r.comparisons if c.label.startswith("random") and c.holdout_kl is not None]
        mean = f"; random allocations: mean {sum(rand) / len(rand):.4f} over {len(rand)}" if rand else ""
        lines += ["", f"at equal bytes (held-out mean KL{mean}):"]
        lines.append(
            table(
                [
                    [c.label, f"{c.bits_per_weight:.3f}", f"{c.predicted_kl:.4f}", f"{c.holdout_kl:.4f}", opts(c)]
                    for c in r.comparisons
                ],
                ["allocation", "bits/weight", "predicted KL", "held-out KL", "options"],
            )
        )
    lines += ["", "frontier (cheapest first; gated by bisection, the largest first):"]
    rows = []
    for t in r.tries:
        a = t.allocation
        top1 = "-" if a.holdout_top1 is None else f"{a.holdout_top1:.3f}"
        verdict = t.verdict.upper() if t.verdict else t.note
        rows.append(
            [
                a.label,
                f"{a.bits_per_weight:.3f}",
                f"{a.holdout_kl:.4f}",
                top1,
                verdict,
                ", ".join(t.failed_rules) or "-",
            ]
        )
    lines.append(table(rows, ["allocation", "bits/weight", "held-out KL", "top-1", "verdict", "failed rules"]))
    if r.result:
        lines.append(f"\nresult: {r.result} (quantize.json and search.json there)")
    else:
        lines.append(
            f"\nno allocation within the budget passed; the most damaging layer groups: {', '.join(r.drivers)}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quantize", description="Recipe-driven LLM quantization with true bits-per-weight accounting."
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="convert a model as a recipe file says")
    r.add_argument("recipe", help="recipe YAML, e.g. recipes/awq-g128.yaml")
    r.add_argument("--output", "-o", help="output folder (overrides the recipe's `output:`)")
    r.add_argument("--force", action="store_true", help="replace an existing output folder written by quantize")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bars or library logs")
    r.add_argument("--clean", action="store_true", help="remove folders that killed runs left beside the output")
    r.add_argument("--json", action="store_true", help="print quantize.json to stdout")
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser("inspect", help="true bits per weight of any safetensors checkpoint, from headers only")
    i.add_argument("checkpoint", help="checkpoint folder or .safetensors file")
    i.add_argument("--modules", action="store_true", help="per-module table")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_inspect)

    c = sub.add_parser(
        "cost",
        help="decode-time lower bounds and speculative-decoding arithmetic",
        description="Every time printed is a lower bound from peak figures, not a measurement. "
        "Defaults reproduce the seed worksheet (70B GQA model, hypothetical 3.0 TB/s GPU).",
    )
    c.add_argument("--checkpoint", help="use a measured checkpoint's bytes and KV layout instead of --params/--formats")
    c.add_argument("--params", type=float, default=70e9, help="parameter count (default 70e9)")
    c.add_argument("--formats", default="bf16=16,fp8_e4m3=8,int4_g128=4.15", help="name=bits pairs")
    c.add_argument("--layers", type=int, default=80)
    c.add_argument("--kv-heads", type=int, default=8)
    c.add_argument("--head-dim", type=int, default=128)
    c.add_argument("--kv-bytes", type=float, default=2, help="bytes per KV element (2 = bf16, 1 = fp8)")
    c.add_argument("--context", type=int, default=2048, help="context tokens per sequence")
    c.add_argument("--batch", type=int, default=32)
    c.add_argument("--hardware", default="seed", help="seed | h100-sxm | h200")
    c.add_argument("--alpha", type=float, default=0.8, help="speculative acceptance rate α, 0 <= α < 1")
    c.add_argument("--gamma", type=int, default=4, help="draft length γ >= 1")
    c.add_argument("--draft-cost", type=float, default=0.1, help="draft step time / target step time, c >= 0")
    c.add_argument(
        "--plain-step-ms", type=float, default=25.0, help="a measured plain decode step, for iteration time and TPOT"
    )
    c.add_argument(
        "--project-params", type=float, help="with --checkpoint: project onto a larger model of this many parameters"
    )
    c.add_argument(
        "--project-share",
        type=float,
        help="with --project-params: share of its parameters in quantized linears (default: the checkpoint's)",
    )
    c.add_argument("--sweep", action="store_true", help="add the seed's exercise sweeps (α, best γ, slow draft)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_cost)

    e = sub.add_parser("eval", help="score a checkpoint on a golden set (lm-eval), with per-item records, cached")
    e.add_argument("suite", help="evaluation suite, e.g. evaluate/core.yaml")
    e.add_argument("checkpoint", help="checkpoint folder")
    e.add_argument("--refresh", action="store_true", help="score again even when cached")
    e.add_argument("--json", action="store_true")
    e.add_argument("--items", action="store_true", help="with --json: include per-item records")
    e.add_argument("--quiet", "-q", action="store_true", help="no progress bars or library logs")
    e.add_argument("--trust-remote-code", action="store_true", help=TRUST_HELP)
    e.set_defaults(fn=cmd_eval)

    gt = sub.add_parser(
        "gate",
        help="pass or reject a candidate against its baseline, with paired statistics",
        description="Exit 0: pass; 1: rejected or inconclusive (fails closed by default); 2: bad input; "
        "3: runtime failure.",
    )
    gt.add_argument("policy", help="gate policy, e.g. gates/ci.yaml")
    gt.add_argument("--baseline", required=True, help="baseline checkpoint folder (or a score .json)")
    gt.add_argument("--candidate", required=True, help="candidate checkpoint folder (or a score .json)")
    gt.add_argument("--json", action="store_true")
    gt.add_argument("--junit", help="also write JUnit XML here (one test case per rule)")
    gt.add_argument("--quiet", "-q", action="store_true", help="no progress bars or library logs")
    gt.add_argument("--trust-remote-code", action="store_true", help=TRUST_HELP)
    gt.set_defaults(fn=cmd_gate)

    ag = sub.add_parser(
        "agree",
        help="token-distribution agreement of checkpoints with a baseline (mean KL, top-1, Σ min), cached",
        description="Minutes per checkpoint where scoring takes a quarter of an hour; the report shows it, "
        "and the gate reuses it.",
    )
    ag.add_argument("suite", help="evaluation suite whose agreement settings and golden items to use")
    ag.add_argument("candidates", nargs="+", help="checkpoint folders, or folders of checkpoints such as outputs")
    ag.add_argument("--baseline", required=True, help="baseline checkpoint folder")
    ag.add_argument("--json", action="store_true")
    ag.add_argument("--quiet", "-q", action="store_true", help="no progress bars or library logs")
    ag.add_argument("--trust-remote-code", action="store_true", help=TRUST_HELP)
    ag.set_defaults(fn=cmd_agree)

    rp = sub.add_parser("report", help="bytes-versus-accuracy report (Markdown and self-contained HTML, with plots)")
    rp.add_argument("checkpoints", nargs="+", help="checkpoint folders, or folders of checkpoints")
    rp.add_argument(
        "--suite", help="the suite whose cached scores to show (default: the policy's, else evaluate/core.yaml)"
    )
    rp.add_argument("--baseline", help="baseline checkpoint (marked; agreement and verdicts are against it)")
    rp.add_argument("--policy", help="gate policy whose verdicts to show (from cached scores only)")
    rp.add_argument("--hardware", default="h100-sxm", help="hardware profile for the decode-cost bounds")
    rp.add_argument("--x", choices=["bytes", "bpw"], default="bytes", help="x axis of the Pareto plots")
    rp.add_argument(
        "--out", required=True, help="output folder (written atomically; an earlier report there is replaced)"
    )
    rp.add_argument("--json", action="store_true", help="print report.json (the table, entries and image names)")
    rp.set_defaults(fn=cmd_report)

    g = sub.add_parser("golden", help="verify, build, freeze or write a versioned golden set; size one")
    gs = g.add_subparsers(dest="action", required=True)
    gv = gs.add_parser("verify", help="check every file of a version against its MANIFEST")
    gv.add_argument("path", help="a golden version folder, e.g. golden/core/v1")
    gb = gs.add_parser("build", help="build golden/core from fetched sources (golden/core/README.md)")
    gb.add_argument("path", help="the new version folder, e.g. golden/core/v2")
    gb.add_argument("--sources", help="folder written by golden/core/fetch_sources.sh")
    gn = gs.add_parser("new", help="a golden set from your own JSONL items")
    gn.add_argument("out", help="the new version folder, e.g. golden/faq/v1")
    gn.add_argument("--from", dest="source", required=True, help="JSONL file, one item per line")
    gn.add_argument("--type", required=True, choices=["multiple_choice", "greedy", "perplexity", "generate"])
    gn.add_argument("--task", help="task name (default: <set>_<type>)")
    gn.add_argument("--regex", help="generate: extract the answer with this regex (its group, if it has one)")
    gn.add_argument(
        "--stop", action="append", help="generate: a stop sequence (repeat; default \\n; \\n and \\t understood)"
    )
    gn.add_argument("--max-gen-toks", type=int, default=32, help="generate: most tokens per answer (default 32)")
    gf = gs.add_parser("freeze", help="freeze lm-eval tasks (their documents after filtering) into a golden set")
    gf.add_argument("--task", action="append", required=True, help="an lm-eval task or group (repeat)")
    gf.add_argument("--include-path", help="folder of your task YAMLs (default: lm-eval's own tasks)")
    gf.add_argument("--out", required=True, help="the new version folder, e.g. golden/support/v1")
    gf.add_argument("--id-field", help="document field holding a stable unique id (default: its index)")
    gf.add_argument("--cluster-field", help="document field grouping items that are not independent (e.g. subject)")
    gz = gs.add_parser("size", help="flip rates between two checkpoints and the items a margin needs")
    gz.add_argument("suite", help="evaluation suite (its golden set and tasks)")
    gz.add_argument("--baseline", required=True, help="checkpoint folder or score file")
    gz.add_argument("--candidate", required=True, help="checkpoint folder or score file")
    gz.add_argument("--margin", type=float, default=0.02, help="accuracy drop to resolve (default 0.02)")
    gz.add_argument("--alpha", type=float, default=0.05)
    gz.add_argument("--power", type=float, default=0.8)
    gz.add_argument("--json", action="store_true")
    gz.add_argument("--quiet", action="store_true", help="silence library progress bars")
    for sp in (gb, gn, gf):
        sp.add_argument("--seed", type=int, default=1234 if sp is gb else 0)
    g.set_defaults(fn=cmd_golden)

    se = sub.add_parser(
        "search", help="the smallest mixed-precision checkpoint that passes a gate, under a byte budget"
    )
    se.add_argument("spec", help="search recipe, e.g. recipes/search-w4-w8.yaml")
    se.add_argument(
        "--budget", type=float, action="append", help="bits per weight (repeat for several); overrides the spec"
    )
    se.add_argument("--policy", help="the gate policy every tried allocation must pass; overrides the spec's")
    se.add_argument("--quiet", action="store_true", help="silence library progress bars")
    se.add_argument("--json", action="store_true", help="print search.json")
    se.set_defaults(fn=cmd_search)

    m = sub.add_parser("model", help="the embedded default model (SmolLM2-135M-Instruct)")
    m.add_argument("action", choices=["prepare", "path"], help="prepare: convert the GGUF once; path: print its folder")
    m.add_argument("--force", action="store_true", help="convert again")
    m.set_defaults(fn=cmd_model)
    return p


def main(argv: list[str] | None = None) -> int:
    _offline()
    # SIGTERM unwinds like Ctrl-C, so temporary output folders are removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        _quiet_progress()
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"quantize {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeFailure as e:
        print(f"quantize {args.command}: failed: {e}", file=sys.stderr)
        return EXIT_RUNTIME
    except BrokenPipeError:  # the reader of our output closed it (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        if e.errno in BAD_PATH:  # the path the user gave cannot name a file: their input, not our failure
            print(f"quantize {args.command}: error: {e.strerror}: {e.filename!s:.200}; check the path", file=sys.stderr)
            return EXIT_USAGE
        return _unexpected(args.command, e)
    except KeyboardInterrupt:
        command = f"{args.command} {getattr(args, 'action', '')}".strip()
        left = (
            "; nothing was left at the output path" if command in WRITES_OUTPUT or args.command in WRITES_OUTPUT else ""
        )
        print(f"quantize {args.command}: interrupted{left}", file=sys.stderr)
        return 130
    except Exception as e:
        return _unexpected(args.command, e)


def _unexpected(command: str, e: BaseException) -> int:
    """An unexpected failure: a short message, the traceback on request."""
    if os.environ.get("QUANTIZE_DEBUG"):
        traceback.print_exc()
    print(
        f"quantize {command}: failed: {type(e).__name__}: {str(e)[:500]}\n"
        "(set QUANTIZE_DEBUG=1 for the traceback, and report it if the input was valid)",
        file=sys.stderr,
    )
    return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
