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
   by bisection, the largest first, until the smallest that passes is found or `max_gates` are spent.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from quantize import cache, records
from quantize.convert.recipe import WEIGHT_ONLY_INT, Scheme
from quantize.errors import UsageError
from quantize.io import sha256_bytes, sha256_json
from quantize.records import (
    AllocationRecord,
    SearchRef,
    SearchReport,
    SensitivityRecord,
    TryRecord,
    UnitRecord,
)
from quantize.search.allocate import knapsack, random_allocation
from quantize.search.spec import SearchRecipe, load_search
from quantize.search.units import Layout, option_name

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
    from quantize.checkpoint.loader import resolve_model
    from quantize.convert.plan import meta_model
    from quantize.flows.gate import check_rules
    from quantize.gates.policy import load_policy
    from quantize.search.units import layout
    from quantize.suite import open_suite

    spec, sha = load_search(spec_path)
    if policy_path:
        spec.policy = policy_path
    policy = load_policy(spec.policy)
    suite = open_suite(policy.suite)
    check_rules(policy, suite)
    model_dir = resolve_model(spec.model)
    out = output_dir(spec)
    for p in (out, out.parent / f"{out.name}.tries"):
        if p.exists():
            raise UsageError(
                f"{p} already exists (an earlier search: its search.json records what was tried); remove it or "
                f"set `output:` in {spec_path}"
            )
    options = [option_name(o) for o in spec.options]
    lay = layout(meta_model(model_dir, False), model_dir, spec.base, options, spec.unit)
    smallest = lay.bits(lay.smallest_bytes)
    wanted = sorted(budgets) if budgets else spec.budgets
    if wanted[0] < smallest:
        raise UsageError(
            f"budget {wanted[0]} bits per weight is below the smallest model these options make: {smallest:.3f} "
            f"(every layer group at its smallest option; {lay.fixed_bytes / 2**20:.1f} MiB of embeddings, norms "
            "and untargeted layers stay as they are). Raise the budget, or add a smaller option"
        )
    return spec, sha, policy, suite, model_dir, lay, wanted


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


def _agreement_limits(policy: Any) -> tuple[float | None, float | None]:
    from quantize.gates.policy import AgreementRule

    kl = next((r.max for r in policy.rules if isinstance(r, AgreementRule) and r.agreement.value == "kl"), None)
    top1 = next((r.min for r in policy.rules if isinstance(r, AgreementRule) and r.agreement.value == "top1"), None)
    return kl, top1


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


def run_search(
    spec_path: str, budgets: list[float] | None = None, quiet: bool = False, policy: str | None = None
) -> SearchReport:
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.agreement import Scorer, baseline_topk, requests
    from quantize.quiet import quiet_libraries
    from quantize.search.sensitivity import measure, sensitivities

    spec, sha, policy, suite, model_dir, lay, wanted = preflight(spec_path, budgets, policy)
    options = [option_name(o) for o in spec.options]
    base_opt = option_name(spec.base.scheme)
    ints = [o for o in options if o != "keep"]
    up = max(ints, key=lambda o: WEIGHT_ONLY_INT[Scheme(o)])
    out = output_dir(spec)
    tries_dir = out.parent / f"{out.name}.tries"
    m = spec.measure
    with quiet_libraries(quiet):
        models = LastModel()
        model, tok = models.get(model_dir, dtype="float32", on="cpu")
        scorer = Scorer(model, tok, suite.suite.batch_size, suite.suite.max_length or 2048)
        reqs = requests(suite.golden, suite.agreement_tasks, m.per_task + m.holdout_per_task)
        seen: Counter[str] = Counter()
        sens_reqs, held_reqs = [], []
        for r in reqs:
            (sens_reqs if seen[r.task] < m.per_task else held_reqs).append(r)
            seen[r.task] += 1
        base_sens = baseline_topk(scorer, sens_reqs, m.top_k)
        base_held = baseline_topk(scorer, held_reqs, m.top_k) if held_reqs else None
        from quantize.checkpoint.files import identity_sha256

        key = sha256_json(
            {
                "v": 1,
                "model": identity_sha256(model_dir),
                "base": spec.base.model_dump(mode="json", exclude={"name", "output", "model", "description"}),
                "options": options,
                "unit": spec.unit,
                "golden": suite.golden.manifest_sha256,
                "suite": suite.sha256,
                "per_task": m.per_task,
                "top_k": m.top_k,
            }
        )
        path = cache.cache_dir() / "search" / f"sensitivity-{key[:32]}.json"
        t0 = time.perf_counter()
        if path.is_file():
            stored = records.read(SensitivityRecord, path)
            sens, sens_seconds = stored.kl, stored.seconds
        else:
            sens = sensitivities(scorer, sens_reqs, base_sens, model, lay.units, options, progress=not quiet)
            sens_seconds = round(time.perf_counter() - t0, 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            records.write(path, SensitivityRecord(key=key, kl=sens, seconds=sens_seconds))
        names = [u.name for u in lay.units]

        def held(alloc: dict[str, str]) -> dict | None:
            return measure(scorer, held_reqs, base_held, model, lay.units, alloc) if base_held else None

        def best(capacity_bytes: int) -> dict[str, str] | None:
            choice = knapsack([u.bytes for u in lay.units], [sens[n] for n in names], capacity_bytes - lay.fixed_bytes)
            return dict(zip(names, choice, strict=True)) if choice else None

        # comparisons at the heuristic's bytes: first and last blocks at the widest option
        comparisons = []
        blocks = [b for b in (_block(n) for n in names) if b is not None]
        if blocks and up != base_opt:
            first, last = min(blocks), max(blocks)
            heur = {n: (up if _block(n) in (first, last) else base_opt) for n in names}
            cap = lay.total(heur)
            comparisons.append(_record(f"heuristic: blocks {first} and {last} at {up}", lay, heur, sens, held(heur)))
            if (searched := best(cap)) is not None:
                comparisons.append(_record("searched (same bytes)", lay, searched, sens, held(searched)))
            for i in range(m.random_allocations):
                ra = random_allocation([u.bytes for u in lay.units], cap - lay.fixed_bytes, base_opt, up, seed=i)
                rand = dict(zip(names, ra, strict=True))
                comparisons.append(_record(f"random {i + 1} (same bytes)", lay, rand, sens, held(rand)))
        # the frontier: cheapest first
        smallest = lay.bits(lay.smallest_bytes)
        points = (
            wanted
            if len(wanted) > 1
            else [smallest + (wanted[0] - smallest) * (i + 1) / FRONTIER_POINTS for i in range(FRONTIER_POINTS)]
        )
        kl_max, top1_min = _agreement_limits(policy)
        tries: list[TryRecord] = []
        frontier: list[tuple[dict[str, str], AllocationRecord]] = []
        for k, bits in enumerate(points, 1):
            alloc = best(lay.budget_bytes(bits))
            if alloc is None or (frontier and alloc == frontier[-1][0]):
                continue
            rec = _record(f"point {k} (budget {bits:.3f})", lay, alloc, sens, held(alloc))
            breaks = rec.holdout_kl is not None and (
                (kl_max is not None and rec.holdout_kl > kl_max)
                or (top1_min is not None and rec.holdout_top1 is not None and rec.holdout_top1 < top1_min)
            )
            if breaks:  # already outside the policy's agreement limits: not worth a gate
                tries.append(_not_gated(rec, "outside the policy's agreement limits on held-out items"))
            else:
                frontier.append((alloc, rec))
        # gate by bisection over the frontier (more bytes, less damage): the largest first, since if it fails
        # nothing within the budget passes; then the smallest that passes, in at most 1 + log2(n) gates
        result = None
        lo, hi = 0, len(frontier) - 1
        gated = 0
        order = [hi] if frontier else []
        while order and gated < spec.max_gates:
            i = order.pop()
            alloc, rec = frontier[i]
            gated += 1
            ckpt = tries_dir / f"try-{gated}"
            recipe = recipe_for(spec, model_dir, alloc, lay, ckpt)
            true_bytes, verdict = _convert_and_gate(spec, recipe, tries_dir, ckpt, model_dir, quiet)
            failed = [r.rule for r in verdict.rules if r.verdict != "pass"]
            tries.append(
                TryRecord(
                    allocation=rec,
                    gated=True,
                    checkpoint=str(ckpt),
                    true_bytes=true_bytes,
                    verdict=verdict.verdict,
                    failed_rules=failed,
                )
            )
            if verdict.verdict == "pass":
                result, hi = ckpt, i - 1
            else:
                lo = i + 1
                if result is None and i == len(frontier) - 1:
                    break  # the largest allocation within the budget fails
            if lo <= hi:
                order.append((lo + hi) // 2)
        for _, rec in frontier:  # the frontier points never gated, for the record
            if all(t.allocation is not rec for t in tries):
                tries.append(_not_gated(rec, "not gated: the bisection settled without it"))
        tries.sort(key=lambda t: t.allocation.bytes)
    drivers = []
    if result is None:
        drivers = sorted(names, key=lambda n: -sens[n].get(base_opt, 0.0))[:5]
    report = SearchReport(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        spec=str(spec_path),
        spec_sha256=sha,
        resolved=spec.model_dump(mode="json"),
        model=str(model_dir),
        policy=spec.policy,
        budgets_bits=wanted,
        source_parameters=lay.source_parameters,
        fixed_bytes=lay.fixed_bytes,
        smallest_bits_per_weight=smallest,
        sensitivity_key=key,
        sensitivity_seconds=sens_seconds,
        items={"sensitivity": len(sens_reqs), "holdout": len(held_reqs)},
        units=[UnitRecord(name=u.name, parameters=u.parameters, bytes=u.bytes, kl=sens[u.name]) for u in lay.units],
        comparisons=comparisons,
        tries=tries,
        result=str(out) if result else None,
        drivers=drivers,
    )
    if result is not None:
        # the smallest passing try becomes the output: renamed into place, its quantize.json pointing at the search
        result.rename(out)
        for t in report.tries:
            if t.checkpoint == str(result):
                t.checkpoint = str(out)
        run = records.read(records.RunRecord, out / "quantize.json")
        t_index = next(i for i, t in enumerate(report.tries) if t.checkpoint == str(out))
        run.search = SearchRef(
            spec=str(spec_path),
            spec_sha256=sha,
            report="search.json",
            try_index=t_index + 1,
            options=report.tries[t_index].allocation.options,
            holdout_kl=report.tries[t_index].allocation.holdout_kl or 0.0,
        )
        records.write(out / "quantize.json", run)
        records.write(out / "search.json", report)
    else:
        tries_dir.mkdir(parents=True, exist_ok=True)
        records.write(tries_dir / "search.json", report)
    return report


def _convert_and_gate(
    spec: SearchRecipe, recipe: dict[str, Any], tries_dir: Path, ckpt: Path, model_dir: Path, quiet: bool
) -> tuple[int, Any]:
    from quantize.checkpoint.accounting import bits_report
    from quantize.convert.engine import convert
    from quantize.convert.recipe import parse_recipe
    from quantize.flows.gate import run_gate
    from quantize.io import write_text_atomic

    tries_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(recipe, sort_keys=False)
    rpath = tries_dir / f"{ckpt.name}.yaml"
    write_text_atomic(rpath, text)
    r = parse_recipe(recipe, str(rpath))
    convert(r, sha256_bytes(text.encode()), str(rpath), ckpt, force=False, quiet=quiet)
    true_bytes = bits_report(ckpt).total_bytes
    verdict = run_gate(spec.policy, model_dir, ckpt)
    return true_bytes, verdict
