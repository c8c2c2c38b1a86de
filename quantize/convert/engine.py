"""The engine: a validated recipe in, a checked checkpoint with its quantize.json out.

preflight   everything that can be checked before a model is loaded
convert     plan (plan.py) -> the backend's preparation (backends/: llm-compressor's modifiers,
            backends/llmcompressor/modifiers.py)
            -> load -> calibrate and quantize (the backend) -> atomic save, dtype cast (dtypes.py) -> reload
            and the one finiteness check (checks.py) -> accounting -> quantize.json and model card.
            Every backend gets the same checks, accounting and records; this module names none of them.
memory      before either (and before torch is imported): the memory plan (memory.py) chooses the path, in-memory
            or streamed (a data-free recipe shard by shard through the backend's `stream`, checked tensor by
            tensor against the headers), or refuses a run that cannot fit, the check of its output included.
source      then, once for every path, the source against config.json as transformers would load it
            (checks.check_source): a mismatch is the user's exit 2 before anything is read or converted.
file        a backend that converts a file into a file (backends.converts_files: llama.cpp's GGUF quantizer) takes
            none of the model steps: its `source` names and checks the file in preflight, its `convert_file` writes
            and checks the output in the temporary folder; the accounting (from the written file's header), the
            source's identity, quantize.json and the model card are this module's, as on every path. No memory
            plan is made for it (its library reads and writes a tensor at a time).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from quantize import records
from quantize.checkpoint import accounting, vllm_reading
from quantize.checkpoint.decompressed import transformers_reading
from quantize.checkpoint.files import (
    check_identity,
    hf_path,
    identity_sha256,
    is_quantized,
    missing_packages,
    quant_method,
    read_config,
    reads_per_expert,
    safetensors_files,
    weights_sha256,
)
from quantize.checkpoint.headers import all_tensors
from quantize.checkpoint.loader import DEFAULT_MODEL_HUB_ID, meta_model, resolve_model
from quantize.convert import memory
from quantize.convert.backends import backend_for, backend_named, check, converts_files
from quantize.convert.backends.base import FileJob, Job
from quantize.convert.calibration import CalibrationSet, build_calibration, check_calibration
from quantize.convert.card import model_card
from quantize.convert.checks import (
    check_source,
    left_at_16,
    not_converted,
    reload_check,
    streamed_finite_check,
    structure_check,
)
from quantize.convert.dtypes import (
    calibration_dtype,
    cast_saved_floats,
    check_narrowing,
    held_dtypes,
    source_dtype,
    written_dtype,
)
from quantize.convert.plan import LayerPlan, plan_layers
from quantize.convert.provenance import Phases, library_versions, memory_record, peak_rss_bytes
from quantize.convert.recipe import Method, Recipe, resolved_dict
from quantize.errors import UsageError
from quantize.io import atomic_dir, leftovers, recover, sha256_json, unwritable_parent
from quantize.quiet import quiet_libraries
from quantize.records import (
    CalibrationRecord,
    EngineRecord,
    FiniteCheck,
    MemoryRecord,
    RecipeRef,
    RunRecord,
    SourceModel,
)


def output_dir(recipe: Recipe, override: str | None) -> Path:
    return Path(override or recipe.output or f"outputs/{recipe.name}")


def preflight(recipe: Recipe, out: Path, force: bool) -> Path:
    """Everything that can be checked before torch is imported or a model is loaded, but the calibration (checked
    after the memory plan, `calibration_after_the_plan`): what the backend runs and its packages, the model folder
    (a file-to-file backend's source file, whose `source` checks its calibration its own way), and the whole output
    path. Returns the source."""
    check(recipe)
    backend = backend_for(recipe)
    if missing := missing_packages(backend.packages):
        raise UsageError(
            f"backend: {recipe.backend} needs {' and '.join(backend.packages)}, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed here; {backend.install}"
        )
    if out.is_symlink() and not out.exists():
        raise UsageError(
            f"output {out} is a link to {os.readlink(out)}, which does not exist (or loops); "
            "remove the link or choose another `output:` (or --output)"
        )
    model_dir = backend.source(recipe) if converts_files(type(backend)) else resolve_model(recipe.model)
    if not converts_files(type(backend)):
        check_unquantized(model_dir)
        check_narrowing(model_dir, recipe.dtype)  # a cast to float16 that would overflow, refused from the headers
    # the longest name written beside it, `.NAME.offload-PID`: a 250-byte name failed with "File name too long"
    # when its temporary folder was made, after the conversion (a review)
    if (longest := len(f".{out.name}.offload-{2**22}".encode())) > NAME_MAX:
        raise UsageError(
            f"output {out}: its name is {len(out.name.encode())} bytes, and the folders written beside it while it is "
            f"made add {longest - len(out.name.encode())}, past the {NAME_MAX} bytes a file name may have; choose a "
            "shorter `output:` (or --output)"
        )
    if (parent := unwritable_parent(out)) is not None:
        if not parent.is_dir():
            raise UsageError(
                f"output {out}: {parent} is a file, so nothing can be written below it; "
                "choose another `output:` (or --output)"
            )
        raise UsageError(f"output {out}: {parent} is not writable; choose another `output:` (or --output)")
    src = Path(model_dir).resolve()
    folder = src if src.is_dir() else src.parent
    if folder.is_relative_to(out.resolve()):
        raise UsageError(
            f"output {out} holds the model it converts ({model_dir}): the finished output would replace its own "
            "source (--force), and the record would name a file that is no longer what was read. Choose an "
            "`output:` (or --output) outside the model's folder"
        )
    if out.exists() and not force:
        raise UsageError(
            f"output {out} already exists; choose another `output:` (or --output), or pass --force to replace it"
        )
    if out.exists() and not (out / "quantize.json").is_file():
        raise UsageError(
            f"output {out} exists and is not a quantize checkpoint; refusing to replace it even with --force"
        )
    return model_dir


def check_unquantized(model_dir: Path) -> None:
    """A loaded-model backend quantizes a checkpoint of float weights: one already quantized (config.json's
    quantization_config, or a quantizer's side file) loaded as its quantizer's modules, which no modifier takes,
    and ended in exit 3 after the load on both paths (an FP8 output given as `model:`: "'Linear' object has no
    attribute 'weight'" in memory, a float8 kernel error streamed: a review)."""
    if is_quantized(model_dir):
        method = quant_method(model_dir) or "a quantization_config"
        side = "" if read_config(model_dir).get("quantization_config") else ", from its side file"
        raise UsageError(
            f"model {model_dir} is already quantized ({method}{side}); quantize "
            "converts a checkpoint of 16- or 32-bit float weights. Give the recipe's `model:` the unquantized "
            "checkpoint this one was made from"
        )


def complete_output(folder: Path) -> bool:
    """A whole quantize output: a real folder whose quantize.json reads as a RunRecord and whose weight files
    hash to the weights_sha256 it records (a folder half deleted, or only its quantize.json, is not)."""
    if folder.is_symlink() or not (folder / "quantize.json").is_file():
        return False
    try:  # the record first: a folder whose quantize.json does not read is not hashed at all
        recorded = records.read(RunRecord, folder / "quantize.json").weights_sha256
        return weights_sha256(folder) == recorded
    except (UsageError, OSError):
        return False


def tidy_leftovers(out: Path, clean: bool) -> list[str]:
    """What killed runs left beside the output: reported, or with `clean` removed; a complete output that a killed
    --force had moved aside is put back first. Returns the messages for the user."""
    import shutil

    said = []
    if (restored := recover(out, complete_output)) is not None:
        said.append(f"{out} was missing after an interrupted --force; restored it from {restored.name}")
    found = leftovers(out)
    if found and clean:
        for p in found:
            shutil.rmtree(p, ignore_errors=True)
        gone = [p for p in found if not p.exists()]
        said.append(f"removed {len(gone)} folder(s) left by killed runs: {', '.join(p.name for p in gone)}")
        if kept := [p for p in found if p.exists()]:
            said.append(f"warning: could not remove {', '.join(str(p) for p in kept)}; remove it by hand")
    elif found:
        said.append(
            f"warning: {len(found)} folder(s) left by killed runs beside {out}: "
            f"{', '.join(p.name for p in found)}; pass --clean to remove them"
        )
    return said


def calibration_after_the_plan(recipe: Recipe, model_dir: Path) -> None:
    """The calibration read, rendered and packed with the checkpoint's tokenizer files (check_calibration), once the
    memory plan (headers only) has taken the run: 100,000 samples of 131,072 tokens were packed for 21 s and 463 MB
    before the plan refused them in milliseconds (a review)."""
    if recipe.needs_calibration and recipe.calibration is not None:
        check_calibration(recipe.calibration, model_dir)


def recipe_sha256(recipe: Recipe) -> str:
    """The sha256 of a recipe given as an object, not a file (the Python API): its resolved form's, the same
    hash quantize.json records as `resolved_sha256`."""
    return sha256_json(resolved_dict(recipe))


def convert(
    recipe: Recipe,
    recipe_sha256: str,
    recipe_path: str,
    out: Path,
    force: bool = False,
    quiet: bool = False,
    max_memory: int | None = None,
) -> RunRecord:
    """Check everything checkable and plan the memory (before torch is imported; `max_memory` overrides the
    recipe's and MemAvailable), then convert on the planned path; `quiet` silences the libraries for the run."""
    model_dir = preflight(recipe, out, force)
    if converts_files(backend_named(recipe.backend)):
        return _convert_file(recipe, recipe_ref(recipe, recipe_sha256, recipe_path), model_dir, out, force)
    mplan = memory.plan(recipe, model_dir, max_memory, out=out)
    calibration_after_the_plan(recipe, model_dir)
    with quiet_libraries(quiet), offload_folder(out, mplan) as offload_dir:
        check_source(model_dir, recipe.trust_remote_code, mplan.path == "streamed")  # one pre-load check, all paths
        if mplan.path == "streamed":
            return _convert_streamed(recipe, recipe_sha256, recipe_path, model_dir, out, force, mplan)
        return _convert(recipe, recipe_sha256, recipe_path, model_dir, out, force, mplan, offload_dir)


NAME_MAX = 255  # bytes of one file name on Linux's file systems (ext4, xfs, btrfs, tmpfs)


@contextmanager
def offload_folder(out: Path, mplan: memory.MemoryPlan) -> Iterator[Path | None]:
    """Where an offloaded run keeps its weights: a fresh folder beside the output (the same disk), `.NAME.offload-PID`,
    removed with everything in it when the run ends; None on the other paths. Named by the process, as the output's
    own `.NAME.tmp-PID` is, so that a run the kernel killed (the likely end of a run that offloads) leaves a folder
    io.leftovers reports and `--clean` removes: a random suffix, as large as the model, was never found again."""
    if mplan.path != "offloaded":
        yield None
        return
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.parent / f".{out.name}.offload-{os.getpid()}"
    if folder.is_dir() and not folder.is_symlink():  # a killed run's, whose process id this one was given again
        shutil.rmtree(folder)
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _convert(  # noqa: PLR0913 (convert's inputs, the plan and where it offloads)
    recipe: Recipe,
    recipe_sha256: str,
    recipe_path: str,
    model_dir: Path,
    out: Path,
    force: bool,
    mplan: memory.MemoryPlan,
    offload_dir: Path | None,
) -> RunRecord:
    """Load (with `offload_dir`: the weights kept on disk there, one decoder layer calibrated at a time),
    calibrate and quantize, save, check: a full reload with logits unless the plan says the model does not fit
    (then the streamed checks: every stored tensor finite, the headers against the meta-device model)."""
    import torch

    phases = Phases()
    started = dt.datetime.now(dt.UTC)
    backend = backend_for(recipe)
    with phases("plan"):
        plan = (
            plan_layers(meta_model(model_dir, recipe.trust_remote_code), recipe, backend.linearizes_experts)
            if recipe.method is not Method.llmcompressor
            else LayerPlan()
        )
        prepared = backend.prepare(recipe, plan)
    with phases("load"):
        held = identity_sha256(model_dir)  # before the load: check_identity holds the output to it
        work_dtype, dtype_reason = calibration_dtype(recipe, model_dir)
        torch_dtype = None if work_dtype == "auto" else getattr(torch, work_dtype)
        offload = {"offload_dir": offload_dir} if offload_dir is not None else {}
        model, tok = backend.load(model_dir, recipe, torch_dtype, **offload)
        save_dtype = source_dtype(model_dir)
        source_hash = weights_sha256(model_dir)
        source_params = accounting.parameter_count(model_dir)
    calib: CalibrationSet | None = None
    if recipe.needs_calibration:
        with phases("tokenize"):
            calib = build_calibration(tok, recipe.calibration)
    seed = recipe.calibration.seed if recipe.calibration else 0
    torch.manual_seed(seed)
    with phases("quantize"):
        job = Job(model, tok, model_dir, recipe, torch_dtype, calib, prepared, offloaded=offload_dir is not None)
        model, ran = backend.quantize(job)
        del job
        plan.routing = backend.routing()
    # what the saved checkpoint is run on after reloading: its logits must be finite (the one finiteness check:
    # it sees what is shipped, after any cast, and names the first non-finite layer)
    probe = (
        calib.input_ids[:2, :128]
        if calib is not None
        else torch.tensor([tok("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    )
    with atomic_dir(out, replace=force) as tmp:
        with phases("save"):
            backend.save(model, tmp)
            tok.save_pretrained(tmp)
            if work_dtype != "auto" and save_dtype != work_dtype:  # as a load in the source's dtype holds them
                cast_saved_floats(tmp, save_dtype, held_dtypes(model_dir, recipe.trust_remote_code, save_dtype))
        with phases("reload-check"):
            del model  # the quantized model in memory goes before a second copy loads
            backend.release()
            if mplan.full_reload:
                finite = [reload_check(tmp, probe, recipe.trust_remote_code)]
            else:  # the plan says the whole model does not fit: checked tensor by tensor, as a streamed output
                structure_check(
                    tmp, model_dir, {n for names in plan.groups.values() for n in names}, recipe.trust_remote_code
                )
                finite = [streamed_finite_check(tmp)]
        check_identity(model_dir, held)  # the source read is the one recorded, or nothing is placed
        meta = _written(
            tmp,
            phases,
            Made(recipe, recipe_sha256, recipe_path, model_dir, started, plan, seed, mplan),
            Provenance(source_hash, source_params, ran, work_dtype, dtype_reason),
            calib.record if calib else None,
            finite,
        )
    return meta


def _convert_streamed(
    recipe: Recipe,
    recipe_sha256: str,
    recipe_path: str,
    model_dir: Path,
    out: Path,
    force: bool,
    mplan: memory.MemoryPlan,
) -> RunRecord:
    """A data-free recipe shard by shard (the backend's `stream`), never the whole model in memory: the same
    layer plan, modifiers and records as `_convert`; the output checked tensor by tensor (finite, and its headers
    against the meta-device model), and reloaded with its logits checked only where the plan says it fits."""
    import torch
    from transformers import AutoTokenizer

    phases = Phases()
    started = dt.datetime.now(dt.UTC)
    backend = backend_for(recipe)
    with phases("plan"):
        meta = meta_model(model_dir, recipe.trust_remote_code)
        plan = plan_layers(meta, recipe, backend.linearizes_experts)
        prepared = backend.prepare(recipe, plan)
        source_hash = weights_sha256(model_dir)
        source_params = accounting.parameter_count(model_dir)
        held = identity_sha256(model_dir)  # before the stream: check_identity holds the output to it
        save_dtype = source_dtype(model_dir)
        as_loaded = held_dtypes(model_dir, recipe.trust_remote_code, save_dtype)  # each tensor as the load holds it
    seed = recipe.calibration.seed if recipe.calibration else 0
    torch.manual_seed(seed)
    with atomic_dir(out, replace=force) as tmp:
        with phases("quantize"):
            ran = backend.stream(model_dir, tmp, prepared, meta, as_loaded)  # quantized from those values
            for stale in ("quantize.json", "README.md"):  # copied from a source that is itself a quantize output
                (tmp / stale).unlink(missing_ok=True)
        with phases("save"):  # each tensor in the dtype the in-memory path's load holds it in, as that path saves it
            cast_saved_floats(tmp, save_dtype, as_loaded)  # what the quantization made in another dtype, if anything
        with phases("reload-check"):
            structure_check(
                tmp, model_dir, {n for names in plan.groups.values() for n in names}, recipe.trust_remote_code
            )
            finite = [streamed_finite_check(tmp)]
            if mplan.full_reload:
                tok = AutoTokenizer.from_pretrained(hf_path(model_dir), trust_remote_code=recipe.trust_remote_code)
                probe = torch.tensor([tok("The quick brown fox jumps over the lazy dog.")["input_ids"]])
                finite.append(reload_check(tmp, probe, recipe.trust_remote_code))
        reason = (
            "streamed shard by shard (model_free_ptq): each tensor cast to the dtype the in-memory path's load holds "
            "it in (the checkpoint's own dtype, float32 where the model keeps a module in float32), then quantized "
            "and saved in it"
        )
        check_identity(model_dir, held)  # the source read is the one recorded, or nothing is placed
        meta = _written(
            tmp,
            phases,
            Made(recipe, recipe_sha256, recipe_path, model_dir, started, plan, seed, mplan),
            Provenance(source_hash, source_params, ran, "auto", reason),
            None,
            finite,
        )
    return meta


class Made(NamedTuple):
    """What a conversion was asked for and planned: the recipe and where it came from, the source, when it started,
    the layer plan, the seed and the memory plan."""

    recipe: Recipe
    recipe_sha256: str
    recipe_path: str
    model_dir: Path
    started: dt.datetime
    plan: LayerPlan
    seed: int
    mplan: memory.MemoryPlan


class Provenance(NamedTuple):
    """What the run found and did: the source's weights hash and parameters, what ran, and the calibration dtype
    with its reason (the dtype saved is read from the output's headers: dtypes.written_dtype)."""

    source_hash: str | None
    source_params: int | None
    ran: str
    work_dtype: str
    dtype_reason: str


def _written(
    tmp: Path,
    phases: Phases,
    made: Made,
    prov: Provenance,
    calibration: CalibrationRecord | None,
    finite: list[FiniteCheck],
) -> RunRecord:
    """The saved output's accounting, then its quantize.json and model card written into `tmp`, for either path."""
    recipe = made.recipe
    with phases("account"):
        report = accounting.bits_report(tmp)
        out_hash = weights_sha256(tmp)
        layer_plan = made.plan.record()
        layer_plan.left_16bit = left_at_16(
            tmp,
            {n for names in made.plan.groups.values() for n in names},
            made.plan.kept | made.plan.unconverted | made.plan.ignored,
            made.plan.stored_names,
            made.plan.renamed,
        )
        layer_plan.not_converted = not_converted(made.model_dir, tmp)
    # bits per weight are per parameter of the source the checkpoint holds: its MTP layers, not converted, are not;
    # an output layer the conversion untied from the embeddings to quantize it is (the checkpoint's own, as inspect)
    untied, note = accounting.untied_head(made.model_dir, report)
    held = (
        prov.source_params - sum(g.parameters for g in layer_plan.not_converted) + untied
        if prov.source_params
        else None
    )
    report.notes += [note] if note else []
    meta = RunRecord(
        created=made.started.isoformat(timespec="seconds"),
        recipe=recipe_ref(recipe, made.recipe_sha256, made.recipe_path),
        method=recipe.method.value,
        scheme=recipe.scheme_or_none.value if recipe.scheme_or_none else None,
        source_model=SourceModel(
            path=str(made.model_dir), weights_sha256=prov.source_hash, parameters=prov.source_params
        ),
        weights_sha256=out_hash,
        calibration=calibration,
        seed=made.seed,
        layer_plan=layer_plan,
        engine=EngineRecord(
            backend=recipe.backend,
            modifiers=prov.ran,
            calibration_dtype=prov.work_dtype,
            saved_dtype=written_dtype(tmp),
            calibration_dtype_reason=prov.dtype_reason,
        ),
        versions=library_versions(),
        time_seconds=dict(phases.seconds, total=phases.total()),
        memory=MemoryRecord(**memory_record()),
        finite_checks=finite,
        bits=report.as_record(held),
        memory_plan=made.mplan.record(),
    )
    return _saved(tmp, meta, recipe)


def recipe_ref(recipe: Recipe, sha256: str, path: str) -> RecipeRef:
    """quantize.json's recipe: where it came from, its file's sha256, and its resolved form with that form's sha256."""
    resolved = resolved_dict(recipe)
    return RecipeRef(path=path, sha256=sha256, resolved=resolved, resolved_sha256=sha256_json(resolved))


def _saved(tmp: Path, meta: RunRecord, recipe: Recipe) -> RunRecord:
    """quantize.json and the model card written into the output's temporary folder."""
    records.write(tmp / "quantize.json", meta)
    # a per-expert MoE checkpoint: what transformers' own loader makes of its experts (a file-to-file backend's GGUF
    # is no transformers checkpoint)
    files = converts_files(backend_named(recipe.backend))
    per_expert = not files and reads_per_expert(tmp)
    misread = transformers_reading(tmp) if per_expert else None
    vllm = None
    if per_expert:  # a family transformers reads only fused: what vLLM's source says it reads (vllm_reading)
        vllm = vllm_reading.said(str(read_config(tmp)["model_type"]), list(all_tensors(safetensors_files(tmp))[0]))
    hub_id = DEFAULT_MODEL_HUB_ID if recipe.model is None else None
    (tmp / "README.md").write_text(model_card(meta, hub_id, misread, vllm))
    return meta


SCRATCH = ".scratch"  # a file-to-file backend's intermediates, inside the output's temporary folder


def _convert_file(recipe: Recipe, ref: RecipeRef, source: Path, out: Path, force: bool) -> RunRecord:
    """A file-to-file backend's conversion (backends.converts_files): the source's identity and parameters, then
    the backend writes and checks its output in the temporary folder (its intermediates in a scratch folder there,
    removed before the output is accounted, so a killed run leaves them inside the `.NAME.tmp-PID` leftover that
    `--clean` removes); the accounting reads the written file's header. Torch is never imported."""
    phases = Phases()
    started = dt.datetime.now(dt.UTC)
    backend = backend_for(recipe)
    with phases("source"):
        source_hash = weights_sha256(source)
        source_params = accounting.parameter_count(source)
        held = identity_sha256(source)
    with atomic_dir(out, replace=force) as tmp:
        scratch = tmp / SCRATCH
        scratch.mkdir()
        try:
            done = backend.convert_file(FileJob(source, tmp, scratch, recipe, phases))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        check_identity(source, held)  # the source read is the one recorded, or nothing is placed
        with phases("account"):
            report = accounting.bits_report(tmp)
            out_hash = weights_sha256(tmp)
        meta = RunRecord(
            created=started.isoformat(timespec="seconds"),
            recipe=ref,
            method=recipe.method.value,
            scheme=done.scheme,
            source_model=SourceModel(path=str(source), weights_sha256=source_hash, parameters=source_params),
            weights_sha256=out_hash,
            calibration=done.calibration,
            seed=done.calibration.seed if done.calibration else 0,
            layer_plan=done.layer_plan,
            engine=done.engine,
            versions=library_versions() | done.versions,
            time_seconds=dict(phases.seconds, total=phases.total()),
            memory=MemoryRecord(
                peak_rss_bytes=max(peak_rss_bytes(), done.child_peak_rss_bytes), peak_accelerator_bytes=None
            ),
            finite_checks=done.finite,
            bits=report.as_record(source_params),
            memory_plan=None,
        )
        _saved(tmp, meta, recipe)
    return meta
