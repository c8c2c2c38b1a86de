"""`quantize run` as text: what was written, its true bits, size, time and memory."""

from __future__ import annotations

from pathlib import Path

from quantize.checkpoint.render import mib
from quantize.records import RunRecord


def run_text(name: str, out: Path, meta: RunRecord) -> str:
    b, plan = meta.bits, meta.layer_plan
    q = b.quantized_linear_bits_per_weight
    return "\n".join(
        [
            f"{name}: {meta.method} {meta.scheme or ''} -> {out}",
            f"  true bits per weight: {b.bits_per_weight:.3f} whole model"
            + (f", {q:.3f} quantized linear layers" if q else ""),
            f"  size: {mib(b.total_bytes)} of tensors; {plan.quantized_layers} layers quantized, "
            f"{len(plan.kept_16bit)} kept at 16 bits",
            f"  wall time {meta.time_seconds['total']:.1f} s, peak memory {mib(meta.memory.peak_rss_bytes)}",
        ]
    )
