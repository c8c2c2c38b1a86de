"""Checks on a conversion's source before it is converted (check_source: its headers against config.json, as
transformers would load them), and on its output: finite logits and the first layer whose output is not; for an
output too large to reload, every stored tensor finite and its headers against the meta-device model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quantize.checkpoint import qdq, vllm_reading
from quantize.checkpoint.accounting import METADATA_ROLES, bits_report, role_of, scaled
from quantize.checkpoint.architecture import Mtp, mtp_declaration, mtp_of, part_of
from quantize.checkpoint.decompressed import transformers_reading
from quantize.checkpoint.files import PER_EXPERT_LOADER, read_config, reads_per_expert, safetensors_files
from quantize.checkpoint.headers import TORCH_NAMES, all_tensors, read_header
from quantize.checkpoint.loader import check_against_meta, check_loading_info, load_model, meta_model
from quantize.compat.transformers import dry_load
from quantize.convert.plan import NOT_LINEAR, ROUTER_REASON, checkpoint_name
from quantize.errors import RuntimeFailure, UsageError
from quantize.records import FiniteCheck, LeftAt16, NotConverted


def check_source(model_dir: Path, trust_remote_code: bool, streamed: bool = False) -> None:
    """The source against config.json before a weight is read or converted, on every path (in memory, offloaded,
    streamed: engine.convert calls it once, before it takes any): the checks the loader makes before it allocates
    (loader.check_against_meta: a shape config.json does not imply, integers where the model holds floats), then the
    headers loaded into the meta-device model as `from_pretrained` would load them (compat.transformers.dry_load:
    transformers' renamings and per-expert merges, tied weights): a stored tensor the model has no place for, a
    weight the checkpoint lacks, a renamed tensor of another shape, or tensors that do not merge into the model's
    fused ones. Each is the user's to fix: UsageError (exit 2) naming the tensor, never the conversion's exit 3
    after the work. A quantized source never reaches it (engine.preflight refuses one: check_unquantized).
    `streamed`: the run takes the streamed path, which writes every stored tensor as it is; a stored tensor the
    model ties to another (a tied embedding's `lm_head.weight` saved beside it) is refused there
    (streamed_tied_copies), and so is a stored name transformers renames on load (streamed_renames)."""
    import torch

    check_against_meta(model_dir, trust_remote_code)
    tensors, _ = all_tensors(safetensors_files(model_dir))
    # a dtype not in TORCH_NAMES is loaded as bytes of its shape: only shapes and names decide what the check finds
    stored = {n: (t.shape, getattr(torch, TORCH_NAMES.get(t.dtype, "uint8"))) for n, t in tensors.items()}
    model = meta_model(model_dir, trust_remote_code)
    tied = _aliases(model)  # before the dry load, which unties a pair stored twice (it cannot compare meta values)
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    found = dry_load(model, stored)
    fix = "fix config.json, or the weights that go with it"
    if found.conversion:
        key, why = next(iter(found.conversion.items()))
        raise UsageError(f"{model_dir}: the stored tensors transformers merges into {key} do not merge ({why}); {fix}")
    if found.mismatched:
        key, have, want = found.mismatched[0]
        raise UsageError(
            f"{model_dir}: the stored tensor loaded as {key} has shape {have}, and config.json implies {want}; {fix}"
        )
    check_loading_info(model_dir, {"missing_keys": found.missing, "unexpected_keys": found.unexpected})
    if streamed:
        streamed_tied_copies(model_dir, tied, set(stored))
        streamed_renames(model_dir, params, set(stored))


def _aliases(model: Any) -> set[str]:
    """The names of a model's tied parameters but the first (named_parameters lists a tied parameter once)."""
    return {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}


def streamed_tied_copies(model_dir: Path, aliases: set[str], stored: set[str]) -> None:
    """A stored tensor the model holds as a tie to another parameter (`aliases`: the tie's names but the first,
    from the model config.json builds): transformers ties it on load where the copy
    equals its parameter (and keeps both where they differ), save_pretrained then writes it once; the streamed path
    copies every stored tensor as it is, and its output failed the structure check after the whole conversion,
    exit 3 (a tied embedding with `lm_head.weight` saved beside it: a review). Refused before converting."""
    if copies := sorted(aliases & stored):
        raise UsageError(
            f"{model_dir} stores {', '.join(copies[:3])}, which config.json ties to another weight (e.g. "
            "tie_word_embeddings): transformers decides on load whether the stored copy is tied, and the streamed "
            "path, which writes each stored tensor as it is, cannot. Set `streaming: off` (a calibrated recipe short "
            "of memory can offload its weights: `offload: on`), or remove the stored copy (or set "
            "tie_word_embeddings false in config.json if it is not a copy)"
        )


def streamed_renames(model_dir: Path, params: set[str], stored: set[str]) -> None:
    """A stored tensor of a name the model does not hold (`params`: the meta-device model's parameter names), which
    transformers renames on load (Nemotron-H's `backbone.*` to `model.*`, its conversion mapping): the in-memory
    path saves the model's names back as the family stores them, the streamed path writes the stored names as they
    are, and its structure check then failed after the whole conversion, exit 3 (a dense Nemotron-H: a review).
    The multi-token-prediction module the model ignores (mtp_of) is written as stored on purpose. Refused before
    converting."""
    mtp = mtp_of(read_config(model_dir))
    if renamed := sorted(n for n in stored - params if not mtp.holds(n)):
        raise UsageError(
            f"{model_dir} stores {', '.join(renamed[:2])}{' ...' if len(renamed) > 2 else ''} under names transformers "
            "renames when it loads the model; the streamed path writes each stored tensor under its stored name and "
            "cannot follow the renaming. Set `streaming: off` (a calibrated recipe short of memory can offload its "
            "weights: `offload: on`)"
        )


def first_nonfinite_module(model: Any, input_ids: Any) -> str | None:
    """Run the model once with hooks; name the first module (in execution order) whose output is not finite."""
    import torch

    found: list[str] = []

    def hook(name: str):
        def fn(_module: Any, _inputs: Any, output: Any) -> None:
            t = output[0] if isinstance(output, tuple) else output
            if not found and isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all():
                found.append(name)

        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad(), qdq.installed():
            model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def check_finite(model: Any, input_ids: Any, stage: str) -> FiniteCheck:
    """Logits on a few calibration rows must be finite; otherwise name the first bad layer."""
    import torch

    with torch.no_grad(), qdq.installed():
        logits = model(input_ids=input_ids).logits  # (B, T, V)
    ok = bool(torch.isfinite(logits).all())
    if not ok:
        layer = first_nonfinite_module(model, input_ids)
        raise RuntimeFailure(
            f"{stage}: the model's logits are not finite (NaN or inf); the first layer whose output is not "
            f"finite is {layer}. Nothing was saved. Try more calibration samples, a smaller group_size, "
            f"`ignore:` for that layer, or float32 (`dtype: float32`)"
        )
    return FiniteCheck(
        stage=stage,
        rows=int(input_ids.shape[0]),
        tokens=int(input_ids.numel()),
        finite=ok,
        max_abs_logit=float(logits.abs().max()),
    )


def reload_check(path: Path, probe: Any, trust_remote_code: bool) -> FiniteCheck:
    """Reload the saved checkpoint (safetensors only) through loader.load_model, the loader `eval` and the gate
    score it with, and check its logits are finite; the record's stage names that loader (reloaded_with). The
    checkpoint is our own output: a refusal to load it (its weights do not match config.json) is our bug, a
    RuntimeFailure naming the reason, never the user's bad input."""
    try:
        model, _ = load_model(path, trust_remote_code)
    except UsageError as e:
        raise RuntimeFailure(
            f"the checkpoint this run wrote does not reload: {e} This is quantize's failure, not your input's; "
            "nothing was kept. Report it with the recipe and the model's config.json"
        ) from None
    return check_finite(model, probe, f"after reloading the saved checkpoint with {reloaded_with(path)}")


def reloaded_with(path: Path) -> str:
    """The loader load_model reads a checkpoint with, in words: transformers, or, for a compressed-tensors MoE
    stored per expert (files.reads_per_expert), quantize's own per-expert loader, with what transformers makes of
    the experts (decompressed.transformers_reading: their weights as stored, or why not) and, for a family
    transformers reads only fused, what vLLM does (vllm_reading.said, from its source: Granite 4)."""
    if not reads_per_expert(path):
        return "transformers"
    theirs = f"transformers {_version('transformers')}"
    if (why := transformers_reading(path)) is None:
        said = f"{theirs} reads its expert weights as stored, without their activation quantization"
    else:
        said = f"{theirs} misreads its routed experts: {why}"
    found, _ = all_tensors(safetensors_files(path))
    if (vllm := vllm_reading.said(str(read_config(path)["model_type"]), list(found))) is not None:
        said += f"; {vllm}"
    return f"{PER_EXPERT_LOADER} (checkpoint/decompressed.py; {said})"


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def left_at_16(
    out: Path,
    planned: set[str],
    kept: dict[str, str],
    stored_names: dict[str, str] | None = None,
    renamed: list[tuple[str, str]] | None = None,
) -> list[LeftAt16]:
    """What the saved checkpoint stores at 16 bits, by reason, read from its headers: a layer the plan kept (its
    reason), a tensor no conversion reached (`kept` names a parameter), a planned layer stored as a plain 16-bit
    weight with no scale (the backend skipped it), the weights (2-D and up) of a multi-token-prediction module the
    backend's save copied from the source as stored (MTP_COPIED), then every other tensor stored at 16 bits but the
    exempt ones (_the_rest, exempt_at_16). The plan names modules as transformers' model does; each tensor is
    listed by the name the file stores it under (Mixtral's and MiniMax-M2's routers as `block_sparse_moe.gate`,
    where the model says `mlp.gate`)."""
    found, _ = all_tensors(safetensors_files(out))
    as_stored = {_renamed(k, renamed or []): k for k in found}  # the model's name (as transformers loads) -> the file's
    stored = {name: found[k] for name, k in as_stored.items()}
    by: dict[str, tuple[list[str], int]] = {}

    def add(why: str, name: str) -> None:
        t = stored[name]
        names, nbytes = by.get(why, ([], 0))
        by[why] = ([*names, as_stored[name]], nbytes + t.nbytes)

    for name in sorted(checkpoint_name(n, stored_names or {}) for n in planned):
        w = f"{name}.weight"
        if w in stored and f"{name}.weight_scale" not in stored and stored[w].dtype in SIXTEEN_BIT:
            add("planned for quantization, but the saved checkpoint stores it at 16 bits with no scale", w)
    for name, why in sorted(kept.items()):
        for t in (name, f"{name}.weight"):
            if t in stored and stored[t].dtype in SIXTEEN_BIT:
                add(why, t)
    mtp = mtp_of(read_config(out, required=False))
    copied = [
        t
        for n, t in sorted(found.items())
        if mtp.holds(n) and n.endswith(".weight") and len(t.shape) >= 2 and t.dtype in SIXTEEN_BIT
    ]
    if copied:
        by[MTP_COPIED] = ([t.name for t in copied], sum(t.nbytes for t in copied))
    _the_rest(found, as_stored, by, mtp)
    return [LeftAt16(why=why, tensors=names, bytes=nbytes) for why, (names, nbytes) in by.items()]


def _the_rest(
    found: dict[str, Any],
    as_stored: dict[str, str],
    by: dict[str, tuple[list[str], int]],
    mtp: Mtp,
) -> None:
    """left_at_16's last pass: every other tensor the file stores at 16 bits but the exempt ones (exempt_at_16),
    with its reason: a listed layer's (a tensor of a module whose weight is listed: a convolution's bias, the
    kernel's; a kept layer's bias, the layer's; gpt-oss's fused experts' `*_bias`, their tensor's), a router's for
    a tensor of a router (the accounting's part `router`: GLM-4-MoE's `mlp.gate.e_score_correction_bias`, and
    MiniMax-M2's `block_sparse_moe.e_score_correction_bias`, the routing-correction bias the MoE block holds
    itself), MTP_COPIED for the rest of a multi-token-prediction module the save copied, the plan's reason for its
    accounting role (NOT_LINEAR: a buffer the plan's parameters leave out), else NO_RULE with that role. Each is
    listed by the name the file stores it under."""
    names = set(found)
    model_of = {k: m for m, k in as_stored.items()}
    listed: set[str] = set()
    reason: dict[str, str] = {}  # a listed layer (as stored, and as the model names it) or fused tensor -> why
    for why, (tensors, _) in by.items():
        for t in tensors:
            listed.add(t)
            for n in (t, model_of.get(t, t)):
                reason.setdefault(n.removesuffix(".weight") if n.endswith(".weight") else f"{n}_bias", why)
    for t, info in sorted(found.items()):
        if t in listed or info.dtype not in SIXTEEN_BIT or exempt_at_16(t, info, names):
            continue
        model = model_of.get(t, t)
        why = next((reason[k] for k in (_module(t), _module(model), t, model) if k in reason), None)
        if why is None and mtp.holds(t):
            why = MTP_COPIED
        elif why is None:
            role = role_of(t, info, names)
            router = part_of(_module(t), role, mtp=mtp) == "router"
            why = ROUTER_REASON if router else NOT_LINEAR.get(role, NO_RULE.format(role=role))
        tensors, nbytes = by.get(why, ([], 0))
        by[why] = ([*tensors, t], nbytes + info.nbytes)


def _module(name: str) -> str:
    return name.rpartition(".")[0]


# the accounting's roles (checkpoint/accounting.role_of) of tensors a checkpoint stores at 16 bits that left_at_16
# does not list: norms, the model's input and output embeddings (a per-layer embedding is listed, by the plan:
# NOT_LINEAR), and a quantized layer's metadata (scales, zero points, input scales, a KV cache's scales)
EXEMPT_ROLES = ("norm", "embedding", "lm_head", *METADATA_ROLES)


def exempt_at_16(name: str, t: Any, names: set[str]) -> bool:
    """Whether a tensor the checkpoint stores at 16 bits is one left_at_16 does not list: a norm, an input or output
    embedding, a quantized layer's metadata (EXEMPT_ROLES), or the bias of a layer stored quantized (its weight
    beside a scale: compressed-tensors' schemes quantize a Linear's weight and keep its bias as the source's)."""
    role = role_of(name, t, names)
    if role in EXEMPT_ROLES:
        return True
    return role == "bias" and scaled(_module(name), names)


NO_RULE = (
    "no rule of quantize's plan names it (its role in the accounting: {role}): no conversion reached it, so it is "
    "stored as the source stores it"
)


MTP_COPIED = (
    "multi-token-prediction (MTP) module (part `mtp`): transformers' causal LM does not load it, so no conversion "
    "reached it; the backend copied it from the source as stored (llm-compressor's save copies a source's `mtp.*` "
    "tensors where config.json declares MTP layers, and its quantization_config ignores them; the streamed path "
    "keeps them where that save would)"
)


SIXTEEN_BIT = ("BF16", "F16", "F32")


def not_converted(source: Path, out: Path) -> list[NotConverted]:
    """The parts of the source's multi-token-prediction module (architecture.mtp_of: its layers after the decoder's,
    its tensors under a prefix of their own) the saved checkpoint does not hold, read from both folders' headers:
    transformers' causal LM does not load them (it ignores a family's `mtp.*` tensors; loader.check_loading_info lets
    the declared layers go), so a conversion of the loaded model never holds them and saves the decoder alone, under
    the source's config.json, which still declares them, unless the backend's save copies them from the source
    (left_at_16: MTP_COPIED). One row for the layers, one for the prefixes; their bytes and parameters are the
    source's accounting's."""
    cfg = read_config(source)
    mtp = mtp_of(cfg)
    stored, _ = all_tensors(safetensors_files(source))
    if not any(mtp.holds(n) for n in stored):
        return []
    held = {mtp.prefix(n) for n in all_tensors(safetensors_files(out))[0] if mtp.holds(n)}
    modules = bits_report(source).modules
    key, layers = mtp_declaration(cfg)
    rows = []
    for in_part, why in (
        (
            mtp.in_layers,
            f"multi-token-prediction (MTP) layer(s) config.json declares after the decoder's ({key} {len(layers)}): "
            "transformers' causal LM does not load them, so the conversion never held them; the checkpoint stores "
            "the decoder alone under the same config.json, and an engine that drafts tokens with MTP layers "
            "(speculative decoding) finds none in it",
        ),
        (
            mtp.in_prefix,
            f"multi-token-prediction (MTP) module stored under a prefix of its own: transformers' {mtp.family} model "
            f"does not load it (it ignores {', '.join(p.pattern for p in mtp.patterns)}), so the conversion never "
            "held it, and the backend's save did not copy it from the source; the checkpoint stores the decoder "
            "alone under the same config.json, and an engine that drafts tokens with MTP layers (speculative "
            "decoding) finds none in it",
        ),
    ):
        names = [n for n in stored if in_part(n) and mtp.prefix(n) not in held]
        if names:
            gone = {mtp.prefix(n) for n in names}
            rows.append(_not_converted(why, mtp, gone, names, stored, modules))
    return rows


def _not_converted(
    why: str, mtp: Mtp, gone: set[str], names: list[str], stored: dict[str, Any], modules: list[Any]
) -> NotConverted:
    """One not_converted row: the MTP parts `gone` (prefixes), their tensors `names` in the source (`stored`) and
    their parameters by the source's accounting (`modules`)."""
    rows = [m for m in modules if mtp.holds(m.module + ".") and mtp.prefix(m.module + ".") in gone]
    return NotConverted(
        why=why,
        layers=sorted(gone, key=lambda p: (len(p), p)),
        tensors=len(names),
        bytes=sum(stored[n].nbytes for n in names),
        parameters=sum(m.parameters for m in rows),
    )


def _renamed(name: str, renamings: list[tuple[str, str]]) -> str:
    import re

    for src, tgt in renamings:
        name = re.sub(src, tgt, name)
    return name


# rows of a tensor read at once by the streamed check: its memory stays bounded by this many float32 elements
STREAM_CHUNK_ELEMENTS = 1 << 24


def streamed_finite_check(folder: Path) -> FiniteCheck:
    """Every floating-point tensor stored in the output's safetensors files is finite, read from the files one
    tensor at a time and in row chunks (safetensors' safe_open), never the whole model: the check of an output
    too large to reload. Each tensor is read through a file opened for it alone, so the file's pages mapped (which
    count in the RSS until the file is closed) are at most one tensor's (memory.streamed_check_terms). Names the
    first tensor that is not finite."""
    from safetensors import safe_open

    read = 0
    for f in safetensors_files(folder):
        for name in read_header(f)[0]:
            with safe_open(str(f), framework="pt") as st:
                _finite_in_chunks(st, name, f.name)
            read += 1
    return FiniteCheck(
        stage="every stored tensor read one at a time from the saved files (no logits: the model would not fit)",
        rows=0,
        tokens=0,
        finite=True,
        max_abs_logit=None,
        tensors_read=read,
    )


def _finite_in_chunks(st: Any, name: str, file: str) -> None:
    """One stored tensor of an open safetensors file read in row chunks of about STREAM_CHUNK_ELEMENTS; a
    RuntimeFailure naming it where a chunk holds NaN or inf."""
    import torch

    sl = st.get_slice(name)
    shape = sl.get_shape()
    if not shape:
        chunks = [st.get_tensor(name)]
    else:
        rows = max(1, STREAM_CHUNK_ELEMENTS // max(1, math.prod(shape[1:])))
        chunks = (sl[i : i + rows] for i in range(0, shape[0], rows))
    for t in chunks:
        if t.is_floating_point() and not torch.isfinite(t.float()).all():
            raise RuntimeFailure(
                f"the saved checkpoint's tensor {name} (in {file}) holds NaN or inf; nothing was kept. Add its "
                "layer to `ignore:`, or convert in float32 (`dtype: float32`)"
            )


# what compressed-tensors stores for a quantized Linear beside (or instead of) its weight
QUANT_PARAMS = ("weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape")


def kv_cache_params(out: Path, model: Any) -> set[str]:
    """The KV cache's quantization parameters the output stores where its config.json has a `kv_cache_scheme`
    (none otherwise): `k_scale` and `v_scale` (and `k_zero_point`, `v_zero_point` for an asymmetric scheme) on
    every module of `model` that compressed-tensors hooks its quantized cache on (its own
    `is_cached_attention_module`, as `apply_quantization_config` decides)."""
    qc = read_config(out).get("quantization_config")
    kv = qc.get("kv_cache_scheme") if isinstance(qc, dict) else None
    if not isinstance(kv, dict):
        return set()
    from compressed_tensors.quantization import is_cached_attention_module

    params = ("k_scale", "v_scale") + (() if kv.get("symmetric", True) else ("k_zero_point", "v_zero_point"))
    return {f"{name}.{p}" for name, m in model.named_modules() if is_cached_attention_module(m) for p in params}


def structure_check(out: Path, source: Path, quantized: set[str], trust_remote_code: bool) -> None:
    """The output's headers against the source model's structure built on the meta device (no memory): every
    parameter is stored, with its shape, except that a quantized Linear (`quantized`: the layer plan's names)
    stores a weight or packed weight and a scale, and a quantized KV cache stores its parameters on each attention
    module (kv_cache_params); nothing else is stored but the source's multi-token-prediction module (mtp_of), which
    the model does not hold and model_free_ptq copies as stored (left_at_16 lists it). A mismatch is our bug:
    RuntimeFailure."""
    stored, _ = all_tensors(safetensors_files(out))
    mtp = mtp_of(read_config(out, required=False))
    stored = {n: t for n, t in stored.items() if not mtp.holds(n)}
    model = meta_model(source, trust_remote_code)
    expected = dict(model.named_parameters())  # a tied parameter once
    problems = []
    seen = set()
    for name in sorted(kv_cache_params(out, model)):
        if name in stored:
            seen.add(name)
        else:
            problems.append(f"{name} (the KV cache's quantization parameter) is missing")
    for name, p in expected.items():
        module, _, param = name.rpartition(".")
        if module in quantized and param == "weight":
            have = {q for q in QUANT_PARAMS if f"{module}.{q}" in stored}
            seen |= {f"{module}.{q}" for q in have}
            if not have & {"weight", "weight_packed"} or "weight_scale" not in have:
                problems.append(f"{module} was to be quantized but stores {sorted(have) or 'nothing'}")
        elif name not in stored:
            problems.append(f"{name} is missing")
        elif stored[name].shape != list(p.shape):
            problems.append(f"{name} has shape {stored[name].shape}, the model's is {list(p.shape)}")
        else:
            seen.add(name)
    if extra := sorted(set(stored) - seen):
        problems.append(f"{len(extra)} tensor(s) the model does not have, e.g. {extra[0]}")
    if problems:
        raise RuntimeFailure(f"the streamed output {out} does not match the model's structure: {'; '.join(problems)}")
