"""The token-cost model: lower bounds on decode time, and speculative-decoding arithmetic.

From shared/seed "Making Each Token Cheaper" (Pope et al. 2022; Leviathan et al. 2023):

    memory_time  = (weight_bytes + batch × KV_bytes_per_sequence) / HBM_bandwidth
    compute_time = 2 × parameters × batch × positions / peak_FLOPs
    step_time   >= max(memory_time, compute_time)

    E[tokens per target step] = (1 − α^(γ+1)) / (1 − α)
    speedup                   = E[tokens] / (γ·c + verify_ratio)

Every time here is a LOWER BOUND from peak figures, not a measurement: a real
step can only be slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantize.errors import UsageError

SCOPE = "lower bounds from peak figures; not measurements"


class Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hbm_bytes_per_second: float = Field(gt=0)
    peak_dense_flops: float = Field(gt=0)
    memory_bytes: float | None = Field(None, gt=0)
    source: str


# Datasheet figures; the 'seed' profile is the tutorial's hypothetical round numbers.
HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in [
        Hardware(
            name="seed",
            hbm_bytes_per_second=3.0e12,
            peak_dense_flops=1.0e15,
            memory_bytes=80 * 2**30,
            source="hypothetical round numbers from shared/seed 'Making Each Token Cheaper' (80 GiB GPU)",
        ),
        Hardware(
            name="h100-sxm",
            hbm_bytes_per_second=3.35e12,
            peak_dense_flops=989e12,
            memory_bytes=80e9,
            source="NVIDIA H100 datasheet: SXM 80 GB, 3.35 TB/s, BF16 dense 989 TFLOP/s (1,979 is with sparsity)",
        ),
        Hardware(
            name="h200",
            hbm_bytes_per_second=4.8e12,
            peak_dense_flops=989e12,
            memory_bytes=141e9,
            source="NVIDIA H200 datasheet: SXM 141 GB, 4.8 TB/s, BF16 dense 989 TFLOP/s (1,979 is with sparsity)",
        ),
    ]
}

# Bits per weight charged for a format when no checkpoint is measured (the seed's worksheet).
FORMAT_BITS = {"bf16": 16.0, "fp8_e4m3": 8.0, "int4_g128": 4.15}


@dataclass(frozen=True)
class KVLayout:
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_element: float

    def bytes_per_sequence(self, context_tokens: int) -> float:
        # K and V: 2 × layers × kv_heads × head_dim × bytes, per token
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element * context_tokens


def check_speculation(alpha: float, gamma: int, draft_cost: float) -> None:
    if not 0 <= alpha < 1:
        raise UsageError(f"invalid speculation setting: alpha must satisfy 0 <= alpha < 1, got {alpha}")
    if gamma < 1:
        raise UsageError(f"invalid speculation setting: gamma (draft length) must be at least 1, got {gamma}")
    if draft_cost < 0:
        raise UsageError(f"invalid speculation setting: draft cost c must be >= 0, got {draft_cost}")


def check_batch(batch: int) -> None:
    if batch < 1:
        raise UsageError(f"invalid batch setting: batch must be at least 1, got {batch}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per target step] = 1 + α + … + α^γ, acceptances i.i.d. with rate α."""
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speculative_speedup(alpha: float, gamma: int, draft_cost: float, verify_ratio: float = 1.0) -> float:
    """Leviathan et al.'s walltime improvement; verify_ratio > 1 charges a compute-bound verification."""
    return expected_tokens(alpha, gamma) / (gamma * draft_cost + verify_ratio)


def break_even_alpha(gamma: int, draft_cost: float, verify_ratio: float = 1.0) -> float:
    """The α at which speculation is exactly as fast as plain decoding: E[tokens](α, γ) = γ·c + verify_ratio.

    E[tokens] rises with α from 1 to γ + 1, so the root is unique (Brent's method); 0 when even α = 0
    breaks even, and the top of the range when no α < 1 does."""
    from scipy.optimize import brentq

    target = gamma * draft_cost + verify_ratio
    lo, hi = 0.0, 1.0 - 1e-12
    if expected_tokens(lo, gamma) >= target:
        return 0.0
    if expected_tokens(hi, gamma) <= target:
        return hi
    return float(brentq(lambda a: expected_tokens(a, gamma) - target, lo, hi, xtol=1e-14))


@dataclass(frozen=True)
class CostModel:
    parameters: float
    kv: KVLayout
    hardware: Hardware
    context_tokens: int

    @property
    def kv_bytes_per_sequence(self) -> float:
        return self.kv.bytes_per_sequence(self.context_tokens)

    def memory_s(self, weight_bytes: float, batch: int) -> float:
        return (weight_bytes + batch * self.kv_bytes_per_sequence) / self.hardware.hbm_bytes_per_second

    def compute_s(self, batch: int, positions: int) -> float:
        return 2 * self.parameters * batch * positions / self.hardware.peak_dense_flops

    def step_bound_s(self, weight_bytes: float, batch: int, positions: int = 1) -> float:
        check_batch(batch)
        return max(self.memory_s(weight_bytes, batch), self.compute_s(batch, positions))

    def verify_ratio(self, weight_bytes: float, batch: int, gamma: int) -> float:
        """Cost of verifying γ+1 positions per sequence relative to a plain step."""
        return self.step_bound_s(weight_bytes, batch, gamma + 1) / self.step_bound_s(weight_bytes, batch, 1)

    def compute_bound_batch(self, weight_bytes: float, positions: int, limit: int = 10**7) -> int | None:
        """Smallest batch whose step is compute-bound when each sequence brings `positions` positions."""
        # compute grows by 2·N·positions/F per sequence, memory by KV/B: solve once, then check.
        per_seq_compute = 2 * self.parameters * positions / self.hardware.peak_dense_flops
        per_seq_memory = self.kv_bytes_per_sequence / self.hardware.hbm_bytes_per_second
        if per_seq_compute <= per_seq_memory:
            return None
        b = max(1, math.ceil((weight_bytes / self.hardware.hbm_bytes_per_second) / (per_seq_compute - per_seq_memory)))
        while b > 1 and self.compute_s(b - 1, positions) >= self.memory_s(weight_bytes, b - 1):
            b -= 1
        while self.compute_s(b, positions) < self.memory_s(weight_bytes, b):
            b += 1
        return b if b <= limit else None

    def format_row(
        self,
        weight_bytes: float,
        batch: int,
        gamma: int,
        alpha: float,
        draft_cost: float,
        bits_per_weight: float | None = None,
    ) -> FormatRow:
        mem1, comp1 = self.memory_s(weight_bytes, 0), self.compute_s(1, 1)
        memb, compb = self.memory_s(weight_bytes, batch), self.compute_s(batch, 1)
        ratio = self.verify_ratio(weight_bytes, batch, gamma)
        row: dict[str, Any] = {
            "bits_per_weight": bits_per_weight,
            "weight_bytes": weight_bytes,
            "weight_gb": weight_bytes / 1e9,
            "weight_gib": weight_bytes / 2**30,
            "batch1_weight_bound_ms": 1000 * mem1,
            "batch1_step_bound_ms": 1000
            * max(mem1 + self.kv_bytes_per_sequence / self.hardware.hbm_bytes_per_second, comp1),
            "batch1_compute_ms": 1000 * comp1,
            "batch_step_bound_ms": 1000 * max(memb, compb),
            "batch_memory_ms": 1000 * memb,
            "batch_compute_ms": 1000 * compb,
            "batch_binding": "compute" if compb > memb else "memory",
            "verify_cost_ratio": ratio,
            "speculative_speedup_at_batch": speculative_speedup(alpha, gamma, draft_cost, ratio),
            "verify_compute_bound_batch": self.compute_bound_batch(weight_bytes, gamma + 1),
        }
        if self.hardware.memory_bytes:
            need = weight_bytes + batch * self.kv_bytes_per_sequence
            row["fits_weights_only"] = weight_bytes <= self.hardware.memory_bytes
            row["fits_with_batch_kv"] = need <= self.hardware.memory_bytes
            row["memory_needed_gib"] = need / 2**30
        return FormatRow(**row)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FormatRow(_Frozen):
    """One format's bounds (milliseconds are lower bounds): batch 1 and the workload's batch, verification."""

    bits_per_weight: float | None
    weight_bytes: float
    weight_gb: float
    weight_gib: float
    batch1_weight_bound_ms: float
    batch1_step_bound_ms: float
    batch1_compute_ms: float
    batch_step_bound_ms: float
    batch_memory_ms: float
    batch_compute_ms: float
    batch_binding: Literal["compute", "memory"]
    verify_cost_ratio: float
    speculative_speedup_at_batch: float
    verify_compute_bound_batch: int | None  # None: verification stays memory-bound at any batch
    fits_weights_only: bool | None = None  # None: the hardware profile names no memory size
    fits_with_batch_kv: bool | None = None
    memory_needed_gib: float | None = None


class Speculation(_Frozen):
    alpha: float
    gamma: int
    draft_cost: float
    assumptions: str
    expected_tokens_per_target_step: float
    speedup_free_verification: float
    break_even_alpha: float
    plain_step_ms: float
    iteration_ms: float
    average_tpot_ms: float


class AlphaPoint(_Frozen):
    alpha: float
    expected_tokens: float
    speedup: float


class GammaPoint(_Frozen):
    gamma: int
    speedup: float


class SlowDraft(_Frozen):
    draft_cost: float
    speedup: float


class Sweeps(_Frozen):
    """The seed's exercises, with free verification."""

    alpha_sweep: list[AlphaPoint]
    gamma_sweep: list[GammaPoint]
    best_gamma: int
    slow_draft: SlowDraft


class CheckpointBytes(_Frozen):
    path: str
    total_bytes: int
    parameters: int
    bits_per_weight: float | None
    quantized_linear_bits_per_weight: float | None


class CostTable(_Frozen):
    """`quantize cost`: bounds per format for one model, hardware and workload."""

    scope: str
    parameters: float
    hardware: Hardware
    batch: int
    context_tokens: int
    kv_layout: dict[str, float]
    kv_bytes_per_sequence: float
    formats: dict[str, FormatRow]
    speculation: Speculation


class ProjectedCost(CostTable):
    projection: str  # what the projection assumes: always printed beside its figures


class TokenCost(CostTable):
    """The whole result: a measured checkpoint's bytes, a labelled projection, the exercises, when asked for."""

    checkpoint: CheckpointBytes | None = None
    projection: ProjectedCost | None = None
    sweeps: Sweeps | None = None

    def to_data(self) -> dict[str, Any]:
        """`quantize cost --json`: the parts not asked for are left out, not written as null."""
        return self.model_dump(exclude={k for k in ("checkpoint", "projection", "sweeps") if getattr(self, k) is None})


def speculation_summary(alpha: float, gamma: int, draft_cost: float, plain_step_ms: float) -> Speculation:
    check_speculation(alpha, gamma, draft_cost)
    s = speculative_speedup(alpha, gamma, draft_cost)
    return Speculation(
        alpha=alpha,
        gamma=gamma,
        draft_cost=draft_cost,
        assumptions="acceptances i.i.d. with rate alpha; gamma+1 target positions verified at the cost of one step",
        expected_tokens_per_target_step=expected_tokens(alpha, gamma),
        speedup_free_verification=s,
        break_even_alpha=break_even_alpha(gamma, draft_cost),
        plain_step_ms=plain_step_ms,
        iteration_ms=plain_step_ms * (gamma * draft_cost + 1),
        average_tpot_ms=plain_step_ms / s,
    )


@dataclass(frozen=True)
class Workload:
    """What the decode steps serve: tokens of context per sequence, the batch, and the speculation
    setting (acceptance rate α, draft length γ, draft step cost c, a measured plain step)."""

    context_tokens: int = 2048
    batch: int = 32
    alpha: float = 0.8
    gamma: int = 4
    draft_cost: float = 0.1
    plain_step_ms: float = 25.0

    def check(self) -> None:
        if self.context_tokens < 0:
            raise UsageError(f"context length must be >= 0, got {self.context_tokens}")
        check_batch(self.batch)
        check_speculation(self.alpha, self.gamma, self.draft_cost)


def token_cost(
    parameters: float,
    format_bits: dict[str, float],
    kv: KVLayout,
    hardware: Hardware,
    work: Workload,
    measured_bytes: dict[str, float] | None = None,
) -> TokenCost:
    """The calculator: one row per format. measured_bytes replaces bits × parameters / 8 where given."""
    if parameters <= 0:
        raise UsageError(f"parameters must be positive, got {parameters}")
    work.check()
    model = CostModel(parameters, kv, hardware, work.context_tokens)
    measured_bytes = measured_bytes or {}
    formats = {}
    for name, bits in format_bits.items():
        wb = measured_bytes.get(name, parameters * bits / 8)
        formats[name] = model.format_row(
            wb, work.batch, work.gamma, work.alpha, work.draft_cost, bits_per_weight=8 * wb / parameters
        )
    return TokenCost(
        scope=SCOPE,
        parameters=parameters,
        hardware=hardware,
        batch=work.batch,
        context_tokens=work.context_tokens,
        kv_layout=kv.__dict__,
        kv_bytes_per_sequence=model.kv_bytes_per_sequence,
        formats=formats,
        speculation=speculation_summary(work.alpha, work.gamma, work.draft_cost, work.plain_step_ms),
    )


def exercise_sweeps(gamma: int, draft_cost: float, alpha: float) -> Sweeps:
    """The seed's exercises: α sweep, best γ in 1..8, and a slow draft (c = 0.5). Free verification."""
    check_speculation(alpha, gamma, draft_cost)
    alphas = [0.2, 0.3, 0.6, 0.8, 0.9]
    gammas = {g: speculative_speedup(alpha, g, draft_cost) for g in range(1, 9)}
    best = max(gammas, key=gammas.get)
    return Sweeps(
        alpha_sweep=[
            AlphaPoint(
                alpha=a, expected_tokens=expected_tokens(a, gamma), speedup=speculative_speedup(a, gamma, draft_cost)
            )
            for a in alphas
        ],
        gamma_sweep=[GammaPoint(gamma=g, speedup=s) for g, s in gammas.items()],
        best_gamma=best,
        slow_draft=SlowDraft(draft_cost=0.5, speedup=speculative_speedup(alpha, gamma, 0.5)),
    )


def kv_bytes(config: dict[str, Any]) -> float:
    """Bytes per stored K or V element: a quantized KV cache's (`quantization_config.kv_cache_scheme.num_bits`,
    as llm-compressor writes it: 1 for FP8), else 2 (a 16-bit cache)."""
    qc = config.get("quantization_config")
    kv = qc.get("kv_cache_scheme") if isinstance(qc, dict) else None
    bits = kv.get("num_bits") if isinstance(kv, dict) else None
    return bits / 8 if isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 16 else 2


def kv_layout_from_config(config: dict[str, Any], bytes_per_element: float | None = None) -> KVLayout:
    """The KV layout config.json describes; bytes per element: given, else the checkpoint's own (kv_bytes)."""
    bytes_per_element = kv_bytes(config) if bytes_per_element is None else bytes_per_element
    try:
        layers = config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
    except KeyError as e:
        raise UsageError(
            f"config.json lacks {e} needed for the KV layout; pass --layers/--kv-heads/--head-dim instead"
        ) from None
    return KVLayout(layers, kv_heads, head_dim, bytes_per_element)


def checkpoint_cost(
    checkpoint: Any,
    hardware: Hardware,
    work: Workload,
    project_params: float | None = None,
    project_share: float | None = None,
) -> TokenCost:
    """Bounds from a measured checkpoint's bytes; optionally a labelled projection onto a larger model."""
    from quantize.checkpoint.accounting import bits_report
    from quantize.checkpoint.files import read_config

    report = bits_report(checkpoint)
    if not report.parameters:
        raise UsageError(
            f"cannot count the parameters of {checkpoint} ({'; '.join(report.notes)}); use --params/--formats"
        )
    try:
        cfg = read_config(checkpoint)
    except UsageError as e:
        raise UsageError(
            f"{e}; without it the KV layout is unknown: use --params and --layers/--kv-heads/--head-dim"
        ) from None
    kv = kv_layout_from_config(cfg)
    out = token_cost(
        report.parameters,
        {"measured": 8 * report.total_bytes / report.parameters},
        kv,
        hardware,
        work,
        measured_bytes={"measured": report.total_bytes},
    )
    measured = CheckpointBytes(
        path=str(checkpoint),
        total_bytes=report.total_bytes,
        parameters=report.parameters,
        bits_per_weight=report.bits_per_weight,
        quantized_linear_bits_per_weight=report.quantized_linear_bits_per_weight,
    )
    if project_params:
        share = project_share if project_share is not None else report.quantized_linear_parameters / report.parameters
        if not 0 <= share <= 1:
            raise UsageError(f"--project-share must lie in [0, 1], got {share}")
        qbits = report.quantized_linear_bits_per_weight or 16.0
        bits = share * qbits + (1 - share) * 16.0
        proj = token_cost(project_params, {"projected": bits}, kv, hardware, work)
        label = (
            f"PROJECTION, not a measurement: {share:.1%} of {project_params:.3g} parameters at the checkpoint's "
            "measured "
            f"{qbits:.3f} quantized-linear bits per weight, the rest at 16 bits; KV layout of the measured checkpoint"
            + (
                ""
                if project_share is not None
                else " (share taken from the measured checkpoint: larger models of the family usually have a larger "
                "linear share; pass --project-share)"
            )
        )
        return out.model_copy(
            update={
                "checkpoint": measured,
                "projection": ProjectedCost(
                    **proj.model_dump(exclude={"checkpoint", "projection", "sweeps"}), projection=label
                ),
            }
        )
    return out.model_copy(update={"checkpoint": measured})
