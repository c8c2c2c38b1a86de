"""`quantize inspect` as text: the true bits of a checkpoint (accounting.BitsReport) for a person."""

from __future__ import annotations

from quantize.checkpoint.accounting import BitsReport, metadata_only
from quantize.records import ModuleBits
from quantize.tables import text_table as table


def mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _fmt(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "unknown"


def inspect_text(r: BitsReport, modules: bool = False) -> str:
    lines = [
        f"{r.checkpoint}  ({r.format}; {len(r.files)} file(s), {r.header_bytes_read:,} header bytes read of "
        f"{r.file_bytes:,})",
        f"  total tensor bytes     {r.total_bytes:,} ({mib(r.total_bytes)})",
        f"  logical parameters     {r.parameters:,}"
        if r.parameters is not None
        else "  logical parameters     unknown",
        f"  bits per weight        {_fmt(r.bits_per_weight)}  (8 × all bytes / parameters: embeddings, norms and "
        "scales included)",
    ]
    if r.bits_per_source_parameter:
        lines.append(
            f"  per source parameter   {_fmt(r.bits_per_source_parameter)}  (a tied output layer's stored copy "
            "left out)"
        )
    lines += [
        f"  quantized linears      {_fmt(r.quantized_linear_bits_per_weight)} bits per weight over "
        f"{r.quantized_linear_parameters:,} parameters",
        "",
        table(
            [[role, f"{n:,}", f"{100 * n / r.total_bytes:.2f}%"] for role, n in r.bytes_by_role.items()],
            ["bytes by role", "bytes", "share"],
        ),
    ]
    if r.bytes_by_part:
        lines += ["", _parts_table(r)]
    if r.ggml_types:
        lines += ["", _ggml_table(r)]
    if modules:
        rows = [[m.module, m.format, f"{m.parameters:,}", f"{m.bytes:,}", _module_bits(m)] for m in r.modules]
        lines += ["", table(rows, ["module", "format", "parameters", "bytes", "bits/weight"])]
    lines += [f"  note: {note}" for note in r.notes]
    return "\n".join(lines)


def _module_bits(m: ModuleBits) -> str:
    """A module row's bits per weight: `-` for one holding no parameters, only metadata (a KV cache's scales)."""
    return "-" if metadata_only(m) else _fmt(m.bits_per_weight)


def _parts_table(r: BitsReport) -> str:
    """Bytes and bits by part of the model (attention, experts, router, ...), each part's scales included."""
    rows = [
        [
            part.replace("_", " "),
            f"{p['bytes']:,}",
            f"{100 * p['bytes'] / r.total_bytes:.2f}%",
            f"{p['parameters']:,}",
            _fmt(p["bits_per_weight"]),
            f"{p['metadata_bytes']:,}",
        ]
        for part, p in r.bytes_by_part.items()
    ]
    text = table(rows, ["bytes by part", "bytes", "share", "parameters", "bits/weight", "of which scales"])
    if (share := r.routed_expert_share) is not None:
        layers = r.expert_layers
        text += (
            f"\n  routed experts hold {100 * share:.2f}% of the bytes ({len(layers)} MoE layer(s), "
            f"{layers[0].experts_stored if layers else 0} experts each)"
        )
    return text


def _ggml_table(r: BitsReport) -> str:
    """A GGUF's bytes by ggml type, each type's bits per weight from its block layout, and the file's padding."""
    rows = [
        [
            name,
            f"{t['tensors']:,}",
            f"{t['elements']:,}",
            f"{t['bytes']:,}",
            f"{t['type_size']} B / {t['block_size']}",
            _fmt(t["bits_per_weight"]),
        ]
        for name, t in r.ggml_types.items()
    ]
    text = table(rows, ["ggml type", "tensors", "elements", "bytes", "block", "bits/weight"])
    return text + (
        f"\n  header {r.header_bytes_read:,} + tensors {r.total_bytes:,} + alignment padding {r.padding_bytes:,} "
        f"= {r.file_bytes:,} bytes ({'the file' if len(r.files) == 1 else f'its {len(r.files)} files'})"
    )
