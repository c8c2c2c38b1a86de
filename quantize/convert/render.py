"""`quantize run` as text: what was written, its true bits, size, time and memory."""

from __future__ import annotations

from pathlib import Path

from quantize.checkpoint.accounting import UNTIED
from quantize.checkpoint.files import PER_EXPERT_LOADER
from quantize.checkpoint.render import mib
from quantize.records import CalibrationRecord, GGUFConversion, LayerPlanRecord, MemoryPlanRecord, RunRecord


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
            *left_lines(plan),
            *(f"  note: {n}" for n in b.notes if n.startswith(UNTIED)),
            # read back by quantize's own loader: which loaders read the checkpoint, transformers' and vLLM's too
            *(f"  note: checked {c.stage}" for c in meta.finite_checks if PER_EXPERT_LOADER in c.stage),
            *not_converted_lines(plan),
            *routing_lines(plan),
            *([plan_line(meta.memory_plan)] if meta.memory_plan else []),
            *(gguf_lines(meta.engine.gguf) if meta.engine.gguf else []),
            *(calibration_lines(meta.calibration) if meta.calibration else []),
        ]
    )


def gguf_lines(g: GGUFConversion) -> list[str]:
    """A GGUF written by llama.cpp: from what, through which intermediate, each weight's type, and the notes."""
    via = f" via {g.intermediate}" if g.intermediate else ""
    build = f" build {g.llama_cpp_build}" if g.llama_cpp_build else ""
    build += f" env {g.llama_cpp_switches}" if g.llama_cpp_switches else ""
    types = ", ".join(f"{t} {n}" for t, n in g.tensor_types.items())
    return [
        f"  llama.cpp (llama-cpp-python {g.llama_cpp_python}{build}, {g.threads} threads): "
        f"{g.source_file_type}{via} -> {g.ftype}; weights by type: {types}",
        *(
            [
                f"  importance matrix: {g.imatrix.weights} weights, from {g.imatrix.rows} calibration rows "
                f"({g.imatrix.tokens:,} tokens) decoded in llama.cpp on {g.imatrix.computed_on}"
            ]
            if g.imatrix
            else []
        ),
        *(
            [f"  tensor types by pattern: {', '.join(f'{p} -> {t}' for p, t in g.tensor_type_overrides.items())}"]
            if g.tensor_type_overrides
            else []
        ),
        *(f"  note: {n}" for n in g.notes),
    ]


def left_lines(plan: LayerPlanRecord) -> list[str]:
    """Every tensor the checkpoint stores at 16 bits but the exempt ones (LeftAt16): which, how many bytes, why."""
    return [
        f"  left at 16 bits: {len(g.tensors)} tensor(s), {mib(g.bytes)} ({g.bytes:,} bytes), e.g. {g.tensors[0]}: "
        f"{g.why}"
        for g in plan.left_16bit
    ]


def not_converted_lines(plan: LayerPlanRecord) -> list[str]:
    """The source's layers the checkpoint does not hold (its MTP layers): which, how large, why."""
    return [
        f"  not converted: {', '.join(g.layers)} ({g.tensors} tensor(s), {mib(g.bytes)}, {g.parameters:,} "
        f"parameters), not in the checkpoint: {g.why}"
        for g in plan.not_converted
    ]


def routing_lines(plan: LayerPlanRecord) -> list[str]:
    """Per MoE layer, the calibration tokens routed to each expert (fewest and most), and whether every expert
    was calibrated on all tokens."""
    return [
        f"  experts {r.module}: {r.tokens:,} calibration tokens, top-{r.top_k}; routed per expert min "
        f"{min(r.routed_tokens):,}, max {max(r.routed_tokens):,}"
        + ("; every expert calibrated on all tokens" if r.all_experts_calibrated else "")
        for r in plan.routing
    ]


def plan_line(p: MemoryPlanRecord) -> str:
    """The memory plan made before the load: the path taken, its estimate against what was available, and
    which reload check ran."""
    avail = "unknown" if p.available_bytes is None else mib(p.available_bytes)
    phases = f" ({', '.join(f'{k} {mib(v)}' for k, v in p.phases.items())})" if p.phases else ""
    return (
        f"  memory plan: {p.path} path, estimated {mib(p.need_bytes)}{phases} of {avail} available "
        f"({p.available_from}); "
        f"model {mib(p.model_bytes)}, largest shard {mib(p.largest_shard_bytes)}, largest layer "
        f"{mib(p.largest_layer_bytes)}, calibration activations {mib(p.activation_bytes)}; reload check: {p.reload}"
    )


def calibration_lines(cal: CalibrationRecord) -> list[str]:
    """What the calibration saw: its rows, documents and their lengths, each source, the chat template's share."""
    lines = [f"  calibration: {cal.samples} × {cal.seq_len} tokens from {cal.documents_used} documents of {cal.source}"]
    if d := cal.document_tokens:
        lines.append(f"    tokens per document: min {d.min}, median {d.median:g}, max {d.max} ({d.total:,} in all)")
    if len(cal.sources) > 1:
        lines += [
            f"    {s.source} (weight {s.weight:g}): {s.samples} rows, {s.documents_used} documents"
            + (f", {s.kind} from {s.field!r}" if s.field else "")
            for s in cal.sources
        ]
    elif cal.sources and cal.sources[0].field:
        lines.append(f"    read as {cal.sources[0].kind} from column {cal.sources[0].field!r}")
    if cal.chat_template_sha256 and cal.chat_template_share is not None:
        lines.append(
            f"    chat template: {cal.chat_template_share:.1%} of the tokens ({cal.chat_template_tokens:,}), "
            f"template sha256 {cal.chat_template_sha256[:12]}"
        )
    if o := cal.overlap:
        lines.append(
            f"    vocabulary of {o.golden}: {o.distinct_share:.1%} of its {o.distinct_tokens:,} distinct tokens appear "
            f"in the calibration ({o.token_share:.1%} of its token occurrences)"
        )
    return lines
