"""Gather what the other commands wrote about each checkpoint: bits (quantize.json or the header
accounting), cached scores, cached agreement with the baseline, the gate verdict, decode-cost bounds.
Nothing here scores a model: a checkpoint without cached scores appears as "not scored"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantize import cost
from quantize.accounting import bits_report
from quantize.evaluate import agreement as agr
from quantize.evaluate.score import cache_key, cache_path
from quantize.evaluate.suite import Suite, load_suite
from quantize.golden.manifest import GoldenSet, verify
from quantize.models import weights_sha256


@dataclass
class Entry:
    path: str
    label: str
    method: str
    scheme: str
    total_bytes: int
    parameters: int | None
    bits_per_weight: float | None
    qlinear_bits: float | None
    bytes_by_role: dict[str, int]
    sha256: str
    is_baseline: bool = False
    scores: dict[str, Any] | None = None  # task -> summary (acc, acc_se / bits_per_byte)
    agreement: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    decode: dict[str, Any] = field(default_factory=dict)


def _entry(path: Path) -> Entry:
    meta_path = path / "quantize.json"
    r = bits_report(path)
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        label = meta["recipe"]["resolved"].get("name") or path.name
        method, scheme = meta["method"], meta["scheme"] or "-"
        params = meta["bits"]["source_parameters"]
        sha = meta["weights_sha256"]
    else:
        label, method, scheme, params, sha = path.name, "-", r.format, r.parameters, weights_sha256(path)
    return Entry(str(path), label, method, scheme, r.total_bytes, params, 8 * r.total_bytes / params if params else None,
                 r.quantized_linear_bits_per_weight, r.bytes_by_role, sha)


def cached_scores(suite: Suite, suite_hash: str, golden: GoldenSet, entry: Entry) -> dict[str, Any] | None:
    p = cache_path(cache_key(entry.sha256, suite_hash, golden, suite.tasks or golden.tasks))
    return json.loads(p.read_text()) if p.is_file() else None


def cached_agreement(suite: Suite, golden: GoldenSet, base: Entry, entry: Entry) -> dict[str, Any] | None:
    _, p = agr.cache_paths(golden, suite.agreement, base.sha256, entry.sha256)
    return json.loads(p.read_text()) if p.is_file() else None


def decode_bounds(entry: Entry, baseline: Entry | None, hardware: cost.Hardware, batch: int, context: int,
                  gamma: int = 4) -> dict[str, Any]:
    cfg = json.loads((Path(entry.path) / "config.json").read_text())
    kv = cost.kv_layout_from_config(cfg)
    m = cost.CostModel(entry.parameters or 1, kv, hardware, context)
    out = {"batch1_ms": 1000 * m.step_bound_s(entry.total_bytes, 1), f"batch{batch}_ms": 1000 * m.step_bound_s(entry.total_bytes, batch),
           "hardware": hardware.name, "context": context, "batch": batch, "scope": cost.SCOPE}
    if baseline is not None and entry.agreement is not None and not entry.is_baseline:
        alpha = min(entry.agreement["sum_min"], 0.999)
        c = entry.total_bytes / baseline.total_bytes  # a bandwidth-bound draft costs its bytes' share of a target step
        out.update(alpha=alpha, gamma=gamma, draft_cost=c, speculative_speedup=cost.speculative_speedup(alpha, gamma, c))
    return out


def collect(checkpoints: list[Path], suite_path: str, baseline: Path | None, policy_path: str | None,
            hardware: cost.Hardware, batch: int = 32, context: int = 2048) -> list[Entry]:
    from quantize.gates.gate import decide
    from quantize.gates.policy import AgreementRule, load_policy

    paths = list(dict.fromkeys([*(p for p in [baseline] if p), *checkpoints]))
    entries = [_entry(p) for p in paths]
    base = entries[0] if baseline else None
    if base:
        base.is_baseline = True
    policy = load_policy(policy_path) if policy_path else None
    needs_agr = policy is not None and any(isinstance(r, AgreementRule) for r in policy.rules)
    suite, suite_hash = load_suite(suite_path)
    golden = verify(suite.golden)
    base_scores = cached_scores(suite, suite_hash, golden, base) if base else None
    for e in entries:
        e.scores = cached_scores(suite, suite_hash, golden, e)
        if base and not e.is_baseline:
            e.agreement = cached_agreement(suite, golden, base, e)
            if policy and e.scores and base_scores and (e.agreement or not needs_agr):
                e.verdict = decide(policy, base_scores, e.scores, e.agreement).to_dict()
        e.decode = decode_bounds(e, base, hardware, batch, context)
    return entries
