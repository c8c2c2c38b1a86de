"""The token-cost model: lower bounds on decode time, and speculative-decoding arithmetic.

From shared/seed "Making Each Token Cheaper" (Pope et al. 2022; Leviathan et al. 2023):

    memory_time  = (weight_bytes_read + batch × KV_bytes_per_sequence) / HBM_bandwidth
    compute_time = 2 × active_parameters × batch × positions / peak_FLOPs
    step_time   >= max(memory_time, compute_time)

A mixture of experts (MoE layer l: E_l routed experts, each token routed to k_l of them, R_l = the bytes and
P_l the parameters of all E_l experts together), with T = batch × positions tokens routed per step and the
routing assumed uniform (every expert equally likely, tokens independent):

    active_parameters  = N − Σ_l P_l + Σ_l P_l × k_l / E_l
    weight_bytes_read  = (W − Σ_l R_l) + Σ_l R_l × (1 − (1 − k_l/E_l)^T)     (W: all stored weight bytes)

since an expert escapes one token with probability 1 − k/E, so E × (1 − (1 − k/E)^T) experts are read in
expectation. At T = 1 that is exactly k experts whatever the router; above it uniform routing maximizes the
expectation (for independent tokens), so a skewed router can make a real step faster than this figure. A dense
model has no MoE layer: weight_bytes_read = W and active_parameters = N.

KV bytes per sequence = Σ_layers (values_l × tokens_held_l × bytes_per_element + state_l), with
values_l = 2 × kv_heads_l × head_dim_l (MHA/GQA, each layer its own) or kv_lora_rank + qk_rope_head_dim (MLA,
plus index_head_dim for an indexer's keys), 0 for a layer without attention; tokens_held = context, or
min(context, window) for a sliding-window or chunked layer; state_l the fixed bytes of a recurrent, state-space
or convolution layer, constant in the context (checkpoint/architecture.cache_spec); a compressed-attention layer
(DeepSeek-V4) adds its compressor's entries, one per rate tokens, and the tokens awaiting their window.

    E[tokens per target step] = (1 − α^(γ+1)) / (1 − α)
    speedup                   = E[tokens] / (γ·c + verify_ratio)

Every time here is a LOWER BOUND from peak figures, not a measurement: a real
step can only be slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantize.checkpoint import ggufs
from quantize.checkpoint.accounting import BitsReport, bits_report, gguf_report, mtp_parts
from quantize.checkpoint.architecture import (
    CONV_BYTES,
    MAX_SHAPE,
    CacheSpec,
    Compressor,
    LayerCache,
    cache_spec,
    layer_count,
    moe_spec,
    mtp_of,
)
from quantize.checkpoint.files import read_config
from quantize.errors import UsageError

SCOPE = "lower bounds from peak figures; not measurements"


class Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hbm_bytes_per_second: float = Field(gt=0, allow_inf_nan=False)
    peak_dense_flops: float = Field(gt=0, allow_inf_nan=False)
    memory_bytes: float | None = Field(None, gt=0, allow_inf_nan=False)
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


ROUTING_ASSUMPTION = (
    "uniform routing: each routed token picks k of the E experts, every expert equally likely, tokens "
    "independent; a step reads E × (1 − (1 − k/E)^T) experts of each MoE layer for T = batch × positions tokens "
    "(exact at T = 1; above it an expectation, not a bound: a skewed router reads fewer)"
)


# the most layers, KV heads or head dimensions a shape given by hand may hold (as config.json's:
# architecture.MAX_SHAPE): a figure per layer is built, and `--layers 100000000000` grew without bound (models have
# tens to hundreds of layers)
# what a workload and a model may be: far past any served today, short of a float's range (10**400 tokens, a
# draft cost of 1e308 or 1e308 parameters ended in OverflowError or ZeroDivisionError, exit 3: a review)
MAX_CONTEXT = 2**31
MAX_BATCH = 10**7
MAX_GAMMA = 1_000
MAX_DRAFT_COST = 1_000.0
MAX_PARAMETERS = 1e15
# bytes a K or V element may take (--kv-bytes, kv_bytes): a float64 is 8; 1e308 priced an Infinity cache, exit 0
MAX_KV_BYTES = 64
MAX_BITS_PER_WEIGHT = 64  # a format's bits per weight: float64's (1e300 overflowed the bytes to inf: a review)
MAX_STEP_MS = 1e9  # a measured plain step, about 11.6 days (1e308 priced an Infinity iteration: a review)


@dataclass(frozen=True)
class KVLayout:
    """A uniform MHA/GQA cache (the CLI's --layers/--kv-heads/--head-dim): every layer holds the whole context."""

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_element: float

    def __post_init__(self) -> None:
        """Whole numbers of at least 1 and a finite positive element size (UsageError naming the flag): `--layers
        -80` priced a negative cache and exited 0."""
        for name, flag in (("layers", "--layers"), ("kv_heads", "--kv-heads"), ("head_dim", "--head-dim")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SHAPE:
                raise UsageError(f"{flag} ({name}) = {v!r}: give a whole number from 1 to {MAX_SHAPE:,}")
        check_kv_bytes(self.bytes_per_element, "--kv-bytes (bytes_per_element)")

    def bytes_per_sequence(self, context_tokens: int) -> float:
        # K and V: 2 × layers × kv_heads × head_dim × bytes, per token
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element * context_tokens

    def layer_bytes(self, context_tokens: int) -> list[LayerKV]:
        per = 2 * self.kv_heads * self.head_dim * self.bytes_per_element * context_tokens
        return [
            LayerKV(layer=i, attention="full_attention", tokens_held=context_tokens, bytes=per, kv_bytes=per)
            for i in range(self.layers)
        ]

    def describe(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KVCache:
    """A decode cache layer by layer, as config.json describes it (checkpoint/architecture.cache_spec): the KV
    values one token stores in each layer (MHA/GQA 2 × kv_heads × head_dim, each layer its own; MLA
    kv_lora_rank + qk_rope_head_dim; 0 for a layer without attention), each layer's window (None: it holds the
    whole context), and each layer's fixed state bytes (recurrent, state-space and convolution state: constant
    in the context)."""

    attention: str
    values_per_token: int  # the most KV values one layer stores per token
    kinds: tuple[str, ...]  # per layer: full_attention, sliding_attention, chunked_attention, gated_deltanet, ...
    windows: tuple[int | None, ...]  # per layer
    bytes_per_element: float
    formula: str = ""
    layer_values: tuple[int, ...] = ()  # per layer KV values per token; (): values_per_token in every layer
    state_bytes: tuple[float, ...] = ()  # per layer fixed state bytes; (): none
    state_dtype: str = ""
    layer_formulas: tuple[str, ...] = ()  # each kind of layer's cache, once: "kind: formula"
    compressors: tuple[Compressor | None, ...] = ()  # per layer, a compressed-attention layer's (DeepSeek-V4); ()
    activation_bytes: float = CONV_BYTES  # bytes a value a compressor keeps pending, in the model's dtype
    note: str = ""  # what the figures stand for beyond the formula: an engine that does not load the checkpoint

    def _values(self) -> tuple[int, ...]:
        return self.layer_values or (self.values_per_token,) * len(self.kinds)

    def layer_bytes(self, context_tokens: int) -> list[LayerKV]:
        """bytes of layer l = values_l × min(context, window_l) × bytes_per_element + its fixed state bytes, and for
        a compressed-attention layer (rate m) entry_values × (context // m) × bytes_per_element + pending_values ×
        (context mod m) × activation_bytes + overlap_values × activation_bytes once context >= m."""
        out = []
        states = self.state_bytes or (0.0,) * len(self.kinds)
        compressors = self.compressors or (None,) * len(self.kinds)
        layers = zip(self.kinds, self.windows, self._values(), states, compressors, strict=True)
        for i, (kind, w, v, st, comp) in enumerate(layers):
            held = (context_tokens if w is None else min(context_tokens, w)) if v else 0
            kv = v * held * self.bytes_per_element
            entries = 0
            if comp is not None:
                entries, pending = divmod(context_tokens, comp.rate)
                kv += comp.entry_values * entries * self.bytes_per_element
                kv += (comp.pending_values * pending + (comp.overlap_values if entries else 0)) * self.activation_bytes
            out.append(
                LayerKV(
                    layer=i,
                    attention=kind,
                    tokens_held=held,
                    bytes=kv + st,
                    kv_bytes=kv,
                    state_bytes=st,
                    compressed_entries=entries,
                )
            )
        return out

    def bytes_per_sequence(self, context_tokens: int) -> float:
        """KV and state bytes one sequence keeps (what each decode step reads of it)."""
        return sum(layer.bytes for layer in self.layer_bytes(context_tokens))

    def state_bytes_per_sequence(self) -> float:
        return float(sum(self.state_bytes))

    def describe(self) -> dict[str, Any]:
        compressors = self.compressors or (None,) * len(self.kinds)
        windowed = [
            w
            for w, v, c in zip(self.windows, self._values(), compressors, strict=True)
            if w is not None and v and not c
        ]
        out = {
            "attention": self.attention,
            "layers": len(self.windows),
            "kv_layers": sum(1 for v in self._values() if v),
            "values_per_token_per_layer": self.values_per_token,
            "values_formula": self.formula,
            "windowed_layers": len(windowed),
            "window": max(windowed) if windowed else None,
            "bytes_per_element": self.bytes_per_element,
        }
        if self.layer_values and len(set(self.layer_values) - {0}) > 1:
            out["values_per_token_by_layer"] = list(self.layer_values)
        if any(self.state_bytes):
            out["state_layers"] = sum(1 for b in self.state_bytes if b)
            out["state_bytes_per_sequence"] = self.state_bytes_per_sequence()
            out["state_dtype"] = self.state_dtype
        if any(compressors):
            out["compressed_layers"] = sum(1 for c in compressors if c)
        if self.layer_formulas:
            out["layer_formulas"] = list(self.layer_formulas)
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class RoutedExperts:
    """One MoE layer's routed experts: E of them, k per token; bytes and parameters of all E together."""

    layer: int
    experts: int
    top_k: int
    bytes: float
    parameters: int

    def __post_init__(self) -> None:
        """1 <= k <= E <= MAX_SHAPE, E <= parameters (each expert holds one at least), bytes finite and not
        negative: E = 0 divided by zero, k > E made more parameters active than the model has, and experts of no
        parameters divided by zero in moe_cost (a review; the command line's --routed-params refused them)."""
        whole = all(type(v) is int for v in (self.layer, self.experts, self.top_k, self.parameters))
        if not whole or not 1 <= self.top_k <= self.experts <= min(MAX_SHAPE, self.parameters) or self.layer < 0:
            raise UsageError(
                f"routed experts of layer {self.layer!r}: need whole numbers 1 <= top_k ({self.top_k!r}) <= experts "
                f"({self.experts!r}) <= {MAX_SHAPE:,}, parameters ({self.parameters!r}) at least one per expert, and "
                "a layer >= 0"
            )
        check_positive(self.bytes, f"routed experts of layer {self.layer}: bytes", zero=True)


@dataclass(frozen=True)
class Weights:
    """A model's stored weight bytes, of which the routed experts of each MoE layer (none for a dense model)."""

    total_bytes: float
    routed: tuple[RoutedExperts, ...] = ()
    gathered: tuple[tuple[float, int], ...] = ()  # (bytes, rows) of each table read a row per token (BitsReport's)

    def read_bytes(self, tokens: int) -> float:
        """The bytes one step reads when it routes `tokens` tokens (weight_bytes_read): of a gathered table
        (an embedding looked up, not multiplied), min(tokens, rows) rows of bytes / rows each."""
        looked_up = sum(b * min(tokens, rows) / rows for b, rows in self.gathered)
        dense = self.total_bytes - sum(b for b, _ in self.gathered)
        return weight_bytes_read(dense, [(r.bytes, r.experts, r.top_k) for r in self.routed], tokens) + looked_up


def expected_experts_read(experts: int, top_k: int, tokens: int) -> float:
    """E[distinct experts one MoE layer reads] = E × (1 − (1 − k/E)^T) for T tokens routed uniformly (each
    token picks k of the E experts, every expert equally likely, tokens independent)."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def weight_bytes_read(total_bytes: float, routed: Sequence[tuple[float, int, int]], tokens: int) -> float:
    """weight_bytes_read = (W − Σ_l R_l) + Σ_l R_l × (1 − (1 − k_l/E_l)^T), for routed = [(R_l, E_l, k_l)]:
    the bytes outside routed experts every step, and the expected share of each layer's experts."""
    dense = total_bytes - sum(r for r, _, _ in routed)
    return dense + sum(r * expected_experts_read(e, k, tokens) / e for r, e, k in routed)


def active_parameter_count(parameters: int, routed: Sequence[RoutedExperts]) -> int:
    """active_parameters = N − Σ_l P_l + Σ_l P_l × k_l / E_l (rounded to a whole parameter: equal experts make
    P_l a multiple of E_l, so it is exact)."""
    return (
        parameters - sum(r.parameters for r in routed) + sum(round(r.parameters * r.top_k / r.experts) for r in routed)
    )


def tokens_to_read_share(experts: int, top_k: int, share: float) -> int:
    """The fewest tokens T per step whose routing reads at least `share` of a layer's experts in expectation:
    1 − (1 − k/E)^T ≥ share  ⇔  T = ⌈ln(1 − share) / ln(1 − k/E)⌉ (1 when k = E)."""
    if top_k >= experts:
        return 1
    t = math.ceil(math.log(1 - share) / math.log(1 - top_k / experts) - 1e-12)
    return max(1, t)


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


def check_positive(value: Any, what: str, zero: bool = False) -> None:
    """A finite number above 0 (`zero`: at least 0), else a UsageError naming `what`."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        raise UsageError(f"{what} = {value!r}: give a finite number {'of at least 0' if zero else 'above 0'}")


def check_kv_bytes(value: Any, what: str) -> None:
    """Bytes a KV element: a finite number above 0 and at most MAX_KV_BYTES, else a UsageError naming `what`."""
    check_positive(value, what)
    if value > MAX_KV_BYTES:
        raise UsageError(f"{what} = {value!r}: give at most {MAX_KV_BYTES} bytes a K or V element (float64 is 8)")


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


def _weights(w: float | Weights) -> Weights:
    return w if isinstance(w, Weights) else Weights(w)


@dataclass(frozen=True)
class CostModel:
    """The bounds of one model on one GPU at one context. `parameters` are the parameters each position
    multiplies (an MoE's active parameters); weights are bytes (a dense model) or Weights (routed experts)."""

    parameters: float
    kv: KVLayout | KVCache
    hardware: Hardware
    context_tokens: int

    @property
    def kv_bytes_per_sequence(self) -> float:
        """What one sequence keeps at the context: KV plus any fixed recurrent/convolution state."""
        return self.kv.bytes_per_sequence(self.context_tokens)

    def memory_s(self, weights: float | Weights, batch: int, positions: int = 1) -> float:
        """(weight_bytes_read(batch × positions) + batch × KV) / bandwidth."""
        read = _weights(weights).read_bytes(batch * positions)
        return (read + batch * self.kv_bytes_per_sequence) / self.hardware.hbm_bytes_per_second

    def compute_s(self, batch: int, positions: int) -> float:
        return 2 * self.parameters * batch * positions / self.hardware.peak_dense_flops

    def step_bound_s(self, weights: float | Weights, batch: int, positions: int = 1) -> float:
        check_batch(batch)
        return max(self.memory_s(weights, batch, positions), self.compute_s(batch, positions))

    def verify_ratio(self, weights: float | Weights, batch: int, gamma: int) -> float:
        """Cost of verifying γ+1 positions per sequence relative to a plain step."""
        return self.step_bound_s(weights, batch, gamma + 1) / self.step_bound_s(weights, batch, 1)

    def compute_bound_batch(self, weights: float | Weights, positions: int, limit: int = 10**7) -> int | None:
        """Smallest batch whose step is compute-bound when each sequence brings `positions` positions."""
        # compute grows by 2·N·positions/F per sequence, memory by at most KV/B plus the weights read: at the
        # batch solving that with all weights read the step is compute-bound; compute − memory is convex in the
        # batch and negative at 0, so the compute-bound batches form one run and bisection finds its start.
        w = _weights(weights)
        per_seq_compute = 2 * self.parameters * positions / self.hardware.peak_dense_flops
        per_seq_memory = self.kv_bytes_per_sequence / self.hardware.hbm_bytes_per_second
        if per_seq_compute <= per_seq_memory:
            return None
        hi = max(
            1, math.ceil((w.total_bytes / self.hardware.hbm_bytes_per_second) / (per_seq_compute - per_seq_memory))
        )
        while self.compute_s(hi, positions) < self.memory_s(w, hi, positions):  # rounding at the edge
            hi += 1
        lo = 0  # compute-bound at hi, not at lo (batch 0 reads the dense weights, computes nothing)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.compute_s(mid, positions) >= self.memory_s(w, mid, positions):
                hi = mid
            else:
                lo = mid
        return hi if hi <= limit else None

    def format_row(
        self,
        weights: float | Weights,
        batch: int,
        gamma: int,
        alpha: float,
        draft_cost: float,
        bits_per_weight: float | None = None,
    ) -> FormatRow:
        w = _weights(weights)
        weight_bytes = w.total_bytes
        read1 = w.read_bytes(1)
        mem1, comp1 = read1 / self.hardware.hbm_bytes_per_second, self.compute_s(1, 1)
        memb, compb = self.memory_s(w, batch), self.compute_s(batch, 1)
        ratio = self.verify_ratio(w, batch, gamma)
        row: dict[str, Any] = {
            "bits_per_weight": bits_per_weight,
            "weight_bytes": weight_bytes,
            "weight_gb": weight_bytes / 1e9,
            "weight_gib": weight_bytes / 2**30,
            "batch1_weight_read_bytes": read1,
            "batch_weight_read_bytes": w.read_bytes(batch),
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
            "verify_compute_bound_batch": self.compute_bound_batch(w, gamma + 1),
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
    # what one batch-1 step reads: every weight of a dense model, k/E of the experts, one row of a looked-up table
    batch1_weight_read_bytes: float
    batch_weight_read_bytes: float  # at the workload's batch (uniform routing for an MoE)
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


class LayerKV(_Frozen):
    """One layer's KV cache for one sequence at the workload's context."""

    layer: int
    attention: str  # full_attention, sliding_attention, chunked_attention, gated_deltanet, mamba2, short_conv, ...
    tokens_held: int  # the context, or min(context, window); 0 for a layer without a KV cache
    bytes: float  # kv_bytes + state_bytes
    kv_bytes: float | None = None  # grows with the context up to the window; a compressor's entries and pending tokens
    state_bytes: float = 0.0  # recurrent / SSM / convolution state, constant in the context
    compressed_entries: int = 0  # a compressed-attention layer's entries (DeepSeek-V4), within kv_bytes


class ExpertLayerCost(_Frozen):
    layer: int
    experts: int
    top_k: int
    routed_parameters: int  # all E experts
    active_routed_parameters: int  # P × k / E
    routed_bytes: float  # all E experts, as stored (without a checkpoint: priced at the first format's bits)


class MoECost(_Frozen):
    """How the routed experts enter the bounds: the assumption, each MoE layer, and where batching stops
    amortizing their reads."""

    assumption: str
    layers: list[ExpertLayerCost]
    routed_parameters: int
    experts_read_share_batch1: float  # of all routed-expert bytes, in expectation
    experts_read_share_at_batch: float
    tokens_reading_half: int  # tokens per step (batch × positions) that read half of every MoE layer's experts
    tokens_reading_90pct: int
    tokens_reading_99pct: int


class CheckpointBytes(_Frozen):
    path: str
    total_bytes: int
    parameters: int
    bits_per_weight: float | None
    quantized_linear_bits_per_weight: float | None


class NotRead(_Frozen):
    """What a checkpoint stores that a plain decode step does not read: its multi-token-prediction module (the
    accounting's part `mtp`, checkpoint/architecture.mtp_of), left out of the parameters and bytes priced."""

    part: str
    layers: list[int]  # its layers stored after the decoder's (DeepSeek-V3's 61)
    prefixes: list[str] = []  # its tensors under a prefix of their own, by prefix (Qwen3-Next's `mtp`)
    bytes: int
    parameters: int
    note: str


class CostTable(_Frozen):
    """`quantize cost`: bounds per format for one model, hardware and workload."""

    scope: str
    parameters: float
    active_parameters: int  # multiplied per position: parameters outside routed experts + k/E of the experts
    hardware: Hardware
    batch: int
    context_tokens: int
    kv_layout: dict[str, Any]
    kv_bytes_per_sequence: float  # at context_tokens: KV, plus the fixed state of recurrent/convolution layers
    kv_bytes_per_layer: list[LayerKV]
    state_bytes_per_sequence: float = 0.0  # the fixed part of kv_bytes_per_sequence (constant in the context)
    formats: dict[str, FormatRow]
    speculation: Speculation
    moe: MoECost | None = None  # None: a dense model


class ProjectedCost(CostTable):
    projection: str  # what the projection assumes: always printed beside its figures


class TokenCost(CostTable):
    """The whole result: a measured checkpoint's bytes, a labelled projection, the exercises, when asked for."""

    checkpoint: CheckpointBytes | None = None
    not_read: NotRead | None = None  # what the checkpoint stores that the bounds leave out (its MTP layers)
    projection: ProjectedCost | None = None
    sweeps: Sweeps | None = None

    def to_data(self) -> dict[str, Any]:
        """`quantize cost --json`: the parts not asked for are left out, not written as null."""
        return self.model_dump(
            exclude={k for k in ("checkpoint", "not_read", "projection", "sweeps", "moe") if getattr(self, k) is None}
        )


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
        c = self.context_tokens
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_CONTEXT:
            raise UsageError(f"context length must be a whole number from 0 to {MAX_CONTEXT:,}, got {str(c)[:40]}")
        for what, v, most in (("batch", self.batch, MAX_BATCH), ("gamma (draft length)", self.gamma, MAX_GAMMA)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                raise UsageError(f"{what} must be a whole number from 1 to {most:,}, got {str(v)[:40]}")
        check_positive(self.alpha, "alpha (acceptance rate)", zero=True)
        check_positive(self.draft_cost, "draft cost c", zero=True)
        check_speculation(self.alpha, self.gamma, self.draft_cost)
        if self.draft_cost > MAX_DRAFT_COST:
            raise UsageError(f"draft cost c = {self.draft_cost:g}: give a step-time ratio up to {MAX_DRAFT_COST:g}")
        check_positive(self.plain_step_ms, "plain step (ms)")
        if self.plain_step_ms > MAX_STEP_MS:
            raise UsageError(
                f"plain step = {self.plain_step_ms:g} ms: give a measured step of at most {MAX_STEP_MS:g} ms"
            )


def token_cost(
    parameters: float,
    format_bits: dict[str, float],
    kv: KVLayout | KVCache,
    hardware: Hardware,
    work: Workload,
    measured_bytes: dict[str, float | Weights] | None = None,
    routed: Sequence[RoutedExperts] = (),
) -> TokenCost:
    """The calculator: one row per format. measured_bytes replaces bits × parameters / 8 where given; `routed`
    (an MoE's experts, their bytes as stored) prices each format's experts at its bits too."""
    if not 0 < parameters <= MAX_PARAMETERS:
        raise UsageError(f"parameters must be above 0 and at most {MAX_PARAMETERS:g}, got {parameters}")
    if (routed_total := sum(r.parameters for r in routed)) > parameters:
        raise UsageError(
            f"the routed experts hold {routed_total:,} parameters, more than the model's {parameters:,.0f}: the "
            "active parameters would be negative; give the routed experts' parameters as part of the model's"
        )
    work.check()
    for name, bits in format_bits.items():
        check_positive(bits, f"format {name}: bits per weight")
        if bits > MAX_BITS_PER_WEIGHT:
            raise UsageError(f"format {name}: {bits:g} bits per weight; give at most {MAX_BITS_PER_WEIGHT} (float64's)")
    active = active_parameter_count(round(parameters), routed) if routed else round(parameters)
    model = CostModel(active, kv, hardware, work.context_tokens)
    measured_bytes = measured_bytes or {}
    formats = {}
    priced: list[Weights] = []
    for name, bits in format_bits.items():
        w = measured_bytes.get(name)
        if w is None:
            w = Weights(parameters * bits / 8, tuple(replace(r, bytes=r.parameters * bits / 8) for r in routed))
        priced.append(w := _weights(w))
        formats[name] = model.format_row(
            w, work.batch, work.gamma, work.alpha, work.draft_cost, bits_per_weight=8 * w.total_bytes / parameters
        )
    return TokenCost(
        scope=SCOPE,
        parameters=parameters,
        active_parameters=active,
        hardware=hardware,
        batch=work.batch,
        context_tokens=work.context_tokens,
        kv_layout=kv.describe(),
        kv_bytes_per_sequence=model.kv_bytes_per_sequence,
        kv_bytes_per_layer=kv.layer_bytes(work.context_tokens),
        state_bytes_per_sequence=kv.state_bytes_per_sequence() if isinstance(kv, KVCache) else 0.0,
        formats=formats,
        speculation=speculation_summary(work.alpha, work.gamma, work.draft_cost, work.plain_step_ms),
        moe=moe_cost(priced[0].routed or routed, work.batch) if routed and priced else None,
    )


def moe_cost(routed: Sequence[RoutedExperts], batch: int) -> MoECost:
    """The routed experts' figures under uniform routing (ROUTING_ASSUMPTION): per layer, the expected share of
    expert bytes a batch-1 and a batch-B step read, and the tokens per step that read half, 90% and 99% of
    them (the point past which batching stops amortizing expert reads)."""
    total = sum(r.bytes for r in routed)  # above 0: each expert holds a parameter, each format bits above 0

    def share(tokens: int) -> float:
        return sum(r.bytes * expected_experts_read(r.experts, r.top_k, tokens) / r.experts for r in routed) / total

    def tokens(s: float) -> int:
        return max(tokens_to_read_share(r.experts, r.top_k, s) for r in routed)

    return MoECost(
        assumption=ROUTING_ASSUMPTION,
        layers=[
            ExpertLayerCost(
                layer=r.layer,
                experts=r.experts,
                top_k=r.top_k,
                routed_parameters=r.parameters,
                active_routed_parameters=round(r.parameters * r.top_k / r.experts),
                routed_bytes=r.bytes,
            )
            for r in routed
        ],
        routed_parameters=sum(r.parameters for r in routed),
        experts_read_share_batch1=share(1),
        experts_read_share_at_batch=share(batch),
        tokens_reading_half=tokens(0.5),
        tokens_reading_90pct=tokens(0.9),
        tokens_reading_99pct=tokens(0.99),
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


def kv_layout_from_config(config: dict[str, Any], bytes_per_element: float | None = None) -> KVCache:
    """The decode cache config.json describes, layer by layer (checkpoint/architecture.cache_spec): each attention
    layer's KV with its own head sizes (MHA/GQA or MLA, an indexer's keys; sliding-window and chunked layers hold
    at most their window), each recurrent, state-space or convolution layer's fixed state (architecture.STATE_BYTES
    per state value, CONV_BYTES per convolution value or value of a state kept in the model's dtype: MiniMax's
    lightning attention), each compressed-attention layer's compressor (DeepSeek-V4: its entries at the KV's bytes,
    its pending tokens at CONV_BYTES); KV bytes per element: given, else the checkpoint's own (kv_bytes)."""
    bytes_per_element = kv_bytes(config) if bytes_per_element is None else bytes_per_element
    spec = cache_spec(config)
    values = tuple(layer.kv_values for layer in spec.layers)
    formulas = tuple(dict.fromkeys(f"{layer.kind}: {layer.formula}" for layer in spec.layers if layer.formula))
    kv_formulas = sorted({layer.formula.split("; ")[0] for layer in spec.layers if layer.kv_values})
    return KVCache(
        attention=spec.attention,
        values_per_token=max(values),
        kinds=tuple(layer.kind for layer in spec.layers),
        windows=tuple(layer.window for layer in spec.layers),
        bytes_per_element=bytes_per_element,
        formula=" | ".join(kv_formulas) or "no layer holds a KV cache",
        layer_values=values,
        state_bytes=tuple(
            float(
                layer.state_values * spec.state_bytes + (layer.conv_values + layer.dtype_state_values) * spec.conv_bytes
            )
            for layer in spec.layers
        ),
        state_dtype=_state_dtype(spec),
        layer_formulas=formulas if any(_keeps_more_than_kv(layer) for layer in spec.layers) else (),
        compressors=tuple(layer.compressor for layer in spec.layers),
        activation_bytes=spec.conv_bytes,
    )


def _keeps_more_than_kv(layer: LayerCache) -> bool:
    return bool(layer.state_values or layer.conv_values or layer.dtype_state_values or layer.compressor)


def _state_dtype(spec: CacheSpec) -> str:
    """The dtypes the cache's fixed state is priced at, of the kinds of state it holds."""
    kinds = [
        f"state {spec.state_dtype} ({spec.state_bytes} bytes)" if any(x.state_values for x in spec.layers) else "",
        f"convolution {spec.conv_bytes} bytes" if any(x.conv_values for x in spec.layers) else "",
        f"lightning-attention state {spec.conv_bytes} bytes (the model's 16-bit dtype)"
        if any(x.dtype_state_values for x in spec.layers)
        else "",
    ]
    return (
        ", ".join(k for k in kinds if k)
        or f"state {spec.state_dtype} ({spec.state_bytes} bytes), convolution {spec.conv_bytes} bytes"
    )


def routed_experts(config: dict[str, Any], expert_layers: Sequence[Any], where: str) -> tuple[RoutedExperts, ...]:
    """Each MoE layer's routed experts: bytes and parameters from the headers (accounting.ExpertLayer), E and k
    from config.json (architecture.moe_spec). The two must agree, layer by layer and expert by expert, or the
    bounds would price the experts wrongly: a UsageError naming both. Layers past num_hidden_layers (a
    multi-token-prediction layer) are not decode layers and stay outside."""
    spec = moe_spec(config)
    n = layer_count(config) if spec is not None or expert_layers else 0
    stored = [e for e in expert_layers if e.layer < n]
    if spec is None and not stored:
        return ()
    if spec is None:
        raise UsageError(
            f"{where}: tensors of layers {_span([e.layer for e in stored])} are routed experts (experts.N / fused "
            "experts), but config.json declares no expert count (num_experts, num_local_experts or "
            "n_routed_experts); fix config.json"
        )
    if not stored:
        raise UsageError(
            f"{where}: config.json declares {spec.experts} routed experts ({spec.fields}), but no tensor name "
            "matches the routed-expert patterns (experts.N.*, experts.gate_up_proj); the bounds would price the "
            "model as dense, so none are given. Pass --params/--formats instead"
        )
    if (found := [e.layer for e in stored]) != list(spec.layers):
        raise UsageError(
            f"{where}: config.json ({spec.fields}) puts routed experts in layers {_span(list(spec.layers))}, "
            f"the weights hold them in layers {_span(found)}; fix config.json, or the weights that go with it"
        )
    if bad := [e for e in stored if e.experts_stored != spec.experts]:
        raise UsageError(
            f"{where}: layer {bad[0].layer} stores {bad[0].experts_stored} routed experts, config.json declares "
            f"{spec.experts}; fix config.json, or the weights that go with it"
        )
    return tuple(RoutedExperts(e.layer, spec.experts, spec.top_k, e.bytes, e.parameters) for e in stored)


def _span(layers: list[int]) -> str:
    return ", ".join(map(str, layers[:8])) + (f", … ({len(layers)} layers)" if len(layers) > 8 else "")


MTP_NOT_READ = "MTP layer(s) not read by a plain decode step"


def not_read(report: BitsReport, config: dict[str, Any], stored: list[int] | None = None) -> NotRead | None:
    """The multi-token-prediction module a checkpoint stores (the accounting's part `mtp`: config.json's
    num_nextn_predict_layers after its num_hidden_layers, or its family's `mtp.*` tensors; a GGUF's last
    nextn_predict_layers blocks), which a plain decode step does not read: the decoder predicts the next token
    without it (it drafts tokens for speculative decoding, a step of its own). `stored`: the MTP layers, where the
    caller read them (a GGUF's: ggufs.mtp_stored), else report.modules' as config.json describes them
    (accounting.mtp_parts). None where it stores none."""
    part = report.bytes_by_part.get("mtp")
    if not part or not part["bytes"]:
        return None
    prefixes: list[str] = []
    if stored is None:
        stored, prefixes = mtp_parts(mtp_of(config), (m.module + "." for m in report.modules))
        if not stored and not prefixes:
            return None
    which = [f"layer(s) {_span(stored)}"] if stored else []
    which += [", ".join(f"{p}.*" for p in prefixes)] if prefixes else []
    return NotRead(
        part="mtp",
        layers=stored,
        prefixes=prefixes,
        bytes=part["bytes"],
        parameters=part["parameters"],
        note=f"{MTP_NOT_READ}: {' and '.join(which)} ({part['bytes']:,} bytes, {part['parameters']:,} "
        "parameters) left out of the parameters and bytes priced",
    )


def decode_figures(
    report: BitsReport, config: dict[str, Any], stored: list[int] | None = None
) -> tuple[int, int | None, NotRead | None]:
    """The bytes and parameters a plain decode step reads of a checkpoint: all it stores less what it does not
    read (not_read, `stored` passed on); the parameters None where they cannot be counted."""
    left = not_read(report, config, stored)
    nbytes, params = (
        (report.total_bytes, report.parameters)
        if left is None
        else (
            report.total_bytes - left.bytes,
            report.parameters - left.parameters if report.parameters else None,
        )
    )
    return nbytes, params, left


def checkpoint_weights(checkpoint: Path, config: dict[str, Any]) -> tuple[Weights, int | None, NotRead | None]:
    """A checkpoint's weights as a decode step reads them (its routed experts per MoE layer, from the headers and
    config.json: routed_experts; its MTP layers left out: not_read), its active parameters (None when its
    parameters cannot be counted) and what it stores that a decode step does not read."""
    report = bits_report(checkpoint)
    routed = routed_experts(config, report.expert_layers, str(checkpoint))
    nbytes, params, left = decode_figures(report, config)
    active = active_parameter_count(params, routed) if params else None
    return Weights(nbytes, routed, tuple(report.gathered.values())), active, left


def measured_checkpoint(
    checkpoint: Any,
    kv: KVLayout | None = None,
    kv_bytes: float | None = None,
    gguf_config: dict | None = None,
    complete: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    check: Callable[[Path], None] | None = None,
) -> tuple[BitsReport, KVLayout | KVCache, tuple[RoutedExperts, ...]]:
    """A checkpoint's bits, KV cache and routed experts: a GGUF's from its header alone (gguf_kv_cache, with
    `gguf_config` where its cache needs it), any other's from its safetensors headers and config.json, read as
    `complete` returns it (the API passes checkpoint/loader.completed_config: config.json with the fields its
    transformers config class derives or defaults; cost itself imports no transformers), else as written; `check`
    (the API passes checkpoint/loader.check_priced_checkpoint) then holds the stored tensors' shapes to the model
    that config.json describes, before anything is priced (after config.json's own refusals). `kv` replaces the KV
    cache they describe (the CLI's --layers/--kv-heads/--head-dim beside --checkpoint); `kv_bytes` prices theirs at
    that many bytes a KV element."""
    if (f := ggufs.find(Path(checkpoint))) is not None:
        h = ggufs.check_model(ggufs.read_header(f))
        report = gguf_report(Path(checkpoint), h)
        if not report.parameters:
            raise UsageError(f"{checkpoint} holds no tensors; there are no weights to price")
        cache = kv or gguf_kv_cache(h, gguf_config)
        if kv is None and kv_bytes is not None:
            cache = replace(cache, bytes_per_element=kv_bytes)
        return report, cache, gguf_routed_experts(h, report.expert_layers)
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
    if complete is not None:
        cfg = complete(cfg)
    cache = kv or kv_layout_from_config(cfg, kv_bytes)
    routed = routed_experts(cfg, report.expert_layers, str(checkpoint))
    if check is not None:  # after config.json's own refusals, before a figure
        check(Path(checkpoint))
    return report, cache, routed


def checkpoint_decode_figures(checkpoint: Any, report: BitsReport) -> tuple[int, int | None, NotRead | None]:
    """decode_figures of a measured checkpoint (measured_checkpoint's report): a GGUF's MTP blocks read from its
    header (ggufs.mtp_stored), any other's MTP layers from config.json as written (none without one)."""
    if (f := ggufs.find(Path(checkpoint))) is not None:
        return decode_figures(report, {}, ggufs.mtp_stored(ggufs.read_header(f)))
    return decode_figures(report, read_config(Path(checkpoint), required=False))


# llama.cpp's default KV cache type is F16 (--cache-type-k/-v f16): 2 bytes per element
GGUF_KV_BYTES = 2


def gguf_kv_cache(h: ggufs.GGUFHeader, config: dict[str, Any] | None = None) -> KVCache:
    """A GGUF's KV cache in the layers llama.cpp keeps one for (_header_cache): its decode layers, the blocks before
    the multi-token-prediction ones (ggufs.mtp_blocks: the last `{arch}.nextn_predict_layers` of
    `{arch}.block_count`), which llama.cpp reads as the model's layers (its hparams.n_layer(), block_count less
    nextn_predict_layers, for every architecture) and gives no KV cache in a decode context (its KV cache "filters"
    them: tests/checkpoint/test_gguf.py compares with the cache llama.cpp allocates). A GGUF of MTP blocks alone
    (nextn_predict_layers = block_count) is priced with a cache in every block (mtp_blocks declares none): the
    llama.cpp llama-cpp-python 0.3.36 vendors loads no decode layer from it (measured on a `llama` one: "wrong
    number of tensors"), so there is no cache of its own to compare with. A GLM-4.5-Air GGUF's MTP block was
    priced as a decode layer's cache, 47 layers of it for its 46 (issue #58)."""
    cache = _header_cache(h, config)
    mtp = ggufs.mtp_blocks(h)
    if not mtp or len(cache.kinds) <= mtp.start:  # none declared, or left out already (ggufs.latent_shape)
        return cache
    n = mtp.start
    kinds = cache.kinds[:n]
    return replace(
        cache,
        values_per_token=max(cache.layer_values[:n] or (cache.values_per_token,)),
        kinds=kinds,
        windows=cache.windows[:n],
        layer_values=cache.layer_values[:n],
        state_bytes=cache.state_bytes[:n],
        layer_formulas=tuple(f for f in cache.layer_formulas if f.split(": ")[0] in kinds),
        formula=f"{cache.formula} [{len(cache.kinds)} blocks less {len(mtp)} multi-token-prediction "
        f"({h.architecture}.nextn_predict_layers), which llama.cpp keeps no KV cache for]",
    )


def _header_cache(h: ggufs.GGUFHeader, config: dict[str, Any] | None = None) -> KVCache:
    """A GGUF's KV cache from its metadata, as llama.cpp allocates it, GGUF_KV_BYTES bytes an element. Every layer
    holds the whole context, each token kv_heads × (key_length + value_length) values per layer
    (ggufs.attention_shape); where the header gives `{arch}.attention.head_count` or `head_count_kv` per layer and
    nothing else shaping the cache, layer l holds kv_heads[l] of them, none where it has no KV head
    (ggufs.per_layer_shape: llama.cpp's rule for every architecture, the header's arrays read as it reads them; a
    Nemotron-NAS `deci` GGUF, or any whose family transformers maps, was refused: issue #58). A latent (MLA) cache
    is priced from the header alone (ggufs.latent_shape), as config.json's MLA is (architecture.cache_spec). A
    header whose cache is laid out by its family's code (a sliding window: ggufs.windowed_or_latent) is priced
    layer by layer from `config`, the config.json transformers builds from the header (checkpoint/loader.gguf_config,
    which the caller reads, refusing a per-layer head count it keeps unread: cost imports no transformers), as
    kv_layout_from_config prices any; without one (an architecture transformers does not map) it is refused
    (UsageError) naming what it declares. A header that also sizes a recurrent state (ggufs.recurrent_state_keys:
    Gated DeltaNet, Mamba2, KDA, short convolutions) is priced only through `config` (its layer types), each of
    the config's state layers at the state llama.cpp allocates (ggufs.recurrent_state: a short convolution's, F32,
    not transformers' conv cache), else refused, and refused with a config too where that state is another (plain Mamba,
    RWKV, KDA: which of their layers keep one is each family's code in llama.cpp). Its head counts, or its MLA
    keys, describe its attention layers alone (a review's Qwen3-Next GGUF was priced as attention in all four
    layers, a Kimi-Linear one as MLA in all, a Falcon-H1 one without its Mamba state; an LFM2 one at transformers'
    conv cache, L_cache × hidden at 2 bytes, where llama.cpp keeps (L_cache − 1) × hidden at F32). A Mamba2
    hybrid's (Falcon-H1, Granite 4, Nemotron-H) is priced from the header alone, as llama.cpp lays it out
    (ggufs.mamba_layers: each family's rule for which blocks keep KV and which a Mamba2 state, the state at F32),
    its note saying where that llama.cpp does not load the GGUF (a review's Falcon-H1 GGUF was refused)."""
    if (mamba := ggufs.mamba_layers(h)) is not None:
        kv, values = mamba.kv, [n * (mamba.kv.key_length + mamba.kv.value_length) for n in mamba.kv.kv_heads]
        kinds = tuple(
            {(True, True): "hybrid", (True, False): "mamba2", (False, True): "full_attention"}.get(
                (r, bool(v)), "no_attention"
            )
            for r, v in zip(mamba.recurrent, values, strict=True)
        )
        state = float(mamba.state.bytes)
        heads = sorted(set(kv.kv_heads) - {0}) or [0]
        kv_formula = f"kv_heads {heads[0]}" if len(heads) == 1 else f"kv_heads[layer] {heads[0]}-{heads[-1]}"
        kv_formula += f" × (key_length {kv.key_length} + value_length {kv.value_length})"
        kv_formula = kv_formula if any(kv.kv_heads) else "no layer holds a KV cache"
        return KVCache(
            attention="MHA/GQA + Mamba2",
            values_per_token=max(values),
            kinds=kinds,
            windows=(None,) * len(kinds),
            bytes_per_element=GGUF_KV_BYTES,
            formula=f"{kv_formula} [{mamba.rule}]",
            layer_values=tuple(values),
            state_bytes=tuple(state if r else 0.0 for r in mamba.recurrent),
            state_dtype=ggufs.RECURRENT_STATE_DTYPE,
            layer_formulas=tuple(
                f"{k}: {f}"
                for k, f in (
                    ("hybrid", f"{kv_formula}; {mamba.state.formula}"),
                    ("mamba2", mamba.state.formula),
                    ("full_attention", kv_formula),
                )
                if k in kinds
            ),
            note=mamba.refused,
        )
    if state := ggufs.recurrent_state_keys(h):
        if config is None:
            raise UsageError(
                f"{h.path}: architecture {h.architecture!r} keeps a fixed recurrent state ({', '.join(state)}) beside "
                "the KV cache of its attention layers, which llama.cpp sizes by a rule of its own that quantize does "
                f"not restate, and transformers maps no config for it. {ggufs.BY_HAND}"
            )
        if (rs := ggufs.recurrent_state(h)) is None:
            raise UsageError(
                f"{h.path}: architecture {h.architecture!r} keeps a fixed recurrent state ({', '.join(state)}) that "
                f"llama.cpp sizes by a rule quantize does not read from a header. {ggufs.BY_HAND}"
            )
        cache = kv_layout_from_config(config, GGUF_KV_BYTES)
        kinds = {k for k, b in zip(cache.kinds, cache.state_bytes, strict=True) if b}
        return replace(
            cache,
            formula=f"{cache.formula} [a recurrent state ({', '.join(state)}); the layers of transformers' "
            f"{config.get('model_type')} config read from the GGUF]",
            state_bytes=tuple(float(rs.bytes) if b else 0.0 for b in cache.state_bytes),
            state_dtype=ggufs.RECURRENT_STATE_DTYPE,
            layer_formulas=tuple(
                f"{f.split(': ')[0]}: {rs.formula}" if f.split(": ")[0] in kinds else f for f in cache.layer_formulas
            ),
        )
    if (latent := ggufs.latent_shape(h)) is not None:
        return KVCache(
            attention="MLA + indexer" if latent.indexer_keys else "MLA",
            values_per_token=latent.values,
            kinds=("full_attention",) * latent.layers,
            windows=(None,) * latent.layers,
            bytes_per_element=GGUF_KV_BYTES,
            formula=latent.formula,
        )
    if (per := ggufs.per_layer_shape(h)) is not None:
        return KVCache(
            attention="MHA/GQA",
            values_per_token=max(per.kv_heads) * (per.key_length + per.value_length),
            kinds=tuple("full_attention" if n else "no_attention" for n in per.kv_heads),
            windows=(None,) * len(per.kv_heads),
            bytes_per_element=GGUF_KV_BYTES,
            formula=per.formula,
            layer_values=tuple(n * (per.key_length + per.value_length) for n in per.kv_heads),
        )
    if special := ggufs.windowed_or_latent(h):
        if config is None:
            raise UsageError(
                f"{h.path} declares {', '.join(special)}: its KV cache is priced layer by layer through the "
                f"config transformers reads from a GGUF, and transformers maps no config for architecture "
                f"{h.architecture!r}. {ggufs.BY_HAND}"
            )
        cache = kv_layout_from_config(config, GGUF_KV_BYTES)
        return replace(
            cache,
            formula=f"{cache.formula} [{', '.join(special)}; the layers of transformers' "
            f"{config.get('model_type')} config read from the GGUF]",
            state_dtype=cache.state_dtype if any(cache.state_bytes) else "",
        )
    s = ggufs.attention_shape(h)
    return KVCache(
        attention="MHA/GQA",
        values_per_token=s.kv_heads * (s.key_length + s.value_length),
        kinds=("full_attention",) * s.layers,
        windows=(None,) * s.layers,
        bytes_per_element=GGUF_KV_BYTES,
        formula=f"kv_heads {s.kv_heads} × (key_length {s.key_length} + value_length {s.value_length}) [{s.keys}]",
    )


def gguf_routed_experts(h: ggufs.GGUFHeader, expert_layers: Sequence[Any]) -> tuple[RoutedExperts, ...]:
    """A GGUF's routed experts per MoE layer: bytes and parameters from its fused expert tensors (ffn_*_exps), E and
    k from `{arch}.expert_count` and `{arch}.expert_used_count`; the two must agree, as for config.json. Its MTP
    blocks' experts are part `mtp` (ggufs.mtp_blocks), in no expert layer."""
    import gguf

    arch = h.architecture or "?"
    e_key, k_key = (k.format(arch=arch) for k in (gguf.Keys.LLM.EXPERT_COUNT, gguf.Keys.LLM.EXPERT_USED_COUNT))
    experts, top_k = h.metadata.get(e_key), h.metadata.get(k_key)
    if not expert_layers:
        return ()
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (experts, top_k)):
        raise UsageError(
            f"{h.path} stores routed experts (ffn_*_exps) but its {e_key} / {k_key} are {experts!r} / {top_k!r}; "
            "pass --params/--formats and --routed-params/--experts/--top-k instead"
        )
    if bad := [e for e in expert_layers if e.experts_stored != experts]:
        raise UsageError(
            f"{h.path}: layer {bad[0].layer} stores {bad[0].experts_stored} routed experts, {e_key} declares "
            f"{experts}; re-convert the GGUF"
        )
    return tuple(RoutedExperts(e.layer, experts, top_k, e.bytes, e.parameters) for e in expert_layers)


def checkpoint_cost(  # noqa: PLR0913 (one keyword per input `quantize cost --checkpoint` reads)
    checkpoint: Any,
    hardware: Hardware,
    work: Workload,
    project_params: float | None = None,
    project_share: float | None = None,
    kv: KVLayout | None = None,
    kv_bytes: float | None = None,
    gguf_config: dict[str, Any] | None = None,
    complete: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    check: Callable[[Path], None] | None = None,
) -> TokenCost:
    """Bounds from a measured checkpoint's bytes (safetensors or GGUF); optionally a labelled projection onto a
    larger model. `kv` replaces the checkpoint's KV cache; `kv_bytes` prices its own at that element size;
    `gguf_config`: the config transformers builds from a GGUF's header (checkpoint/loader.gguf_config), for a cache
    its family's code lays out (a sliding window, a recurrent state);
    `complete`: config.json as read for the cost; `check`: the stored shapes held to it (measured_checkpoint)."""
    if kv_bytes is not None:
        check_kv_bytes(kv_bytes, "kv_bytes")
    report, kv, routed = measured_checkpoint(checkpoint, kv, kv_bytes, gguf_config, complete, check)
    nbytes, params, left = checkpoint_decode_figures(checkpoint, report)
    if not params:  # measured_checkpoint refused a checkpoint whose parameters it cannot count: all are MTP layers'
        raise UsageError(
            f"{checkpoint} stores multi-token-prediction layers alone (layers from config.json's num_hidden_layers "
            "on, a GGUF's last nextn_predict_layers blocks), which a plain decode step does not read: there are no "
            "decoder weights to price"
        )
    out = token_cost(
        params,
        {"measured": 8 * nbytes / params},
        kv,
        hardware,
        work,
        measured_bytes={"measured": Weights(nbytes, routed, tuple(report.gathered.values()))},
        routed=routed,
    ).model_copy(update={"not_read": left})
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
            + ("; priced as a DENSE model: the projected model's routing is unknown" if routed else "")
        )
        return out.model_copy(
            update={
                "checkpoint": measured,
                "projection": ProjectedCost(
                    **proj.model_dump(exclude={"checkpoint", "not_read", "projection", "sweeps"}), projection=label
                ),
            }
        )
    return out.model_copy(update={"checkpoint": measured})
