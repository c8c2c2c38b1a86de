"""`quantize search SPEC`: the smallest checkpoint that passes a gate, by mixed precision under a byte budget.

1. preflight (no model loaded): the spec, the policy and its suite, the model's units and their true
   bytes per option (meta-device model + safetensors headers); a budget below the smallest model the
   options make is refused.
2. sensitivity: each unit quantized alone, mean KL to the baseline on `measure.per_task` agreement
   items per golden task (cached by model identity, base recipe, options, units and golden set).
3. comparisons at the bytes of the common heuristic (first and last blocks at the widest option):
   the knapsack's allocation, seeded random ones, the heuristic; each measured on held-out items.
4. tries: allocations along the frontier (evenly spaced budgets from the smallest model to the
   budget, or the spec's list); one whose held-out agreement already breaks the policy's agreement
   limits is not gated; the others are converted (`quantize run` with per-layer overrides) and gated
   by bisection, the largest first, until the smallest that passes is found or `max_gates` are spent
   (`max_parallel` > 1: that many at once a round, as sweep tasks on Ray).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from quantize import records
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import BlobCheck, identity_sha256
from quantize.checkpoint.loader import LastModel, meta_model, resolve_model, usable_device
from quantize.cluster.connect import import_ray, on_cluster
from quantize.cluster.executor import Executor, say_to_stderr, state_folder
from quantize.convert import imatrix
from quantize.convert.backends import check
from quantize.convert.backends.llamacpp import importance_matrix, sixteen_bit
from quantize.convert.recipe import WEIGHT_ONLY_INT, GGUFRecipe, Scheme
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate import cache
from quantize.evaluate.agreement import LlamaCppScorer, Scorer, baseline_topk, compare, requests
from quantize.evaluate.engine import llamacpp_engine
from quantize.evaluate.score import llamacpp_lm
from quantize.flows.gate import open_policy
from quantize.io import unwritable_parent, write_text_atomic
from quantize.quiet import quiet_libraries
from quantize.records import (
    VERDICT_FILE,
    AllocationRecord,
    SearchRef,
    SearchReport,
    SensitivityRecord,
    TryRecord,
    UnitRecord,
    Verdict,
)
from quantize.search import gguf as search_gguf
from quantize.search.allocate import knapsack, random_allocation
from quantize.search.sensitivity import measure, sensitivities
from quantize.search.spec import SearchRecipe, load_search
from quantize.search.units import Layout, layout, option_name
from quantize.sweep.run import probe
from quantize.sweep.tasks import TaskSpec, convert_and_gate, execute

if TYPE_CHECKING:
    from quantize.cluster.spec import Cluster, TaskResources
    from quantize.sweep.tasks import TaskSpec

FRONTIER_POINTS = 8


def _block(name: str) -> int | None:
    m = re.search(r"\.(\d+)(\.|$)", name)
    return int(m.group(1)) if m else None


def output_dir(spec: SearchRecipe) -> Path:
    return Path(spec.output or f"outputs/{spec.name}")


def preflight(
    spec_path: str, budgets: list[float] | None, policy_path: str | None = None
) -> tuple[SearchRecipe, str, Any, Any, Path, Layout, list[float]]:
    """Everything checkable before a model loads."""
    spec, sha = load_search(spec_path)
    check(spec.base)  # what its backend runs, as each try's conversion checks it
    if policy_path:
        spec.policy = policy_path
    policy, suite = open_policy(spec.policy)
    if isinstance(spec.base, GGUFRecipe):
        search_gguf.check_options([option_name(o) for o in spec.options])
        model_dir = search_gguf.source(spec)
    else:
        model_dir = resolve_model(spec.model)
    out = output_dir(spec)
    for p in (out, out.parent / f"{out.name}.tries"):
        if p.is_symlink():  # a link, dangling or not, is not ours to write through
            raise UsageError(f"{p} is a link; remove it or set `output:` in {spec_path} to another folder")
        if p.exists():
            raise UsageError(
                f"{p} already exists (an earlier search: its search.json records what was tried, or a search that "
                f"stopped left its tries, which may be removed); remove it or set `output:` in {spec_path}"
            )
    if (parent := unwritable_parent(out)) is not None:
        raise UsageError(f"output {out}: {parent} is not a writable folder; set `output:` in {spec_path}")
    if spec.max_parallel > 1:
        import_ray()  # a round of tries at once runs on Ray: missing is exit 2 now, not after the measurements
    wanted = sorted(budgets) if budgets else spec.budgets
    if isinstance(spec.base, GGUFRecipe):  # its layout is measured in files llama.cpp writes (search/gguf.layout)
        return spec, sha, policy, suite, model_dir, Layout([], 0, 1), wanted
    options = [option_name(o) for o in spec.options]
    lay = layout(meta_model(model_dir, False), model_dir, spec.base, options, spec.unit)
    check_budget(lay, wanted)
    return spec, sha, policy, suite, model_dir, lay, wanted


def check_budget(lay: Layout, wanted: list[float]) -> None:
    """The smallest budget no lower than the smallest model the options make (UsageError)."""
    smallest = lay.bits(lay.smallest_bytes)
    if wanted[0] < smallest:
        raise UsageError(
            f"budget {wanted[0]} bits per weight is below the smallest model these options make: {smallest:.3f} "
            f"(every layer group at its smallest option; {lay.fixed_bytes / 2**20:.1f} MiB of embeddings, norms "
            "and untargeted layers stay as they are). Raise the budget, or add a smaller option"
        )


def _record(
    label: str, lay: Layout, alloc: dict[str, str], sens: dict[str, dict[str, float]], held: dict | None
) -> AllocationRecord:
    total = lay.total(alloc)
    return AllocationRecord(
        label=label,
        bytes=total,
        bits_per_weight=lay.bits(total),
        predicted_kl=sum(sens[u][o] for u, o in alloc.items()),
        holdout_kl=held["kl"] if held else None,
        holdout_top1=held["top1"] if held else None,
        options=dict(Counter(alloc.values())),
        allocation=alloc,
    )


def _not_gated(rec: AllocationRecord, why: str) -> TryRecord:
    return TryRecord(
        allocation=rec, gated=False, checkpoint=None, true_bytes=None, verdict=None, failed_rules=[], note=why
    )


def recipe_for(spec: SearchRecipe, model_dir: Path, alloc: dict[str, str], lay: Layout, out: Path) -> dict[str, Any]:
    """A plain rtn recipe: the base settings, with the units given other options as overrides."""
    base = spec.base.model_dump(mode="json", exclude={"overrides", "name", "output", "model"})
    by: dict[str, list[str]] = {}
    units = {u.name: u for u in lay.units}
    for name, opt in alloc.items():
        if opt != option_name(spec.base.scheme):
            by.setdefault(opt, []).extend(lin.name for lin in units[name].linears)
    base["overrides"] = [{"targets": sorted(names), "scheme": opt} for opt, names in sorted(by.items())]
    return {"name": spec.name, "model": str(model_dir), "output": str(out), **base}


@dataclass
class Search:
    """One search's context, filled step by step: what preflight found (no model loaded), then the measured
    sensitivities and the scorer that measures held-out agreement."""

    spec_path: str
    spec: SearchRecipe
    sha: str
    policy: Any
    suite: Any
    model_dir: Path
    lay: Layout
    wanted: list[float]
    options: list[str] = field(default_factory=list)
    scorer: Any = None
    model: Any = None
    sens_reqs: list[Any] = field(default_factory=list)
    held_reqs: list[Any] = field(default_factory=list)
    base_held: Any = None
    key: str = ""
    sens: dict[str, dict[str, float]] = field(default_factory=dict)
    sens_seconds: float = 0.0

    @property
    def out(self) -> Path:
        return output_dir(self.spec)

    @property
    def tries_dir(self) -> Path:
        return self.out.parent / f"{self.out.name}.tries"

    @property
    def base_opt(self) -> str:
        return option_name(self.spec.base.scheme)

    @property
    def up(self) -> str:
        """The widest integer option: the heuristic's choice for the first and last blocks."""
        return max((o for o in self.options if o != "keep"), key=lambda o: WEIGHT_ONLY_INT[Scheme(o)])

    @property
    def names(self) -> list[str]:
        return [u.name for u in self.lay.units]

    def recipe_for(self, alloc: dict[str, str], out: Path) -> dict[str, Any]:
        return recipe_for(self.spec, self.model_dir, alloc, self.lay, out)

    def split_requests(self) -> None:
        """The suite's agreement items: `measure.per_task` of each task for the sensitivities, the next
        `holdout_per_task` held out for the allocations measured later."""
        m, seen = self.spec.measure, Counter[str]()
        for r in requests(self.suite.golden, self.suite.agreement_tasks, m.per_task + m.holdout_per_task):
            (self.sens_reqs if seen[r.task] < m.per_task else self.held_reqs).append(r)
            seen[r.task] += 1

    def cached_sensitivities(
        self, measured: dict[str, Any], compute: Callable[[], dict[str, dict[str, float]]]
    ) -> None:
        """The sensitivities under their cache key (the model's identity, the suite, `measured`): read back, or
        computed by `compute` (timed) and stored, but only after the Hub blobs the identity was named from are read
        back and found to be what their names say (BlobCheck, as a gate stores its scores): a blob whose name lies
        stored its bytes' figures under another model's key."""
        self.key = cache.sensitivity_key(self.suite, identity_sha256(self.model_dir), measured)
        if (stored := cache.lookup_sensitivity(self.key)) is not None:
            self.sens, self.sens_seconds = stored.kl, stored.seconds
            return
        names = BlobCheck([Path(self.model_dir)])
        t0 = time.perf_counter()
        self.sens = compute()
        self.sens_seconds = round(time.perf_counter() - t0, 1)
        names.wait()
        if bad := [(u, o) for u, by in self.sens.items() for o, kl in by.items() if not math.isfinite(kl)]:
            shown = ", ".join(f"{u} at {o}" for u, o in bad[:3])
            raise UsageError(
                f"the KL to the model is not finite for {len(bad)} layer group(s) and option(s) ({shown}): the model "
                f"{self.model_dir}, or those options on it, compute NaN or infinity. Check the model first (`quantize "
                "eval` names the items), or leave those options out"
            )
        cache.store_sensitivity(SensitivityRecord(key=self.key, kl=self.sens, seconds=self.sens_seconds))

    def held(self, alloc: dict[str, str]) -> dict | None:

        if self.base_held is None:
            return None
        return measure(self.scorer, self.held_reqs, self.base_held, self.model, self.lay.units, alloc)

    def best(self, capacity_bytes: int) -> dict[str, str] | None:
        """The knapsack's allocation of the least predicted KL within `capacity_bytes` (None: nothing fits)."""
        lay = self.lay
        choice = knapsack(
            [u.bytes for u in lay.units], [self.sens[n] for n in self.names], capacity_bytes - lay.fixed_bytes
        )
        return dict(zip(self.names, choice, strict=True)) if choice else None

    def record(self, label: str, alloc: dict[str, str]) -> AllocationRecord:
        return _record(label, self.lay, alloc, self.sens, self.held(alloc))


@dataclass
class GGUFSearch(Search):
    """A search whose base is a gguf recipe (search/gguf.py): its layout, sensitivities and held-out allocations
    are GGUFs llama.cpp writes from the 16-bit GGUF (`f16`) and scores; its tries are gguf recipes."""

    f16: Path | None = None
    files: search_gguf.Files | None = None
    models: Any = None

    @property
    def base_opt(self) -> str:
        return search_gguf.base_option(self.spec.base)

    @property
    def up(self) -> str:
        return max((o for o in self.options if o != "keep"), key=search_gguf.bits_of)

    def recipe_for(self, alloc: dict[str, str], out: Path) -> dict[str, Any]:
        assert self.files is not None
        return search_gguf.try_recipe(self.spec, self.model_dir, alloc, self.lay, self.files.keep, out)

    def llama_scorer(self, gguf: Path) -> Any:
        return LlamaCppScorer(llamacpp_lm(self.suite.suite, gguf, self.models))

    def agreement(self, alloc: dict[str, str], reqs: list[Any], base: Any, alone: bool = False) -> dict:
        assert self.files is not None
        written = self.files.write(alloc, alone)
        try:
            r = compare(self.llama_scorer(written), reqs, base)
        finally:
            self.models.release()  # the engine let go before its file goes
            written.unlink()
        return {"kl": r["kl_mean"], "kl_se": r["kl_se"], "top1": r["top1"]}

    def held(self, alloc: dict[str, str]) -> dict | None:
        return None if self.base_held is None else self.agreement(alloc, self.held_reqs, self.base_held)


def run_search(
    spec_path: str, budgets: list[float] | None = None, quiet: bool = False, policy: str | None = None
) -> SearchReport:

    found = preflight(spec_path, budgets, policy)
    if isinstance(found[0].base, GGUFRecipe):
        return run_gguf_search(GGUFSearch(spec_path, *found), quiet)
    s = Search(spec_path, *found)
    s.options = [option_name(o) for o in s.spec.options]
    with quiet_libraries(quiet):
        measure_sensitivity(s, LastModel(), quiet)
        result, comparisons, tries = _search(s, quiet)
    return publish(s, report_of(s, comparisons, tries, result), result)


def _search(s: Search, quiet: bool) -> tuple[Path | None, list[AllocationRecord], list[TryRecord]]:
    """The comparisons at equal bytes, the frontier and its bisection, once the sensitivities are known."""
    comparisons = compare_at_equal_bytes(s)
    frontier, tries = frontier_of(s)
    result, gated, (lo, hi) = bisect(s, frontier, quiet)
    tries += gated
    for i, (_, rec) in enumerate(frontier):  # the frontier points never gated, for the record
        if all(t.allocation is not rec for t in tries):
            why = (
                f"not gated: max_gates ({s.spec.max_gates}) were spent before the bisection reached it"
                if lo <= i <= hi
                else "not gated: the bisection settled without it"
            )
            tries.append(_not_gated(rec, why))
    tries.sort(key=lambda t: t.allocation.bytes)
    return result, comparisons, tries


def run_gguf_search(s: GGUFSearch, quiet: bool) -> SearchReport:
    """A GGUF base's search (search/gguf.py): in a scratch folder beside the output, the 16-bit GGUF, the layout
    measured in llama.cpp's files (with the base's importance matrix, where it has a calibration), the budget checked
    against it, the sensitivities; then as any search."""
    s.options = [option_name(o) for o in s.spec.options]
    threads = s.spec.base.threads or os.cpu_count() or 1
    s.models = LastModel()
    with quiet_libraries(quiet), search_gguf.workspace(s.out) as scratch:
        s.f16 = sixteen_bit(s.model_dir, scratch, threads).path
        cal = s.spec.base.calibration
        matrix = importance_matrix(s.f16, cal, threads) if cal is not None else None
        s.files = search_gguf.Files(s.f16, scratch, threads, s.spec.base.type, s.spec.unit, matrix)
        s.lay = search_gguf.layout(s.files, s.options)
        check_budget(s.lay, s.wanted)
        measure_gguf_sensitivity(s, quiet)
        result, comparisons, tries = _search(s, quiet)
        s.models.release()
    return publish(s, report_of(s, comparisons, tries, result), result)


def measure_gguf_sensitivity(s: GGUFSearch, quiet: bool) -> None:
    """Each unit alone at each option in a GGUF otherwise 16-bit, mean KL to the 16-bit GGUF on the sensitivity
    items, in llama.cpp (cached under the source's identity, the settings and llama.cpp's version)."""
    from tqdm import tqdm

    assert s.f16 is not None
    m = s.spec.measure
    s.split_requests()
    base = s.llama_scorer(s.f16)
    base_sens = baseline_topk(base, s.sens_reqs, m.top_k)
    s.base_held = baseline_topk(base, s.held_reqs, m.top_k) if s.held_reqs else None
    measured = dict(
        base=s.spec.base.model_dump(mode="json", exclude={"name", "output", "model", "description"}),
        options=s.options,
        unit=s.spec.unit,
        per_task=m.per_task,
        top_k=m.top_k,
        on=["llamacpp", llamacpp_engine(s.suite.suite)],  # as its scores are keyed: build, switches, settings
        # the importance matrix every file is quantized with, by its values: the calibration's text, not its name
        matrix=imatrix.digest(s.files.matrix.collected.values) if s.files and s.files.matrix else None,
    )

    def each_alone() -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        todo = [(u.name, o) for u in s.lay.units for o in s.options if o != "keep"]
        for u, o in tqdm(todo, desc="sensitivity (layer group × option, llama.cpp)", disable=quiet, unit="file"):
            out.setdefault(u, {"keep": 0.0})[o] = s.agreement({u: o}, s.sens_reqs, base_sens, alone=True)["kl"]
        return out

    s.cached_sensitivities(measured, each_alone)


def measure_sensitivity(s: Search, models: Any, quiet: bool) -> None:
    """Each unit quantized alone, mean KL to the baseline on the sensitivity items (cached); the baseline's
    top-k on the held-out items for the allocations measured later."""
    m, suite = s.spec.measure, s.suite
    on = usable_device(suite.suite.device, f"suite {suite.path}: `device:`")
    dtype = suite.suite.model_dtype(on)
    s.model, tok = models.get(s.model_dir, dtype=dtype, on=on)
    s.scorer = Scorer(s.model, tok, suite.suite.batch_size, suite.suite.max_length)
    s.split_requests()
    base_sens = baseline_topk(s.scorer, s.sens_reqs, m.top_k)
    s.base_held = baseline_topk(s.scorer, s.held_reqs, m.top_k) if s.held_reqs else None
    base = s.spec.base.model_dump(mode="json", exclude={"name", "output", "model", "description"})
    measured = dict(
        base=base, options=s.options, unit=s.spec.unit, per_task=m.per_task, top_k=m.top_k, on=[on.split(":")[0], dtype]
    )
    s.cached_sensitivities(
        measured,
        lambda: sensitivities(s.scorer, s.sens_reqs, base_sens, s.model, s.lay.units, s.options, progress=not quiet),
    )


def compare_at_equal_bytes(s: Search) -> list[AllocationRecord]:
    """At the bytes of the common heuristic (first and last blocks at the widest option): the heuristic, the
    knapsack's allocation and seeded random ones, each measured on held-out items."""
    blocks = [b for b in (_block(n) for n in s.names) if b is not None]
    if not blocks or s.up == s.base_opt:
        return []
    first, last = min(blocks), max(blocks)
    heur = {n: (s.up if _block(n) in (first, last) else s.base_opt) for n in s.names}
    cap = s.lay.total(heur)
    out = [s.record(f"heuristic: blocks {first} and {last} at {s.up}", heur)]
    if (searched := s.best(cap)) is not None:
        out.append(s.record("searched (same bytes)", searched))
    for i in range(s.spec.measure.random_allocations):
        ra = random_allocation([u.bytes for u in s.lay.units], cap - s.lay.fixed_bytes, s.base_opt, s.up, seed=i)
        out.append(s.record(f"random {i + 1} (same bytes)", dict(zip(s.names, ra, strict=True))))
    return out


def frontier_of(s: Search) -> tuple[list[tuple[dict[str, str], AllocationRecord]], list[TryRecord]]:
    """Allocations along the frontier, cheapest first (the spec's budgets, or evenly spaced ones from the
    smallest model to the budget); those already outside the policy's agreement limits are not worth a gate."""
    smallest = s.lay.bits(s.lay.smallest_bytes)
    wanted = s.wanted
    points = (
        wanted
        if len(wanted) > 1
        else [smallest + (wanted[0] - smallest) * (i + 1) / FRONTIER_POINTS for i in range(FRONTIER_POINTS)]
    )
    kl_max, top1_min = s.policy.agreement_limits()
    tries: list[TryRecord] = []
    frontier: list[tuple[dict[str, str], AllocationRecord]] = []
    for k, bits in enumerate(points, 1):
        alloc = s.best(s.lay.budget_bytes(bits))
        if alloc is None or (frontier and alloc == frontier[-1][0]):
            continue
        rec = s.record(f"point {k} (budget {bits:.3f})", alloc)
        breaks = rec.holdout_kl is not None and (
            (kl_max is not None and rec.holdout_kl > kl_max)
            or (top1_min is not None and rec.holdout_top1 is not None and rec.holdout_top1 < top1_min)
        )
        if breaks:
            tries.append(_not_gated(rec, "outside the policy's agreement limits on held-out items"))
        else:
            frontier.append((alloc, rec))
    return frontier, tries


def round_points(lo: int, hi: int, k: int, first: bool) -> list[int]:
    """The frontier indices to gate next, k at once, over the undecided range [lo, hi] (larger index: more bytes,
    less damage; a pass at i is assumed to hold above i). The first round takes the largest point hi (if it fails,
    nothing within the budget passes) and k − 1 points splitting [lo, hi − 1]; later rounds k points splitting
    [lo, hi] into k + 1 parts. k = 1 is bisection: hi, then the midpoints (lo + hi) // 2."""
    if lo > hi or k < 1:
        return []
    if first:
        return sorted({hi, *round_points(lo, hi - 1, k - 1, False)})
    if k == 1:
        return [(lo + hi) // 2]
    n = hi - lo + 1
    return sorted({lo + (n * (j + 1)) // (k + 1) for j in range(min(k, n))})


def settle(lo: int, hi: int, outcomes: dict[int, bool]) -> tuple[int, int, int | None]:
    """The range left undecided after a round's outcomes (index -> passed), and the smallest index that passed."""
    passed = [i for i, ok in outcomes.items() if ok]
    best = min(passed) if passed else None
    if best is not None:
        hi = min(hi, best - 1)
    below = [i for i, ok in outcomes.items() if not ok and (best is None or i < best)]
    if below:
        lo = max(lo, max(below) + 1)
    return lo, hi, best


def bisect(
    s: Search, frontier: list[tuple[dict[str, str], AllocationRecord]], quiet: bool
) -> tuple[Path | None, list[TryRecord], tuple[int, int]]:
    """Gate the frontier (more bytes, less damage) round by round: the largest first, since if it fails nothing
    within the budget passes; then the smallest that passes. `max_parallel` points a round (`round_points`),
    converted and gated at once on the cluster's executor (`run_chains`); 1 (the default) is bisection, one after
    the other in this process, in at most 1 + log2(n) gates. `max_gates` caps the gates in all. Returns the
    result, the tries gated, and the frontier range [lo, hi] still undecided when it stopped (empty: lo > hi)."""
    result, tries = None, []
    lo, hi, first = 0, len(frontier) - 1, True
    k = s.spec.max_parallel
    while lo <= hi and len(tries) < s.spec.max_gates:
        points = round_points(lo, hi, min(k, s.spec.max_gates - len(tries)), first)
        ckpts = {i: s.tries_dir / f"try-{len(tries) + n + 1}" for n, i in enumerate(points)}
        recipes = {i: s.recipe_for(frontier[i][0], ckpts[i]) for i in points}
        gated = _gate_round(s, recipes, ckpts, quiet)
        outcomes = {}
        for i in points:
            true_bytes, verdict = gated[i]
            tries.append(
                TryRecord(
                    allocation=frontier[i][1],
                    gated=True,
                    checkpoint=str(ckpts[i]),
                    true_bytes=true_bytes,
                    verdict=verdict.verdict,
                    failed_rules=[r.rule for r in verdict.rules if r.verdict != "pass"],
                )
            )
            outcomes[i] = verdict.verdict == "pass"
        if first and not outcomes[len(frontier) - 1]:
            lo, hi = 1, 0  # the largest allocation within the budget fails: nothing below it is left undecided
            break
        lo, hi, best = settle(lo, hi, outcomes)
        if best is not None:
            result = ckpts[best]
        first = False
    return result, tries, (lo, hi)


def _gate_round(
    s: Search, recipes: dict[int, dict[str, Any]], ckpts: dict[int, Path], quiet: bool
) -> dict[int, tuple[int, Any]]:
    """Each point's true bytes and verdict: converted and gated in this process for one point
    (sweep/tasks.convert_and_gate), else as a sweep's tasks on Ray (`run_chains`); either way the same two tasks per
    point."""
    chains = []
    for i, r in recipes.items():
        rpath = _write_try_recipe(s.tries_dir, ckpts[i], r)
        common = {"candidate": ckpts[i].name, "policy": s.spec.policy, "baseline": str(s.model_dir)}
        chains.append(
            (
                TaskSpec(kind="convert", recipe=str(rpath), checkpoint=str(ckpts[i]), model=str(s.model_dir), **common),
                TaskSpec(kind="gate", checkpoint=str(ckpts[i]), **common),
            )
        )
    if s.spec.max_parallel == 1 or len(recipes) == 1:
        with quiet_libraries(quiet):
            verdicts = [convert_and_gate(c, g) for c, g in chains]
        return {i: (bits_report(ckpts[i]).total_bytes, v) for i, v in zip(recipes, verdicts, strict=True)}
    failed = run_chains(chains, s.spec.cluster, s.spec.resources, s.tries_dir / "state")
    if failed:
        raise RuntimeFailure(f"a try could not be converted or gated: {failed[0]}")
    return {i: (bits_report(ckpts[i]).total_bytes, records.read(Verdict, ckpts[i] / VERDICT_FILE)) for i in recipes}


def run_chains(
    chains: list[tuple[TaskSpec, TaskSpec]],
    cluster: Cluster,
    resources: TaskResources,
    state: Path,
    max_retries: int = 2,
) -> list[str]:
    """Convert-then-gate chains (the sweep's TaskSpecs) on the cluster, the baseline scored once first beside the
    conversions, each on quantize/cluster's executor as a sweep's tasks; returns what failed, one line each ([]
    when every chain finished)."""
    ray = import_ray()
    ex = Executor(state_folder(state), max_retries, say_to_stderr("search"), execute)
    baseline = resources.baseline or resources.gate
    base = ex.add(TaskSpec(kind="baseline", policy=chains[0][1].policy, baseline=chains[0][1].baseline), baseline)
    for c, g in chains:
        ex.add(g, resources.gate, after=[base, ex.add(c, resources.convert)])
    on_cluster(ray, ex, cluster, probe=probe)
    return [f"{t.task.label} (exit {t.exit_code}): {t.message}" for t in ex.tracks if t.state != "done"]


def _write_try_recipe(tries_dir: Path, ckpt: Path, recipe: dict[str, Any]) -> Path:

    tries_dir.mkdir(parents=True, exist_ok=True)
    rpath = tries_dir / f"{ckpt.name}.yaml"
    write_text_atomic(rpath, yaml.safe_dump(recipe, sort_keys=False))
    return rpath


def report_of(
    s: Search, comparisons: list[AllocationRecord], tries: list[TryRecord], result: Path | None
) -> SearchReport:
    drivers = [] if result is not None else sorted(s.names, key=lambda n: -s.sens[n].get(s.base_opt, 0.0))[:5]
    lay = s.lay
    return SearchReport(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        spec=str(s.spec_path),
        spec_sha256=s.sha,
        resolved=s.spec.model_dump(mode="json"),
        model=str(s.model_dir),
        policy=s.spec.policy,
        budgets_bits=s.wanted,
        source_parameters=lay.source_parameters,
        fixed_bytes=lay.fixed_bytes,
        smallest_bits_per_weight=lay.bits(lay.smallest_bytes),
        sensitivity_key=s.key,
        sensitivity_seconds=s.sens_seconds,
        items={"sensitivity": len(s.sens_reqs), "holdout": len(s.held_reqs)},
        units=[UnitRecord(name=u.name, parameters=u.parameters, bytes=u.bytes, kl=s.sens[u.name]) for u in lay.units],
        comparisons=comparisons,
        tries=tries,
        result=str(s.out) if result else None,
        drivers=drivers,
    )


def publish(s: Search, report: SearchReport, result: Path | None) -> SearchReport:
    """The smallest passing try becomes the output: its RunRecord read through the model, given the search's
    reference and written again whole (records.write), search.json beside it, and only then the folder renamed into
    place (a run killed before the rename publishes nothing; after it, a complete output). Without a pass,
    search.json goes beside the tries."""
    if result is None:
        s.tries_dir.mkdir(parents=True, exist_ok=True)
        records.write(s.tries_dir / "search.json", report)
        return report
    out = s.out
    for t in report.tries:
        if t.checkpoint == str(result):
            t.checkpoint = str(out)
    run = records.read(records.RunRecord, result / "quantize.json")
    t_index = next(i for i, t in enumerate(report.tries) if t.checkpoint == str(out))
    run.search = SearchRef(
        spec=str(s.spec_path),
        spec_sha256=s.sha,
        report="search.json",
        try_index=t_index + 1,
        options=report.tries[t_index].allocation.options,
        holdout_kl=report.tries[t_index].allocation.holdout_kl,
    )
    records.write(result / "quantize.json", run)
    records.write(result / "search.json", report)
    result.rename(out)
    return report
