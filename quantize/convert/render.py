"""`quantize run` as text: what was written, its true bits, size, time and memory."""

from __future__ import annotations

from pathlib import Path

from quantize.checkpoint.render import mib
from quantize.records import MemoryPlanRecord, RunRecord


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
            *([plan_line(meta.memory_plan)] if meta.memory_plan else []),
        ]
    )


def plan_line(p: MemoryPlanRecord) -> str:
    """The memory plan made before the load: the path taken, its estimate against what was available, and
    which reload check ran."""
    avail = "unknown" if p.available_bytes is None else mib(p.available_bytes)
    return (
        f"  memory plan: {p.path} path, estimated {mib(p.need_bytes)} of {avail} available ({p.available_from}); "
        f"model {mib(p.model_bytes)}, largest shard {mib(p.largest_shard_bytes)}, largest layer "
        f"{mib(p.largest_layer_bytes)}, calibration activations {mib(p.activation_bytes)}; reload check: {p.reload}"
    )
