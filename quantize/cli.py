"""The `quantize` command line: parse, call one function of the Python API (quantize/api.py: every command has
one), print what its stage renders from the record it returns, and map exceptions to exit codes
(quantize/errors.py; a refusal of the API naming a keyword is worded with the flag that gave it). No domain logic
and no text of a result lives here.

Exit codes: 0 ok, 1 gate rejected, 2 bad input, 3 runtime failure, 130 interrupted (143 SIGTERM, 129 SIGHUP).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from quantize.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_RUNTIME,
    KeywordError,
    QuantizeWarning,
    RuntimeFailure,
    UsageError,
    path_error,
)

# Commands that write an output folder (atomically): only these can promise to leave nothing half-written.
WRITES_OUTPUT = {"run", "report", "model", "golden new", "golden freeze", "golden export", "search"}


def _offline() -> None:
    """The CLI runs offline (the user's own setting kept): huggingface_hub and datasets read these once, when first
    imported, which is after this. The API sets none of them (compat/hub.py: golden_freeze goes offline itself)."""
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


def _warn(command: str, lines: list[str]) -> None:
    for line in lines:
        print(f"quantize {command}: {line}", file=sys.stderr)


@contextlib.contextmanager
def _printed_warnings(command: str) -> Iterator[None]:
    """The API's QuantizeWarnings of a command, printed on stderr as the CLI's own lines as they come; every other
    warning is shown as it would be. Nothing is kept (recording every warning would keep a library's warning that
    fires in a loop, once per call)."""
    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, *rest: Any) -> None:
        if issubclass(category, QuantizeWarning):
            _warn(command, [str(message)])
        else:
            shown(message, category, filename, lineno, *rest)

    with warnings.catch_warnings():  # restores the filters and showwarning on the way out
        warnings.simplefilter("always", QuantizeWarning)
        warnings.showwarning = show
        yield


# --- the commands: each parses nothing, calls one stage function and prints what the stage renders ----------


def cmd_run(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.convert.render import run_text

    with _printed_warnings("run"):
        done = api.run(
            args.recipe,
            output=args.output,
            force=args.force,
            clean=args.clean,
            max_memory=args.max_memory,
            quiet=args.quiet or args.json,
        )
    if args.json:
        _print_json({"output": str(done.output), **done.record.model_dump()})
    else:
        print(run_text(done.record.recipe.resolved["name"], done.output, done.record))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.checkpoint.render import inspect_text

    r = api.inspect(args.checkpoint)
    if args.json:
        _print_json(r.to_dict(modules=args.modules))
    else:
        print(inspect_text(r, args.modules))
    return EXIT_OK


DEFAULT_FORMATS = "bf16=16,fp8_e4m3=8,int4_g128=4.15"  # the seed worksheet's, with --params 70e9


def _checked_cost_flags(args: argparse.Namespace) -> None:
    """Flags that would change nothing where they were given are refused: --params, --formats and the MoE flags
    beside --checkpoint (its files give them), --project-params without it, --project-share without
    --project-params. Each was accepted and ignored, exit 0 (a review)."""
    given = lambda *names: [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is not None]  # noqa: E731
    if args.checkpoint and (flags := given("params", "formats", "routed_params", "experts", "top_k")):
        raise UsageError(
            f"{', '.join(flags)} describe a model by hand, and --checkpoint reads its parameters, formats and experts "
            "from its files: drop them, or drop --checkpoint"
        )
    if not args.checkpoint and given("project_params"):
        raise UsageError("--project-params projects a measured checkpoint onto a larger model: give --checkpoint too")
    if args.project_params is None and given("project_share"):
        raise UsageError("--project-share is the projected model's share in quantized linears: give --project-params")


def _formats(spec: str) -> dict[str, float]:
    out = {}
    for part in spec.split(","):
        name, _, bits = part.partition("=")
        try:
            value = float(bits)
        except ValueError:
            value = math.nan
        if not name.strip() or not (math.isfinite(value) and value > 0):
            raise UsageError(
                f"--formats expects name=bits pairs like bf16=16,int4_g128=4.15 (a name, and bits per weight "
                f"above 0); got {part!r}"
            )
        if name.strip() in out:  # a dict would keep the last: one row of the table silently lost
            raise UsageError(
                f"--formats names {name.strip()!r} twice ({name.strip()}={out[name.strip()]:g} and {part.strip()}): "
                "each format is one row of the table; give each name once"
            )
        out[name.strip()] = value
    return out


def _checked_numbers(args: argparse.Namespace) -> None:
    """--params, --project-params, --project-share and --kv-bytes in their ranges, named as the flag (the API's
    message named its keyword, `kv_bytes`: a review); --kv-bytes 1e308 priced an Infinity cache, exit 0."""
    from quantize.cost.bounds import MAX_KV_BYTES, MAX_PARAMETERS

    if args.params is not None and not (math.isfinite(args.params) and args.params > 0):
        raise UsageError(f"--params {args.params}: give a finite number above 0")
    if args.project_params is not None and not (math.isfinite(args.project_params) and args.project_params > 0):
        raise UsageError(f"--project-params {args.project_params}: give a finite number of parameters above 0")
    if args.project_params is not None and args.project_params > MAX_PARAMETERS:
        raise UsageError(f"--project-params {args.project_params:g}: give at most {MAX_PARAMETERS:g} parameters")
    if args.project_share is not None and not (math.isfinite(args.project_share) and 0 <= args.project_share <= 1):
        raise UsageError(f"--project-share {args.project_share}: give the share as a number from 0 to 1")
    if args.kv_bytes is not None and not (math.isfinite(args.kv_bytes) and 0 < args.kv_bytes <= MAX_KV_BYTES):
        raise UsageError(
            f"--kv-bytes {args.kv_bytes}: give the bytes a K or V element takes, above 0 and at most {MAX_KV_BYTES} "
            "(2 for a 16-bit cache, 1 for FP8)"
        )


def _routed(args: argparse.Namespace) -> tuple[Any, ...]:
    """--routed-params/--experts/--top-k: an MoE's routed experts, spread evenly over --layers MoE layers."""
    from quantize.cost import bounds

    given = [args.routed_params, args.experts, args.top_k]
    if all(v is None for v in given):
        return ()
    if any(v is None for v in given):
        raise UsageError("--routed-params, --experts and --top-k go together: give all three for an MoE, or none")
    if not (
        0 < args.routed_params <= args.params
        and 1 <= args.top_k <= args.experts <= bounds.MAX_SHAPE
        and 1 <= args.layers <= bounds.MAX_SHAPE
    ):
        raise UsageError(
            f"invalid MoE setting: need 0 < --routed-params ({args.routed_params:g}) <= --params ({args.params:g}), "
            f"1 <= --top-k ({args.top_k}) <= --experts ({args.experts}) <= {bounds.MAX_SHAPE:,} and 1 <= --layers "
            f"<= {bounds.MAX_SHAPE:,}"
        )
    per_layer = round(args.routed_params / args.layers)
    if per_layer < args.experts:  # 0 a layer divided by zero (a review); each expert holds at least one parameter
        raise UsageError(
            f"--routed-params {args.routed_params:g} over --layers {args.layers} is {per_layer:,} parameters a layer, "
            f"fewer than its --experts {args.experts}: give the routed parameters of all layers and experts together"
        )
    return tuple(bounds.RoutedExperts(i, args.experts, args.top_k, 0.0, per_layer) for i in range(args.layers))


def cmd_cost(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.cost import bounds
    from quantize.cost.render import render

    _checked_cost_flags(args)
    _checked_numbers(args)
    work = bounds.Workload(args.context, args.batch, args.alpha, args.gamma, args.draft_cost, args.plain_step_ms)
    shape = (args.layers, args.kv_heads, args.head_dim)
    if args.checkpoint:  # --layers/--kv-heads/--head-dim, all three, replace its KV cache; --kv-bytes prices its own
        if any(v is not None for v in shape) and None in shape:
            raise UsageError("beside --checkpoint, --layers, --kv-heads and --head-dim replace its KV cache together")
        kv = None if None in shape else bounds.KVLayout(*shape, args.kv_bytes if args.kv_bytes is not None else 2)
        result = api.decode_cost(
            args.checkpoint,
            hardware=args.hardware,
            workload=work,
            project_params=args.project_params,
            project_share=args.project_share,
            sweeps=args.sweep,
            kv=kv,
            kv_bytes=args.kv_bytes,
        )
    else:
        args.layers, args.kv_heads, args.head_dim = (
            v if v is not None else d for v, d in zip(shape, (80, 8, 128), strict=True)
        )
        kv = bounds.KVLayout(
            args.layers, args.kv_heads, args.head_dim, args.kv_bytes if args.kv_bytes is not None else 2
        )
        args.params = args.params if args.params is not None else 70e9
        formats, routed = _formats(args.formats or DEFAULT_FORMATS), _routed(args)
        result = api.token_cost(
            args.params, formats, kv, hardware=args.hardware, workload=work, routed=routed, sweeps=args.sweep
        )
    if args.json:
        _print_json(result.to_data())
    else:
        print(render(result))
    return EXIT_OK


def cmd_model(args: argparse.Namespace) -> int:
    from quantize import api

    print(api.default_model(prepare=args.action == "prepare", force=args.force))
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    from quantize import api

    with _printed_warnings("eval"):  # a task with non-finite items, one line each
        doc, cached = api.scored(  # a bad suite is exit 2 before lm-eval is imported
            args.suite,
            args.checkpoint,
            refresh=args.refresh,
            trust_remote_code=args.trust_remote_code,
            quiet=args.quiet,
        )
    from quantize.evaluate.render import score_text
    from quantize.records import to_json

    if args.json:
        print(to_json(doc) if args.items else json.dumps(doc.summary(), indent=2, default=str))
    else:
        print(score_text(doc, cached))
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    from quantize import api

    def show(v: Any) -> None:  # the verdict first, before its files: a failed write hides nothing
        from quantize.gates.render import render_text
        from quantize.records import to_json

        print(to_json(v) if args.json else render_text(v), flush=True)

    # --junit and --card are checked before any scoring (api.gate), not after it with the verdict lost
    v = api.gate(
        args.policy,
        args.baseline,
        args.candidate,
        junit=args.junit,
        card=args.card,
        trust_remote_code=args.trust_remote_code,
        trust_cached_candidate=args.trust_cached_candidate,
        quiet=args.quiet,
        on_verdict=show,
    )
    return v.exit_code


def cmd_card(args: argparse.Namespace) -> int:
    from quantize import api

    path = api.card(args.checkpoint, args.verdict)
    print(f"wrote the verdict into {path} (model-index results and a section)")
    return EXIT_OK


def cmd_cache_key(args: argparse.Namespace) -> int:
    from quantize import api

    found = api.cache_key(args.policy)
    if args.json:
        _print_json({"key": found.key, "parts": found.parts})
    else:
        print(found.key)
    return EXIT_OK


def cmd_agree(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.evaluate.render import agreement_text

    a = api.agreement(
        args.suite, args.baseline, args.candidates, trust_remote_code=args.trust_remote_code, quiet=args.quiet
    )
    for line in [*a.skipped, *a.non_finite]:
        print(line, file=sys.stderr)
    if args.json:
        _print_json([{"checkpoint": str(c), "agreement": r.model_dump()} for c, r in a.results])
    else:
        print(agreement_text(a.baseline, a.suite.golden.path, a.suite.suite.agreement.per_task, a.results))
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from quantize import api

    data = api.write_report(
        args.checkpoints,
        args.out,
        baseline=args.baseline,
        policy=args.policy,
        suite=args.suite,
        x=args.x,
        hardware=args.hardware,
    )
    if args.json:
        _print_json(data)
    else:
        print(f"wrote {args.out}/report.md and {args.out}/report.html ({len(data['entries'])} checkpoints)")
    return EXIT_OK


def cmd_golden_verify(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.golden.render import verified_text

    print(verified_text(api.golden_verify(args.path)))
    return EXIT_OK


def cmd_golden_new(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.golden.render import written_text

    stops = tuple(s.replace("\\n", "\n").replace("\\t", "\t") for s in args.stop or [])
    m = api.golden_new(
        args.out,
        args.source,
        args.type,
        task=args.task,
        regex=args.regex,
        stop=stops,
        max_gen_toks=args.max_gen_toks,
        seed=args.seed,
    )
    print(written_text(args.out, m))
    return EXIT_OK


def cmd_golden_freeze(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.golden.render import written_text

    m = api.golden_freeze(
        args.task,
        args.out,
        include_path=args.include_path,
        id_field=args.id_field,
        cluster_field=args.cluster_field,
        seed=args.seed,
        fewshot_seed=args.fewshot_seed,
    )
    print(written_text(args.out, m))
    return EXIT_OK


def cmd_golden_export(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.golden.export import export_text

    print(export_text(api.golden_export(args.suite, args.out, force=args.force), args.suite))
    return EXIT_OK


def cmd_golden_size(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.gates.render import sizing_text
    from quantize.records import to_json

    report = api.golden_size(
        args.suite,
        args.baseline,
        args.candidate,
        margin=args.margin,
        alpha=args.alpha,
        power=args.power,
        quiet=args.quiet,
    )
    print(to_json(report) if args.json else sizing_text(report))
    return EXIT_OK


def cmd_golden_build(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.golden.render import built_text

    if not args.sources:
        raise UsageError("golden build needs --sources DIR, a folder written by golden/core/fetch_sources.sh")
    print(built_text(api.golden_build(args.sources, args.path, seed=args.seed)))
    return EXIT_OK


def cmd_search(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.records import to_json
    from quantize.search.render import search_text

    report = api.run_search(args.spec, args.budget, quiet=args.quiet, policy=args.policy)
    print(to_json(report) if args.json else search_text(report))
    return EXIT_OK if report.result else EXIT_REJECTED


def cmd_sweep(args: argparse.Namespace) -> int:
    from quantize import api
    from quantize.records import to_json
    from quantize.sweep.render import plan_text, sweep_text

    if args.plan:
        plan = api.plan_sweep(args.sweep, address=args.address, max_parallel=args.max_parallel, clean=args.clean)
        print(to_json(plan) if args.json else plan_text(plan))
        return EXIT_OK
    record = api.run_sweep(args.sweep, address=args.address, max_parallel=args.max_parallel, clean=args.clean)
    print(to_json(record) if args.json else sweep_text(record))
    return record.exit_code


# --- the parser ----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse's parser, keeping how each of its arguments is spelled on the command line (`spelled`: its dest
    to "--max-memory", or "RECIPE" for a positional), which `set_defaults` hands to the command's namespace: a
    refusal of the API naming the keyword a flag's value went to is reworded with the flag (`_worded`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.spelled: dict[str, str] = {}  # before argparse's __init__, which adds -h
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        flag = max(action.option_strings, key=len, default=None)
        self.spelled[action.dest] = flag or (action.metavar if isinstance(action.metavar, str) else action.dest.upper())
        return action

    def set_defaults(self, **kwargs: Any) -> None:
        super().set_defaults(spelled=self.spelled, **kwargs)


# The API's keywords that a command passes a flag's value to under another name than the flag's dest (every other
# keyword is its flag's dest): `golden build PATH` is golden_build's `out`.
KEYWORD_DESTS = {
    "golden build": {"out": "path"},
    "golden new": {"item_type": "type"},
    "golden freeze": {"tasks": "task"},
    "cost": {"parameters": "params"},
}


def _worded(args: argparse.Namespace, e: UsageError | RuntimeFailure) -> str:
    """The message of a refusal, where the API named the keyword a flag's value was passed to: with the flag
    instead (`quantize search --budget 40`: "--budget takes ...; got 40.0", not "quantize.run_search: `budget`")."""
    if not isinstance(e, KeywordError):
        return str(e)
    command = f"{args.command} {getattr(args, 'action', '')}".strip()
    flag = getattr(args, "spelled", {}).get(KEYWORD_DESTS.get(command, {}).get(e.keyword, e.keyword))
    if flag is None:
        return str(e)
    v = e.value
    return e.for_flag(
        flag, " ".join(map(str, v)) if isinstance(v, list | tuple) else repr(v) if isinstance(v, str) else str(v)
    )


def _flag_parents() -> dict[str, argparse.ArgumentParser]:
    """The flags several commands share, defined once: --json, --quiet, --trust-remote-code."""
    json_p = argparse.ArgumentParser(add_help=False)
    json_p.add_argument("--json", action="store_true", help="print the result as JSON (its record) instead of text")
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument("--quiet", "-q", action="store_true", help="no progress lines or bars, no library logs")
    trust = argparse.ArgumentParser(add_help=False)
    trust.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the checkpoints' own Python code at load (off unless given here: only for checkpoints you trust)",
    )
    trust.add_argument(
        "--reread-weights",
        action="store_true",
        help="read a Hugging Face cache's weight blobs and check them against their sha256 names before anything "
        "else (the checkpoint's identity is the same either way; `gate` checks them in the background regardless)",
    )
    return {"json": json_p, "quiet": quiet, "trust": trust}


def _cost_parser(sub: Any, flags: dict[str, argparse.ArgumentParser]) -> None:
    c = sub.add_parser(
        "cost",
        parents=[flags["json"]],
        help="decode-time lower bounds and speculative-decoding arithmetic",
        description="Every time printed is a lower bound from peak figures, not a measurement. "
        "Defaults reproduce the seed worksheet (70B GQA model, hypothetical 3.0 TB/s GPU).",
    )
    c.add_argument(
        "--checkpoint",
        help="use a measured checkpoint's bytes and KV layout (a safetensors folder, or a GGUF) instead of "
        "--params/--formats",
    )
    c.add_argument("--params", type=float, help="parameter count (default 70e9)")
    c.add_argument("--formats", help=f"name=bits pairs (default {DEFAULT_FORMATS})")
    c.add_argument("--layers", type=int, help="layers (default 80); with --checkpoint: replace its KV cache")
    c.add_argument("--kv-heads", type=int, help="KV heads (default 8)")
    c.add_argument("--head-dim", type=int, help="head dimension (default 128)")
    c.add_argument(
        "--kv-bytes",
        type=float,
        help="bytes per KV element (2 = bf16, 1 = fp8; default 2, with --checkpoint its own kv_cache_scheme's)",
    )
    c.add_argument("--routed-params", type=float, help="an MoE: parameters in routed experts (all layers, all experts)")
    c.add_argument("--experts", type=int, help="an MoE: routed experts per layer (E)")
    c.add_argument("--top-k", type=int, help="an MoE: experts each token is routed to (k)")
    c.add_argument("--context", type=int, default=2048, help="context tokens per sequence")
    c.add_argument("--batch", type=int, default=32)
    c.add_argument("--hardware", default="seed", help="seed | h100-sxm | h200 | local (this machine, measured)")
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
    c.set_defaults(fn=cmd_cost)


class ItemTypes(Sequence[str]):
    """`golden new --type`'s choices: the kinds registry's templates (quantize/kinds.py), read when argparse first
    needs them (a value to check, a help text), so that building the parser imports no registry."""

    def _names(self) -> list[str]:
        from quantize.kinds import templates

        return list(templates())

    def __getitem__(self, i: Any) -> Any:
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())


def _golden_parser(sub: Any, flags: dict[str, argparse.ArgumentParser]) -> None:
    g = sub.add_parser("golden", help="verify, build, freeze, write or export a versioned golden set; size one")
    gs = g.add_subparsers(dest="action", required=True)
    gv = gs.add_parser("verify", help="check every file of a version against its MANIFEST")
    gv.add_argument("path", help="a golden version folder, e.g. golden/core/v1")
    gv.set_defaults(fn=cmd_golden_verify)
    gb = gs.add_parser("build", help="build golden/core from fetched sources (golden/core/README.md)")
    gb.add_argument("path", help="the new version folder, e.g. golden/core/v2")
    gb.add_argument("--sources", help="folder written by golden/core/fetch_sources.sh")
    gb.add_argument("--seed", type=int, default=1234)
    gb.set_defaults(fn=cmd_golden_build)
    gn = gs.add_parser("new", help="a golden set from your own JSONL items")
    gn.add_argument("out", help="the new version folder, e.g. golden/faq/v1")
    gn.add_argument("--from", dest="source", required=True, help="JSONL file, one item per line")
    gn.add_argument("--type", required=True, choices=ItemTypes(), metavar="TYPE", help="the items' type: %(choices)s")
    gn.add_argument("--task", help="task name (default: <set>_<type>)")
    gn.add_argument("--regex", help="generate: extract the answer with this regex (its group, if it has one)")
    gn.add_argument("--stop", action="append", help="generate: a stop sequence (repeat; default \\n; \\n, \\t read)")
    gn.add_argument("--max-gen-toks", type=int, default=32, help="generate: most tokens per answer (default 32)")
    gn.add_argument("--seed", type=int, default=0)
    gn.set_defaults(fn=cmd_golden_new)
    gf = gs.add_parser("freeze", help="freeze lm-eval tasks (their documents after filtering) into a golden set")
    gf.add_argument("--task", action="append", required=True, help="an lm-eval task or group (repeat)")
    gf.add_argument("--include-path", help="folder of your task YAMLs, added to lm-eval's own tasks (as lm-eval's is)")
    gf.add_argument("--out", required=True, help="the new version folder, e.g. golden/support/v1")
    gf.add_argument("--id-field", help="document field holding a stable unique id (default: its index)")
    gf.add_argument("--cluster-field", help="document field grouping items that are not independent (e.g. subject)")
    gf.add_argument("--seed", type=int, default=0, help="draws the fixed smoke ids (default 0)")
    gf.add_argument(
        "--fewshot-seed",
        type=int,
        default=1234,
        help="lm-eval's few-shot seed the pinned examples are drawn with (default 1234, lm-eval's own)",
    )
    gf.set_defaults(fn=cmd_golden_freeze)
    ge = gs.add_parser(
        "export",
        help="a suite's golden tasks as a standalone lm-eval task folder, to score any engine with lm-eval",
        description="Writes the task YAMLs and their data into OUT (atomically) and prints the lm-eval command lines "
        "(vLLM, transformers, an OpenAI-compatible server) whose --log_samples output `quantize gate` reads.",
    )
    ge.add_argument("suite", help="evaluation suite, e.g. evaluate/core-v2.yaml (its golden set, tasks and subset)")
    ge.add_argument("out", help="the folder to write, e.g. golden-tasks/")
    ge.add_argument("--force", action="store_true", help="replace an earlier export at OUT")
    ge.set_defaults(fn=cmd_golden_export)
    gz = gs.add_parser(
        "size",
        parents=[flags["json"], flags["quiet"]],
        help="flip rates between two checkpoints and the items a margin needs",
    )
    gz.add_argument("suite", help="evaluation suite (its golden set and tasks)")
    gz.add_argument("--baseline", required=True, help="checkpoint folder or score file")
    gz.add_argument("--candidate", required=True, help="checkpoint folder or score file")
    gz.add_argument("--margin", type=float, default=0.02, help="accuracy drop to resolve (default 0.02)")
    gz.add_argument("--alpha", type=float, default=0.05)
    gz.add_argument("--power", type=float, default=0.8)
    gz.set_defaults(fn=cmd_golden_size)


def _evaluation_parsers(sub: Any, flags: dict[str, argparse.ArgumentParser]) -> None:
    """eval, gate, agree: the commands that score checkpoints (and may run their code when asked)."""
    scoring = [flags["json"], flags["quiet"], flags["trust"]]
    e = sub.add_parser(
        "eval", parents=scoring, help="score a checkpoint on a golden set (lm-eval), with per-item records, cached"
    )
    e.add_argument("suite", help="evaluation suite, e.g. evaluate/core.yaml")
    e.add_argument("checkpoint", help="checkpoint folder")
    e.add_argument("--refresh", action="store_true", help="score again even when cached")
    e.add_argument("--items", action="store_true", help="with --json: include per-item records")
    e.set_defaults(fn=cmd_eval)
    gt = sub.add_parser(
        "gate",
        parents=scoring,
        help="pass or reject a candidate against its baseline, with paired statistics",
        description="Exit 0: pass; 1: rejected or inconclusive (fails closed by default); 2: bad input; "
        "3: runtime failure.",
    )
    gt.add_argument("policy", help="gate policy, e.g. gates/ci.yaml")
    gt.add_argument(
        "--baseline",
        required=True,
        help="baseline checkpoint folder (or a score .json, or lm-eval's --output_path of a --log_samples run)",
    )
    gt.add_argument(
        "--candidate",
        required=True,
        help="candidate checkpoint folder (or a score .json, or lm-eval's --output_path of a --log_samples run)",
    )
    gt.add_argument("--junit", help="also write JUnit XML here (one test case per rule)")
    gt.add_argument(
        "--card", action="store_true", help="also write the verdict into the candidate's model card (README.md)"
    )
    gt.add_argument(
        "--trust-cached-candidate",
        action="store_true",
        help="read the candidate's scores from the score cache where they are there, instead of scoring it in this "
        "run (only for a cache nobody else writes; the verdict records which: provenance.candidate_scores)",
    )
    gt.set_defaults(fn=cmd_gate)
    cd = sub.add_parser(
        "card",
        help="write a gate's verdict into a checkpoint's model card: model-index results and a verdict section",
        description="The checkpoint must be the verdict's candidate (its identity is checked). Rewrites README.md "
        "atomically; a verdict written before is replaced.",
    )
    cd.add_argument("checkpoint", help="the gated candidate's folder")
    cd.add_argument("--verdict", required=True, help="the verdict, as `quantize gate --json` printed it")
    cd.set_defaults(fn=cmd_card)
    ck = sub.add_parser(
        "cache-key",
        parents=[flags["json"]],
        help="the key a CI cache of a policy's scores is saved under (its suite, golden set and pinned versions)",
        description="Changes when and only when what keys the policy's scores changes: the suite's score-changing "
        "settings, its golden set's manifest, its tasks and agreement settings, or the installed versions of the "
        "scoring packages. The reusable action (action.yml) restores and saves the score cache under it.",
    )
    ck.add_argument("policy", help="gate policy, e.g. gates/ci.yaml")
    ck.set_defaults(fn=cmd_cache_key)
    ag = sub.add_parser(
        "agree",
        parents=scoring,
        help="token-distribution agreement of checkpoints with a baseline (mean KL, top-1, Σ min), cached",
        description="Minutes per checkpoint where scoring takes a quarter of an hour; the report shows it, "
        "and the gate reuses it.",
    )
    ag.add_argument("suite", help="evaluation suite whose agreement settings and golden items to use")
    ag.add_argument("candidates", nargs="+", help="checkpoint folders, or folders of checkpoints such as outputs")
    ag.add_argument("--baseline", required=True, help="baseline checkpoint folder")
    ag.set_defaults(fn=cmd_agree)


def _memory_size(text: str) -> int:
    from quantize.convert.recipe import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    flags = _flag_parents()
    p = _Parser(prog="quantize", description="Recipe-driven LLM quantization with true bits-per-weight accounting.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser(
        "run",
        parents=[flags["json"], flags["quiet"]],
        help="convert a model as a recipe file says",
        description="--json prints quantize.json's fields and `output`, the folder written.",
    )
    r.add_argument("recipe", help="recipe YAML, e.g. recipes/awq-g128.yaml")
    r.add_argument("--output", "-o", help="output folder (overrides the recipe's `output:`)")
    r.add_argument("--force", action="store_true", help="replace an existing output folder written by quantize")
    r.add_argument("--clean", action="store_true", help="remove folders that killed runs left beside the output")
    r.add_argument(
        "--max-memory",
        type=_memory_size,
        help="memory the run may use, e.g. 12GB or 12GiB (default: the recipe's max_memory, else MemAvailable); "
        "a run the memory plan says cannot fit is refused before anything loads",
    )
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser(
        "inspect",
        parents=[flags["json"]],
        help="true bits per weight of any safetensors or GGUF checkpoint, from headers only",
    )
    i.add_argument("checkpoint", help="checkpoint folder, .safetensors file or .gguf file")
    i.add_argument("--modules", action="store_true", help="per-module table")
    i.set_defaults(fn=cmd_inspect)

    _cost_parser(sub, flags)
    _evaluation_parsers(sub, flags)

    rp = sub.add_parser(
        "report",
        parents=[flags["json"]],
        help="bytes-versus-accuracy report (Markdown and self-contained HTML, with plots)",
    )
    rp.add_argument("checkpoints", nargs="+", help="checkpoint folders, or folders of checkpoints")
    rp.add_argument(
        "--suite", help="the suite whose cached scores to show (default: the policy's, else evaluate/core.yaml)"
    )
    rp.add_argument("--baseline", help="baseline checkpoint (marked; agreement and verdicts are against it)")
    rp.add_argument(
        "--policy",
        help="gate policy whose verdicts to show: a gate.json the gate saved beside a candidate, when it is this "
        "policy's on this pair; else one decided from cached full scores (nothing is scored)",
    )
    rp.add_argument("--hardware", default="h100-sxm", help="hardware profile for the decode-cost bounds")
    rp.add_argument("--x", choices=["bytes", "bpw"], default="bytes", help="x axis of the Pareto plots")
    rp.add_argument(
        "--out", required=True, help="output folder (written atomically; an earlier report there is replaced)"
    )
    rp.set_defaults(fn=cmd_report)

    _golden_parser(sub, flags)

    se = sub.add_parser(
        "search",
        parents=[flags["json"], flags["quiet"]],
        help="the smallest mixed-precision checkpoint that passes a gate, under a byte budget",
    )
    se.add_argument("spec", help="search recipe, e.g. recipes/search-w4-w8.yaml")
    se.add_argument(
        "--budget", type=float, action="append", help="bits per weight (repeat for several); overrides the spec"
    )
    se.add_argument("--policy", help="the gate policy every tried allocation must pass; overrides the spec's")
    se.set_defaults(fn=cmd_search)

    sw = sub.add_parser(
        "sweep",
        parents=[flags["json"]],
        help="convert and gate many candidates on a Ray cluster (a laptop is a cluster of one)",
        description="Exit 0: every candidate passed; otherwise the worst candidate's: 1 rejected or inconclusive, "
        "2 bad input, 3 failure. Running the same command again skips candidates already converted and gated.",
    )
    sw.add_argument("sweep", help="sweep file, e.g. sweeps/default.yaml")
    sw.add_argument("--address", help="the Ray cluster: local, auto, ray://HOST:10001 (overrides the file's)")
    sw.add_argument("--max-parallel", type=int, help="tasks submitted at once (0: as the resources allow)")
    sw.add_argument("--clean", action="store_true", help="remove folders killed conversions left beside the outputs")
    sw.add_argument("--plan", action="store_true", help="print the candidates, folders and tasks; run nothing (no Ray)")
    sw.set_defaults(fn=cmd_sweep)

    m = sub.add_parser("model", help="the embedded default model (SmolLM2-135M-Instruct)")
    m.add_argument("action", choices=["prepare", "path"], help="prepare: convert the GGUF once; path: print its folder")
    m.add_argument("--force", action="store_true", help="convert again")
    m.set_defaults(fn=cmd_model)
    return p


# --- exceptions to exit codes --------------------------------------------------------------------------------


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is so that it unwinds like Ctrl-C (temporary output folders
    are removed on the way out); the exit code is the shell's 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


SIGNAL_GRACE_S = 3.0  # after SIGTERM, SIGHUP or SIGINT, the unwinding's time before the process ends regardless


class _Deadline:
    """SIGTERM, SIGHUP and SIGINT unwind the program (temporary output folders are removed on the way out), and this
    thread ends the process SIGNAL_GRACE_S seconds after the first signal if the unwinding has not: a worker thread
    blocked in a call that never returns is joined by concurrent.futures on the way out and by the interpreter at
    exit, so the process otherwise waits on it forever (datasets opening a FIFO in its thread pool held `quantize
    run` 11 minutes past SIGTERM). The exit code is the same, 128 + the signal's number. A call that blocks while
    holding the GIL (a Rust or C reader opening a FIFO) stops every Python thread, this one too: the readers refuse
    such files before any library opens them (quantize/io.py)."""

    def __init__(self) -> None:
        self.signum = 0
        self.woken = threading.Event()
        threading.Thread(target=self._watch, name="quantize-signal-deadline", daemon=True).start()

    def _watch(self) -> None:
        self.woken.wait()
        if not self.signum:  # main() returned without a signal
            return
        time.sleep(SIGNAL_GRACE_S)
        name = signal.Signals(self.signum).name
        with contextlib.suppress(OSError):  # a closed stderr stops no exit
            os.write(
                2,
                f"quantize: stopped by {name}: a call that does not return held the exit for {SIGNAL_GRACE_S:g} s, "
                "so the process ended without waiting for it (a folder left beside an output is named by the next "
                "run; --clean removes it)\n".encode(),
            )
        os._exit(128 + self.signum)

    def handler(self, signum: int, _frame: Any) -> None:
        if not self.signum:
            self.signum = signum
            self.woken.set()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Signalled(signum)

    def release(self) -> None:
        """main() is done: the thread ends, unless a signal came (the exit may still be held)."""
        self.woken.set()


def main(argv: list[str] | None = None) -> int:
    _offline()
    deadline = _Deadline()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # SIGINT ignored (a background job): left ignored
            signal.signal(sig, deadline.handler)
    try:
        return _main(argv)
    finally:
        deadline.release()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        _quiet_progress()
    if getattr(args, "reread_weights", False):
        from quantize.checkpoint.files import REREAD

        os.environ[REREAD] = "1"
    earlier = _earlier_report(args)
    try:
        # every command calls the API, whose boundary refuses a bad OMP_NUM_THREADS and a path that names no file
        return args.fn(args)
    except (UsageError, RuntimeFailure) as e:
        print(f"quantize {args.command}: {e.says}: {_worded(args, e)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # the reader of our output closed it (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        if (bad := path_error(e)) is not None:  # the path the user gave cannot name a file: the API's own rule
            print(f"quantize {args.command}: {bad.says}: {bad}", file=sys.stderr)
            return bad.exit_code
        return _unexpected(args.command, e)
    except KeyboardInterrupt as e:
        command = f"{args.command} {getattr(args, 'action', '')}".strip()
        left = "; nothing was left at the output path" if {command, args.command} & WRITES_OUTPUT else ""
        if earlier is not None:  # the report replaces a folder only once it is written whole (io.atomic_dir)
            left = f"; nothing of this run was left, and the earlier report at {earlier} was kept as it was"
        how = f"stopped by {e.args[0]}" if isinstance(e, Signalled) else "interrupted"
        print(f"quantize {args.command}: {how}{left}", file=sys.stderr)
        return e.exit_code if isinstance(e, Signalled) else EXIT_INTERRUPTED
    except Exception as e:
        return _unexpected(args.command, e)


def _earlier_report(args: argparse.Namespace) -> str | None:
    """`report --out DIR` where DIR holds something (an earlier report; any other content is refused before anything
    is written): DIR, which an interrupt leaves as it was. None for every other command."""
    out = getattr(args, "out", None) if args.command == "report" else None
    if not out or os.path.islink(out) or not os.path.isdir(out):
        return None
    try:
        with os.scandir(out) as found:
            return out if any(found) else None
    except OSError:
        return None


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
