"""The memory plan of a conversion, made before torch is imported or a weight is read: what the run would hold at
its peak on each path, from the safetensors headers and config.json alone, against the memory this machine has.

    in-memory   load the whole model, calibrate, save, reload the output (engine._convert): about two copies of
                the model in its calibration dtype (measured: FP8 dynamic peaked at 3.46 GB RSS for a 1.45 GB
                source, 11.24 GB for 5.77 GB), plus the calibration activations, plus the libraries
    offloaded   calibrated schemes on a backend that `offloads` (llm-compressor): the weights stay on disk
                (compressed-tensors' disk offload, loaded with device_map="auto_offload"), and the sequential
                pipeline brings one decoder layer at a time into memory to calibrate it (engine._convert with
                `offload`): a decoder layer, its working copies and Hessians, the calibration activations, the
                largest tensor outside the layers, plus the libraries; then its save, a phase of its own
                (offloaded_save_terms): save_pretrained holds the compressed output while it writes it
    streamed    data-free schemes its backend `streams` only (llm-compressor's `model_free_ptq`), one safetensors
                shard at a time (engine._convert_streamed): per worker a shard, its output, float32 working copies
                of its largest tensor (and, for the FP4 formats, fused partners read from other shards), plus the
                libraries; after it, an output shard is rewritten where a tensor's dtype is cast to the one the
                in-memory path saves or an MTP tensor that path leaves out is taken out (one shard at a time, within
                the same terms)

After the conversion, on every path, its output is checked in a phase of its own: the full reload (transformers
loads the output, decompressing it into the model while its files stay mapped, and runs a probe: reload_terms)
where that fits, else the streamed checks (one stored tensor at a time: streamed_check_terms). The plan's need
is the larger of the two phases, so a budget (`--max-memory`, `max_memory:`) bounds the whole run, the check
included; before 2026-12-06 the reload was planned in whenever the model alone fit, and a 1.4 GB source streamed
under 2 GiB peaked at 2.5 GiB (benchmarks/results/memory_budget.txt).

Every figure is an estimate with its assumption stated beside it; the plan's numbers go to quantize.json
(MemoryPlanRecord: the conversion's terms and each phase's need) and to `quantize run`'s output. A run that cannot
fit is refused (UsageError, exit 2) naming its largest term and what to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from quantize.checkpoint.architecture import routed_experts
from quantize.checkpoint.files import read_config, safetensors_files
from quantize.checkpoint.headers import DTYPE_BITS, TensorInfo, all_tensors
from quantize.compat.compressed_tensors import PRESET_GLOBAL_SCALE
from quantize.compat.llmcompressor import MERGED_BY_VLLM
from quantize.convert.backends import backend_named, calibration_default
from quantize.convert.checks import STREAM_CHUNK_ELEMENTS
from quantize.convert.recipe import FORMATS, Method, Offload, Recipe, Scheme, Streaming
from quantize.errors import UsageError
from quantize.records import MemoryPlanRecord

GiB = 1024**3
# RSS of a process that has imported torch, transformers, llm-compressor and compressed-tensors (VmHWM 532 MiB
# measured on this project's CPU machine, 2026-12-03; 612-626 MiB on 2026-12-06, before a model loads), rounded up
RUNTIME_BYTES = 640 * 1024**2
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# stored bits per quantized weight (int4 and int8 pack exactly into int32 words; int3 packs 10 to a word)
WEIGHT_BITS = {
    Scheme.W4A16: 4.0,
    Scheme.W3A16: 3.2,
    Scheme.W8A16: 8.0,
    Scheme.W8A8: 8.0,
    Scheme.FP8: 8.0,
    Scheme.FP8_DYNAMIC: 8.0,
    Scheme.NVFP4: 4.0,
    Scheme.NVFP4A16: 4.0,
    Scheme.MXFP4: 4.0,
    Scheme.MXFP4A16: 4.0,
    Scheme.FP8_BLOCK: 8.0,
    Scheme.W4AFP8: 4.0,
}
# bits of scale per weight of a grouped format: one scale (and for NVFP4 E4M3, MXFP4 E8M0: one byte) per group
SCALE_BITS = {Scheme.NVFP4: 8, Scheme.NVFP4A16: 8, Scheme.MXFP4: 8, Scheme.MXFP4A16: 8}
FUSED_PARTNERS = {Scheme.NVFP4A16, Scheme.MXFP4A16, Scheme.MXFP4}  # FP4 formats share a global scale across q/k/v
# float32 copies of the largest weight a streamed worker holds at once (upcast, observer, quantize-dequantize
# temporaries), fitted to peak RSS measured on a 26.2 GiB source of 14336 x 4096 weights (docs/results.md, "Bigger
# than memory"): with 3 copies assumed, FP8 dynamic peaked 0.03 GiB over the estimate and NVFP4A16 1.12 GiB over
# (the fused gate/up pair's global scale and the FP4 rounding's temporaries); 4 and 9 put both estimates above.
# On a 1.3 GiB source of 5632 x 2048 weights (benchmarks/memory_budget.py, 2026-12-06) FP8 dynamic peaked
# 1,036-1,129 MiB in five runs (418-511 MiB over the 618 MiB held before its first shard: the allocator keeps some of
# each shard's memory), above the 1,066 MiB that 4 copies estimate; 7 estimate 1,200 MiB
WORKING_COPIES = dict.fromkeys(FUSED_PARTNERS, 9)
DEFAULT_WORKING_COPIES = 7


@dataclass(frozen=True)
class Available:
    bytes: int | None
    source: str  # "--max-memory", "recipe max_memory", "MemAvailable", or "unknown"


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The kernel's MemAvailable (what can be allocated without swapping), or None where there is none."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available(recipe: Recipe, flag: int | None) -> Available:
    if flag is not None:
        return Available(flag, "--max-memory")
    if recipe.max_memory is not None:
        return Available(recipe.max_memory, "recipe max_memory")
    found = mem_available()
    return Available(found, "MemAvailable" if found is not None else "unknown")


@dataclass
class Checkpoint:
    """What the headers and config.json say about a source: bytes, shards, decoder layers, shapes."""

    tensors: dict[str, TensorInfo]
    shard_bytes: dict[str, int]
    hidden: int
    heads: int
    dtype: str
    experts: tuple[str, int] | None = None  # config.json's routed experts (field, E); None for a dense model

    @property
    def model_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def float_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values() if t.dtype in ("F32", "F16", "BF16"))

    @property
    def largest_shard(self) -> tuple[str, int]:
        return max(self.shard_bytes.items(), key=lambda kv: kv[1])

    @property
    def largest_layer_bytes(self) -> int:
        by: dict[str, int] = {}
        for n, t in self.tensors.items():
            if m := _LAYER.search(n):
                by[m.group(1)] = by.get(m.group(1), 0) + t.nbytes
        return max(by.values(), default=0)

    @property
    def largest_quantized_elements(self) -> int:
        """Elements of the largest weight a Linear target would quantize (the others are copied as they are)."""
        return max(
            (t.nbytes * 8 // DTYPE_BITS[t.dtype] for n, t in self.tensors.items() if quantized_weight(n, t)),
            default=0,
        )


def read_checkpoint(model_dir: Path) -> Checkpoint:
    tensors, _ = all_tensors(safetensors_files(model_dir))
    shard: dict[str, int] = {}
    for t in tensors.values():
        shard[t.file] = shard.get(t.file, 0) + t.nbytes
    cfg = read_config(model_dir)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    hidden = text.get("hidden_size") if isinstance(text.get("hidden_size"), int) else 0
    heads = text.get("num_attention_heads") if isinstance(text.get("num_attention_heads"), int) else 0
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    return Checkpoint(tensors, shard, hidden, heads, dtype, routed_experts(cfg))


def quantized_weight(name: str, t: TensorInfo) -> bool:
    """A tensor the recipe's Linear targets would quantize, judged by name and shape (no model is built): a 2-D
    float `.weight` inside a decoder layer that is not a norm. An estimate: exact targets need the model's modules."""
    module = name.rpartition(".")[0]
    return (
        name.endswith(".weight")
        and len(t.shape) == 2
        and t.dtype in ("F32", "F16", "BF16")
        and _LAYER.search(name) is not None
        and not module.endswith("norm")
    )


def output_bytes(ckpt: Checkpoint, tensors: list[TensorInfo], recipe: Recipe) -> int:
    """Estimated bytes of these tensors once converted: quantized weights at the scheme's stored bits plus one
    16-bit scale per group (per output channel without groups), the rest as they are."""
    scheme = recipe.scheme_or_none
    total = 0
    for t in tensors:
        if scheme is None or not quantized_weight(t.name, t):
            total += t.nbytes
            continue
        out_f, in_f = t.shape
        g = FORMATS[scheme].group if scheme in FORMATS else recipe.weight_group
        scale = out_f * (in_f // g if g else 1) * SCALE_BITS.get(scheme, 16) / 8
        total += int(out_f * in_f * WEIGHT_BITS[scheme] / 8 + scale)
    return total


def streamable(recipe: Recipe) -> str | None:
    """Why this recipe cannot be streamed shard by shard, or None when it can (its backend `streams` it)."""
    s = recipe.scheme_or_none
    streams = backend_named(recipe.backend).streams
    if not streams:
        return f"backend {recipe.backend} loads the whole model"
    if recipe.needs_calibration:
        return "it calibrates on data, which needs the whole model (only data-free schemes stream)"
    if (recipe.method, s) not in streams:
        return (
            f"method {recipe.method.value} with scheme {s.value if s else None} is not one backend {recipe.backend} "
            "streams"
        )
    if getattr(recipe, "overrides", None):
        return "per-layer overrides are planned on the whole model"
    if recipe.dtype is not None:
        return f"dtype {recipe.dtype}: streaming quantizes each tensor in the checkpoint's own dtype"
    return None


def offloadable(recipe: Recipe) -> str | None:
    """Why this recipe cannot calibrate with its weights offloaded to disk, or None when it can (its backend
    `offloads`)."""
    if not backend_named(recipe.backend).offloads:
        return f"backend {recipe.backend} loads the whole model"
    if not recipe.needs_calibration:
        return "it calibrates nothing (a data-free scheme streams shard by shard instead)"
    if recipe.method is Method.llmcompressor:
        return "a verbatim `stages:` recipe may name any pipeline; offloading is planned for the compiled ones"
    return None


def offloaded_terms(ckpt: Checkpoint, recipe: Recipe) -> dict[str, int]:
    work = work_dtype_bytes(recipe, ckpt)
    src = DTYPE_BYTES.get(ckpt.dtype, 4)
    layer = ckpt.largest_layer_bytes * work // src
    hessians: dict[str, int] = {}
    for n, t in ckpt.tensors.items():
        if quantized_weight(n, t) and (m := _LAYER.search(n)):
            hessians[m.group(1)] = hessians.get(m.group(1), 0) + t.shape[1] ** 2 * 4
    outside = max((t.nbytes for n, t in ckpt.tensors.items() if not _LAYER.search(n)), default=0)
    return {
        # assumed: the onloaded layer, a float32 copy of it (GPTQ's working weight) and its quantized output
        "decoder layer onloaded (with working copies)": layer + 2 * ckpt.largest_layer_bytes * 4 // src,
        # one float32 in_features² Hessian per Linear of the layer being calibrated (GPTQ; an upper bound for AWQ)
        "Hessians of one layer": max(hessians.values(), default=0),
        "calibration activations": activation_bytes(ckpt, recipe, work),
        "largest tensor outside the layers (embedding, head)": outside * work // src,
        "libraries": RUNTIME_BYTES,
    }


def offloaded_save_terms(ckpt: Checkpoint, out_bytes: int) -> dict[str, int]:
    """The offloaded path's save, after calibration has let its layer and activations go: save_pretrained gathers
    the compressed state dict, onloading one decoder layer at a time to compress it, and holds what it gathered
    while the shards are written (measured: FP8 dynamic + FP8 KV of the 1.3 GiB Llama of
    benchmarks/memory_budget.py rose from 685 to 1,404 MiB RSS while saving, its output 810 MiB by output_bytes);
    plus the libraries."""
    return {
        "save: the compressed output gathered while it is written": out_bytes,
        "save: a decoder layer onloaded to compress": ckpt.largest_layer_bytes,
        "libraries": RUNTIME_BYTES,
    }


@dataclass
class MemoryPlan:
    """A path and what each of its phases holds at its peak: the conversion (`terms`), its save where that holds
    more than the conversion's own terms cover (`save_terms`: the offloaded path's), then the check of its output
    (`check_terms`: the full reload where it fits, else the streamed checks). The run's need is the largest
    phase."""

    path: str  # "in-memory", "offloaded" or "streamed"
    available: Available
    terms: dict[str, int]  # what the conversion holds at its peak, by name
    model_bytes: int
    largest_shard_bytes: int
    largest_layer_bytes: int
    activation_bytes: int
    output_bytes: int
    workers: int
    full_reload: bool  # whether the output's reload with logits fits too (else only the streamed checks)
    alternatives: dict[str, int] = field(default_factory=dict)  # the other path's need, when it was weighed
    check_terms: dict[str, int] = field(default_factory=dict)  # what the output's check holds at its peak
    save_terms: dict[str, int] = field(default_factory=dict)  # what the save holds, where it is a phase of its own

    @property
    def phases(self) -> dict[str, int]:
        """Each phase's need: the conversion, its save where planned apart, and the check planned after them."""
        check = "full reload check" if self.full_reload else "streamed checks"
        save = {"save": sum(self.save_terms.values())} if self.save_terms else {}
        return {"conversion": sum(self.terms.values()), **save, check: sum(self.check_terms.values())}

    @property
    def peak_terms(self) -> dict[str, int]:
        """The terms of the phase that holds the most (the earlier phase's on a tie)."""
        return max((self.terms, self.save_terms, self.check_terms), key=lambda t: sum(t.values()))

    @property
    def need_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def fits(self) -> bool:
        return self.available.bytes is None or self.need_bytes <= self.available.bytes

    def record(self) -> MemoryPlanRecord:
        return MemoryPlanRecord(
            path=self.path,
            need_bytes=self.need_bytes,
            available_bytes=self.available.bytes,
            available_from=self.available.source,
            terms=self.terms,
            phases=self.phases,
            model_bytes=self.model_bytes,
            largest_shard_bytes=self.largest_shard_bytes,
            largest_layer_bytes=self.largest_layer_bytes,
            activation_bytes=self.activation_bytes,
            output_bytes_estimate=self.output_bytes,
            workers=self.workers,
            reload="full" if self.full_reload else "streamed",
        )


def activation_bytes(ckpt: Checkpoint, recipe: Recipe, work: int) -> int:
    """Calibration activations: llm-compressor's sequential pipeline keeps every sample's input to the current
    decoder layer and its output (2 × samples × seq_len × hidden × dtype bytes), and one sample's attention scores
    in float32 (heads × seq_len² × 4). Zero for a data-free scheme."""
    if not recipe.needs_calibration or recipe.calibration is None:
        return 0
    c = recipe.calibration
    return 2 * c.samples * c.seq_len * ckpt.hidden * work + ckpt.heads * c.seq_len**2 * 4


def work_dtype_bytes(recipe: Recipe, ckpt: Checkpoint) -> int:
    """Bytes per weight in the dtype the model is calibrated in (dtypes.calibration_dtype's rule: the recipe's, else
    its backend's default for the method, else the checkpoint's own; without its CPU probe, which never changes the
    dtype)."""
    if recipe.dtype:
        return DTYPE_BYTES[recipe.dtype]
    default = calibration_default(recipe, ckpt.dtype)
    dtype = ckpt.dtype if default is None or default[0] == "auto" else default[0]
    return DTYPE_BYTES.get(dtype, 4)


def in_memory_terms(ckpt: Checkpoint, recipe: Recipe) -> tuple[dict[str, int], int]:
    work = work_dtype_bytes(recipe, ckpt)
    src = DTYPE_BYTES.get(ckpt.dtype, 4)
    model = ckpt.model_bytes - ckpt.float_bytes + ckpt.float_bytes * work // src
    act = activation_bytes(ckpt, recipe, work)
    return {
        "model in memory": model,
        "second copy (save and reload check)": model,
        "calibration activations": act,
        "libraries": RUNTIME_BYTES,
    }, act


def streamed_terms(ckpt: Checkpoint, recipe: Recipe, workers: int) -> dict[str, int]:
    name, shard = ckpt.largest_shard
    shard_out = output_bytes(ckpt, [t for t in ckpt.tensors.values() if t.file == name], recipe)
    partners = ckpt.largest_layer_bytes if recipe.scheme_or_none in FUSED_PARTNERS and len(ckpt.shard_bytes) > 1 else 0
    return {
        "largest shard": workers * shard,
        "its output": workers * shard_out,
        "float32 working copies of the largest weight": workers
        * WORKING_COPIES.get(recipe.scheme_or_none, DEFAULT_WORKING_COPIES)
        * 4
        * ckpt.largest_quantized_elements,
        "fused partners from other shards": workers * partners,
        "libraries": RUNTIME_BYTES,
    }


# what the full reload check holds besides the model and the output's files: decompression's temporaries and the
# probe's forward pass, as a share of the model's bytes. Fitted to the FP8 dynamic outputs of two bf16 Llamas
# (benchmarks/memory_budget.py's shape at 13 and 4 layers, 2026-12-06), each reloaded alone: VmHWM 3,053 MiB =
# libraries 612 + model 1,368 + the output's files mapped 705 + 368 (27% of the model), and 1,378 MiB = 626 + 406
# + 213 + 133 (33%); 35% (with the libraries at 640 MiB) keeps both estimates above (3,298 and 1,423 MiB)
RELOAD_OVERHEAD = 0.35


def reload_terms(ckpt: Checkpoint, out_bytes: int) -> dict[str, int]:
    """The full reload check (checks.reload_check), its own phase after the conversion on every path: transformers
    loads the output, whose quantized weights are decompressed into the model in the checkpoint's dtype while the
    output's files (`out_bytes`: output_bytes) stay mapped (their pages count in the RSS), and runs the probe; plus
    the libraries."""
    return {
        "reload check: the model decompressed in its dtype": ckpt.model_bytes,
        "reload check: the output's files, mapped while it loads": out_bytes,
        "reload check: decompression and the probe's forward pass": int(ckpt.model_bytes * RELOAD_OVERHEAD),
        "libraries": RUNTIME_BYTES,
    }


def streamed_check_terms(ckpt: Checkpoint) -> dict[str, int]:
    """The streamed checks (checks.streamed_finite_check, structure_check), the output's check where the full
    reload does not fit: one stored tensor at a time, its file's pages mapped while it is read (at most the largest
    tensor: each is read through a file opened for it alone), in row chunks copied to float32; plus the
    libraries."""
    largest = max(ckpt.tensors.values(), key=lambda t: t.nbytes, default=None)
    chunk = 0 if largest is None else min(STREAM_CHUNK_ELEMENTS, largest.nbytes * 8 // DTYPE_BITS[largest.dtype])
    return {
        "streamed checks: the largest tensor's pages": 0 if largest is None else largest.nbytes,
        # read in its dtype (at most float32), copied to float32, and a bool a value for isfinite
        "streamed checks: a row chunk read, in float32, checked": chunk * (4 + 4 + 1),
        "libraries": RUNTIME_BYTES,
    }


def scales_streamable(recipe: Recipe, ckpt: Checkpoint) -> str | None:
    """Why this recipe cannot be streamed onto this checkpoint because a pair of layers vLLM merges would keep two
    global scales (compat.llmcompressor.MERGED_BY_VLLM: model_free_ptq fuses by its own list, which lacks them; the
    in-memory path shares them), or None."""
    s = recipe.scheme_or_none
    if s is None or s.value not in PRESET_GLOBAL_SCALE:
        return None
    for first, second in MERGED_BY_VLLM:
        if any(n.endswith(f".{first}.weight") for n in ckpt.tensors):
            return (
                f"{s.value} gives {first} and {second} a global scale each when streamed, and vLLM merges the two "
                "and takes the larger scale for both (docs/vllm-loading.md Q6); the in-memory and offloaded paths "
                "share one"
            )
    return None


def source_streamable(ckpt: Checkpoint) -> str | None:
    """Why this checkpoint cannot be streamed whatever the recipe, or None when it can."""
    if ckpt.experts is not None:
        key, n = ckpt.experts
        return (
            f"it is a mixture-of-experts model (config.json's {key}: {n} routed experts), and the streamed path does "
            "not convert experts yet: model_free_ptq would write them one tensor per expert, which the streamed "
            "checks (against transformers' fused experts) refuse after the whole conversion"
        )
    return None


def plan(
    recipe: Recipe, model_dir: Path, max_memory: int | None = None, workers: int = 1, out: Path | None = None
) -> MemoryPlan:
    """The path this run takes and what each of its phases holds (the conversion, then the full reload check where
    it fits, else the streamed checks), from headers and config.json only; refuses (UsageError) a run that cannot
    fit in memory, an output larger than the free disk where `out` will be written, or `streaming: on` for a recipe
    or a model that cannot stream."""
    ckpt = read_checkpoint(model_dir)
    avail = available(recipe, max_memory)
    mem_terms, act = in_memory_terms(ckpt, recipe)
    why_not = streamable(recipe) or source_streamable(ckpt) or scales_streamable(recipe, ckpt)
    refuse_switches(recipe, ckpt)
    out_bytes = output_bytes(ckpt, list(ckpt.tensors.values()), recipe)
    reload = reload_terms(ckpt, out_bytes)
    full_reload = avail.bytes is None or sum(reload.values()) <= avail.bytes
    common = dict(
        available=avail,
        model_bytes=ckpt.model_bytes,
        largest_shard_bytes=ckpt.largest_shard[1],
        largest_layer_bytes=ckpt.largest_layer_bytes,
        activation_bytes=act,
        output_bytes=out_bytes,
        workers=workers,
        full_reload=full_reload,
        check_terms=reload if full_reload else streamed_check_terms(ckpt),
    )
    in_memory = MemoryPlan("in-memory", terms=mem_terms, **common)
    chosen = in_memory
    if why_not is None and (
        recipe.streaming is Streaming.on or (recipe.streaming is Streaming.auto and not in_memory.fits)
    ):
        terms = streamed_terms(ckpt, recipe, workers)
        chosen = MemoryPlan("streamed", terms=terms, alternatives={"in-memory": in_memory.need_bytes}, **common)
    elif offloadable(recipe) is None and (
        recipe.offload is Offload.on or (recipe.offload is Offload.auto and not in_memory.fits)
    ):
        terms = offloaded_terms(ckpt, recipe)
        save = offloaded_save_terms(ckpt, out_bytes)
        chosen = MemoryPlan(
            "offloaded", terms=terms, save_terms=save, alternatives={"in-memory": in_memory.need_bytes}, **common
        )
    if not chosen.fits:
        raise UsageError(refusal(recipe, chosen, why_not))
    if not full_reload and ckpt.experts is not None:
        raise UsageError(unchecked_experts(chosen, sum(reload.values()), ckpt.experts))
    if out is not None:
        check_disk(out, chosen.output_bytes)
    return chosen


def unchecked_experts(p: MemoryPlan, reload_need: int, experts: tuple[str, int]) -> str:
    """The refusal of an MoE whose output could only get the streamed checks, which compare it with transformers'
    fused experts (the meta-device model) and refuse the per-expert layout every MoE conversion writes."""
    return (
        f"this mixture-of-experts model (config.json's {experts[0]}: {experts[1]} routed experts) fits the "
        f"{p.path} path, but the full reload check of its output would need about {gib(reload_need)} and "
        f"{gib(p.available.bytes)} is available ({p.available.source}); the streamed checks that take its place "
        "for a dense model do not check experts yet, so the run would end in exit 3 after the whole conversion. "
        f"Nothing was loaded. Give it {gib(reload_need)} (--max-memory or the recipe's max_memory, if "
        f"{p.available.source} understates what it may use), or a machine with more memory"
    )


def refuse_switches(recipe: Recipe, ckpt: Checkpoint) -> None:
    """`streaming: on` for a recipe or a model that cannot stream (the model: source_streamable, or
    scales_streamable for this recipe), and `offload: on` for a recipe that cannot offload: refused naming the
    field, why, and what to set instead."""
    if recipe.streaming is Streaming.on and (why := streamable(recipe)):
        raise UsageError(f"streaming: on, but this recipe cannot stream: {why}; set `streaming: auto` or `off`")
    if recipe.streaming is Streaming.on and (why := source_streamable(ckpt) or scales_streamable(recipe, ckpt)):
        offload = " (or, for a calibrated recipe short of memory, its weights offloaded to disk: `offload: on`)"
        raise UsageError(
            f"streaming: on, but this model cannot stream: {why}. Set `streaming: off` (or `auto`) to convert it on "
            f"the in-memory path{offload if offloadable(recipe) is None else ''}; nothing was loaded"
        )
    if recipe.offload is Offload.on and (why := offloadable(recipe)):
        raise UsageError(
            f"offload: on, but this recipe cannot offload its weights: {why}; set `offload: auto` or `off`"
        )


def check_disk(out: Path, need: int) -> None:
    """The output's estimated bytes against the free space of the file system it will be written to."""
    import shutil

    where = next((p for p in [out, *out.parents] if p.exists()), None)
    if where is None:
        return
    free = shutil.disk_usage(where).free
    if need > free:
        raise UsageError(
            f"output {out}: the converted checkpoint is estimated at {gib(need)} and {where} has {gib(free)} free; "
            "free some space or choose another `output:` (or --output). Nothing was loaded"
        )


def gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GiB:.2f} GiB"


def terms_text(p: MemoryPlan) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in p.peak_terms.items() if v)


def refusal(recipe: Recipe, p: MemoryPlan, why_not: str | None) -> str:
    largest = max(p.peak_terms.items(), key=lambda kv: kv[1])[0]
    fixes = []
    if p.path == "in-memory" and why_not is None:
        fixes.append("stream it shard by shard (`streaming: on`; `auto` does when the streamed path fits)")
    elif p.path == "in-memory":
        fixes.append(f"streaming is not possible ({why_not})")
        if offloadable(recipe) is None:
            fixes.append("offload its weights to disk (`offload: on`; `auto` does when the offloaded path fits)")
    if p.path == "streamed":
        fixes.append("re-shard the checkpoint into smaller files (transformers' save_pretrained max_shard_size)")
    if p.activation_bytes and largest == "calibration activations":
        fixes.append("fewer calibration samples or a shorter seq_len")
    if p.path == "offloaded" and largest in p.save_terms:
        fixes.append(
            "a scheme with a smaller output: the offloaded path calibrates one decoder layer at a time, but its save "
            "(transformers' save_pretrained) gathers the whole compressed output before writing it"
        )
    elif p.path == "offloaded":
        fixes.append("nothing smaller: the offloaded path already holds one decoder layer of the model at a time")
    fixes.append(f"--max-memory (or the recipe's max_memory) if {p.available.source} understates what this run may use")
    fixes.append("a machine with more memory")
    return (
        f"this run would need about {gib(p.need_bytes)} of memory on the {p.path} path ({terms_text(p)}), and "
        f"{gib(p.available.bytes)} is available ({p.available.source}); the largest term is {largest}. "
        f"The model is {gib(p.model_bytes)} of tensors (largest shard {gib(p.largest_shard_bytes)}, largest decoder "
        f"layer {gib(p.largest_layer_bytes)}). Nothing was loaded. To fit: {'; '.join(fixes)}"
    )
