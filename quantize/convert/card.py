"""The model card (README.md) of a quantize output: Hugging Face front matter, so the Hub and its
tools see a quantized model of its base, and a summary of quantize.json. Every name in it that a user or a
checkpoint chose (the recipe's or the model folder's name, the calibration data's description, versions and roles
read back from the record) is written through tables.py's escaping: it shows as its characters, never as markup."""

from __future__ import annotations

from quantize.convert.backends import backend_named, converts_files
from quantize.records import RunRecord
from quantize.tables import markdown_cell, md_code, md_text


def library_version(dist: str, versions: dict[str, str | None]) -> str:
    """The version quantize.json recorded for a library (it records the core set), else the installed one: the
    card is written by the conversion that used it."""
    from importlib import metadata

    if versions.get(dist):
        return str(versions[dist])
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def model_card(
    meta: RunRecord, base_model: str | None, experts_misread: str | None = None, vllm_said: str | None = None
) -> str:
    """base_model: the Hub id of the source model when known (the front matter names it); experts_misread: why
    transformers' own loader does not read the checkpoint's routed experts as stored (decompressed.
    transformers_reading), where it does not: the card then says so instead of sending the reader to it, and its
    front matter names no `library_name` (the Hub would show transformers' loading snippet for "transformers");
    vllm_said: what vLLM makes of them where quantize knows it from vLLM's source (checkpoint/vllm_reading.said: a
    family transformers reads only fused), said in place of sending the reader to vLLM."""
    from huggingface_hub import ModelCard, ModelCardData

    b, cal = meta.bits, meta.calibration
    backend = backend_named(meta.engine.backend)
    files = converts_files(backend)  # its output is a file of its library's format (a GGUF), not a transformers model
    tags = ["quantized", *backend.card_tags, "quantize", meta.method]
    if meta.scheme:
        tags.append(meta.scheme.lower())
    data = ModelCardData(
        base_model=base_model,
        base_model_relation="quantized" if base_model else None,
        # a checkpoint transformers misreads names no library: the Hub would offer its `from_pretrained` snippet
        library_name=backend.card_library if files else None if experts_misread is not None else "transformers",
        pipeline_tag="text-generation",
        tags=tags,
    )
    qbits = b.quantized_linear_bits_per_weight
    written = backend.formats.get(meta.method, backend.formats["*"])
    note = backend.load_note.get(meta.method, backend.load_note["*"])
    load = (
        note if files else f"Load with `transformers.AutoModelForCausalLM.from_pretrained` {note} or serve with vLLM."
    )
    if experts_misread is not None and not files:
        serve = f"{md_text(vllm_said)}; score it" if vllm_said else "Serve with vLLM, or score"
        load = (
            f"{serve} with quantize's own loader (`quantize eval`): transformers "
            f"{md_text(library_version('transformers', meta.versions))}'s `from_pretrained` misreads this checkpoint's "
            f"routed experts ({md_text(experts_misread)}; docs/moe.md)."
        )
    code = lambda text: markdown_cell(md_code(text))  # noqa: E731  # a code span inside a table cell
    lines = [
        f"# {md_text(meta.label)}",
        "",
        f"Quantized with [quantize](https://pypi.org/project/quantize/) {md_text(meta.versions['quantize'])} "
        f"({backend.credit} {md_text(library_version(backend.library, meta.versions))}, {written}).",
        "",
        "| | |",
        "|---|---|",
        f"| method | {md_text(meta.method)} |",
        f"| {'type' if files else 'scheme'} | "
        f"{md_text(meta.scheme) if meta.scheme else 'from verbatim llm-compressor recipe'} |",
        f"| true bits per weight (whole model, every stored byte) | {b.bits_per_weight:.3f} |",
        f"| bits per weight, quantized linear layers | {qbits:.3f} |"
        if qbits
        else "| bits per weight, quantized linear layers | none quantized |",
        f"| total tensor bytes | {b.total_bytes:,} |",
        f"| source parameters | {b.source_parameters:,} |",
        f"| source model weights sha256 | {code(meta.source_model.weights_sha256)} |",
        f"| recipe sha256 | {code(meta.recipe.sha256)} |",
        f"| calibration | {cal.samples} × {cal.seq_len} tokens of {md_text(cal.description)}, seed {cal.seed} |"
        if cal
        else "| calibration | none (data-free) |",
        f"| layers kept at 16 bits | {len(meta.layer_plan.kept_16bit)} |",
        *(
            f"| not converted, not in this checkpoint | {', '.join(md_text(x) for x in g.layers)}: {md_text(g.why)} |"
            for g in meta.layer_plan.not_converted
        ),
        f"| wall time | {meta.time_seconds['total']:.0f} s |",
        "",
        "Bytes by role: " + ", ".join(f"{md_text(k)} {v:,}" for k, v in b.bytes_by_role.items()),
        "",
        f"Full provenance is in `quantize.json`. {load}",
        "",
    ]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))
