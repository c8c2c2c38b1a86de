"""llm-compressor's internals this project relies on (checked on 0.14.0.1).

- `llmcompressor.entrypoints.model_free` imports safetensors' `save_file` into its own namespace and writes every
  output shard through that name; `model_free_ptq_pt` replaces it for one call with `save_file(...,
  metadata={"format": "pt"})`, the header save_pretrained writes, so a streamed shard is byte-identical to the
  in-memory path's (tests/convert/test_streaming.py).
- The same module validates each shard on the meta device inside compressed-tensors' `TensorProfiler()` (imported
  into its namespace), whose default `catch_exception=True` prints the exception's traceback to stderr and swallows
  it, after which `_validate_shard` stops on an UnboundLocalError: a traceback of the library's on the user's
  terminal and a message that names nothing. `model_free_ptq_pt` makes it `TensorProfiler(catch_exception=False)`
  for the call, so the exception itself reaches the backend, which says it in one paragraph.
- `llmcompressor.modeling.moe.linear_experts` and `.llama4` import compressed-tensors' `offload_module` into their
  own namespaces and call it at the end of `from_experts_module`; `linearized_on_meta` replaces it for one call
  with a no-op, so `linearize_moe` (llm-compressor's own conversion of fused 3-D experts into per-expert
  Linear layers) runs on a meta-device model, whose offload device (meta) compressed-tensors cannot offload to.
  The layer plan then names the per-expert layers `oneshot` will quantize (tests/convert/test_moe.py), and the
  per-expert loader reads a compressed-tensors MoE checkpoint into them (checkpoint/decompressed.py).
- `llmcompressor.pipelines.cache.IntermediatesCache.pin_memory(self, batch_index, input_names=None)` pins a batch's
  cached activations in host memory for faster copies to an accelerator (AWQ's grid search calls it); on a torch
  without an accelerator `Tensor.pin_memory()` raises, and there is no device to copy to. `unpinned()` makes the
  method a no-op on the class for the length of a block and puts it back after; where the guard does not hold
  (another version, the method gone or re-signed) it warns and leaves the library's own method in place.
- `llmcompressor.modifiers.gptq.base.GPTQModifier` accumulates a Hessian for every targeted Linear its forward hook
  sees (`_num_samples`, keyed by module) and compresses all of them at the end of each sequential subgraph
  (`compress_modules`), but observes the weights (`observe(modules, base_name="weight")`) only of the modules the
  traced subgraph names. A Linear called inside code its tracer leaves untraced is calibrated and never observed,
  and GPTQ stops with "No statistics available. Call observer(value) first." (Gemma 4's model-level
  `per_layer_model_projection`, run inside the text model's per-layer-input function: measured on 0.14.0.1).
  `weights_observed()` makes `compress_modules` observe, first, the weight of every module it is about to compress
  whose observer has seen nothing (the weight is the module's own: observing it later gives the same statistics),
  for the length of a block; where the guard does not hold it warns and leaves the library's method in place.

- llm-compressor's sequential pipeline (every calibrated scheme: `oneshot` infers it) traces the model with
  torch.fx after rewriting its `forward` (`pipelines.sequential.ast_helpers.autowrap_forward`): the new code is
  exec'd in a copy of the module's namespace holding `self` (the model), and `torch.fx.wrap` calls in it register
  that namespace, and the traced graph code's, in torch.fx's module-level wrap table (compat/torch.py:
  `wrap_table`), which nothing ever empties. The model stays reachable from torch.fx after the run drops it:
  measured on the default model (FP8 dynamic + FP8 KV, 64 x 256 calibration tokens), 155 MiB of the quantized
  model's tensors and the source file's 256 MiB of mapped pages stayed resident into the reload check, which
  peaked at 1.45-1.59 GiB against a plan of 1.16 GiB.
  `fx_wraps_dropped()` removes, when the block ends, the table's entries the block added (torch's own, registered
  at import, stay), so the model's memory goes when the caller drops it. Where the table is not the dict read
  (compat/torch.py's guard), it warns and leaves the table as it is.

- `QuantizationModifier` (FP8 static, NVFP4, W8A8, every calibrated scheme but GPTQ's and AWQ's own) turns what its
  observers saw into scales in `on_sequential_epoch_end(state, event, modules)`, called by the sequential pipeline
  with the modules each traced subgraph calls; a Linear called inside code the tracer leaves untraced (Gemma 4's
  `per_layer_model_projection`, as for GPTQ above) is never among them, and its scales keep their initial values:
  measured on 0.14.0.1, FP8 static wrote that layer a weight scale of 3.7e-40 and an input scale of 1.3e-21 (a
  finite, silently wrong layer: its weights saturated at +-448 times nothing), NVFP4 global scales of 2.4e-38 (NaN
  logits at our reload check). `every_module_calibrated()` records the modules each call handled and, before
  `on_calibration_end` removes the observers, calls the library's own `on_sequential_epoch_end` once more for every
  quantized module no call handled (its activations were observed by the hooks while the subgraph ran; its weight
  is its own), for the length of a block; where the guard does not hold it warns and leaves the library's methods.
- llm-compressor shares one NVFP4 global scale across the layers vLLM merges (`observers.helpers.FUSED_LAYER_NAMES`,
  read by `fuse_weight_observers` when quantization starts): q/k/v, gate/up, MLA's q_a/kv_a, w1/w3. vLLM 0.34 also
  merges Qwen3.5's split Gated DeltaNet projections (in_proj_qkv with in_proj_z, in_proj_b with in_proj_a: its
  packed_modules_mapping, docs/vllm-loading.md Q6) and takes the maximum of the shards' global scales for the
  merged layer, so unshared scales shrink the smaller shard's weights (0.95 and 0.87 on a tiny Qwen3.5).
  `global_scales_shared()` adds MERGED_BY_VLLM to the list for the length of a block; where the list is not what
  was read, it warns and leaves it. (The streamed path, llm-compressor's model_free_ptq, fuses by a list of its
  own: memory.plan does not stream NVFP4 onto such a model.)

- `llmcompressor.modeling.moe.llama4.Llama4LinearExperts.from_experts_module(experts, config)` reads
  `config.text_config`: it is written for the multimodal Llama 4 (`Llama4Config`), and `linearize_moe` passes it
  the model's config, which for a text-only checkpoint (`llama4_text`, `Llama4TextConfig`) is that text config
  itself, so the conversion stopped with AttributeError and no recipe could run on Llama 4 text.
  `text_only_llama4()` hands the method a config with `text_config` set to the text config for the length of a
  block (a multimodal config passes through unchanged); the per-expert layers compute what the fused experts
  compute (tests/compat/test_compat.py). No repack is needed: transformers reads a compressed-tensors Llama 4 per
  expert (compat/transformers.quantized_per_expert). `linearize(model)` and `linearized_on_meta(model)` run the
  library's conversion inside it. Where the guard does not hold (the method no longer reads `text_config`: fixed
  upstream), it leaves the method as it is.

- llm-compressor's compressed save (`transformers.compression.compressed_tensors_utils.modify_save_pretrained`,
  which `save_pretrained(save_compressed=True)` runs) copies the source's multi-token-prediction tensors, which
  transformers' model does not load, where the model's text config declares MTP layers (`num_mtp_layers` or
  `mtp_num_hidden_layers`, read with getattr): compressed-tensors' `save_mtp_tensors_to_checkpoint(source,
  folder)` copies every stored tensor whose name starts with `mtp` into a shard of its own and adds `re:^mtp.*` to
  the quantization_config's ignore. Nothing else is copied: a DeepSeek-V3's `model.layers.61` (its declared MTP
  layer) or an undeclared `mtp.*` module is not in the saved checkpoint. `mtp_copied(config)` says whether the save
  copies for this config, so that the streamed path (model_free_ptq copies every stored tensor) writes what the
  in-memory path's save writes (backends/llmcompressor.stream); `problems()` checks the condition in the save's
  source (MTP_DECLARED) and the function's default prefix.

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on any).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from typing import Any

from quantize.compat import outside
from quantize.compat.torch import wrap_table, wrap_table_problems

CHECKED = ((0, 14), (0, 15))  # [from, to): the versions the assumption above was read on
PT = {"format": "pt"}  # the __metadata__ transformers' save_pretrained writes in each safetensors header
PIN_MEMORY = ("self", "batch_index", "input_names")  # IntermediatesCache.pin_memory's parameters, as read
# the layers vLLM 0.34 merges whose NVFP4 global scales llm-compressor 0.14 does not share (module docstring)
MERGED_BY_VLLM = (("in_proj_qkv", "in_proj_z"), ("in_proj_b", "in_proj_a"))


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, the module without its own `save_file`, or
    model_free_ptq without the parameters called here, the MoE conversion or the activation cache changed."""
    import llmcompressor.entrypoints.model_free as model_free

    found = _pin_problems() + _gptq_problems() + _fx_wrap_problems() + _fusion_problems() + _epoch_problems()
    if not callable(getattr(model_free, "save_file", None)):
        found.append("llmcompressor.entrypoints.model_free no longer writes its shards through its own save_file")
    params = inspect.signature(model_free.model_free_ptq).parameters
    found += [f"model_free_ptq takes no `{p}`" for p in ("config", "max_workers", "converter") if p not in params]
    profiler = getattr(model_free, "TensorProfiler", None)
    if profiler is None or "catch_exception" not in inspect.signature(profiler).parameters:
        found.append("llmcompressor.entrypoints.model_free no longer profiles through TensorProfiler(catch_exception)")
    for module in _OFFLOADING:
        if not callable(getattr(import_module(module), "offload_module", None)):
            found.append(f"{module} no longer calls offload_module from its own namespace")
    from llmcompressor.modeling.moe import linearize

    found += [f"llmcompressor.modeling.moe.linearize has no {f}" for f in _LINEARIZE if not hasattr(linearize, f)]
    from llmcompressor.entrypoints.oneshot import Oneshot

    # the layer plan and the AWQ/SmoothQuant mapping check (convert/backends/llmcompressor/mappings.py) see the
    # layout oneshot calibrates only if oneshot still linearizes fused experts before its modifiers resolve their
    # mappings
    if "linearize_moe(self.model)" not in inspect.getsource(Oneshot.apply_recipe_modifiers):
        found.append("oneshot no longer linearizes fused experts before its modifiers resolve their mappings")
    return found + _mtp_problems()


# the text-config fields whose value makes llm-compressor's save copy the source's `mtp*` tensors (module docstring)
MTP_DECLARED = ("num_mtp_layers", "mtp_num_hidden_layers")
MTP_PREFIX = "mtp"  # save_mtp_tensors_to_checkpoint's default `mtp_prefix`, as the save calls it


def mtp_copied(config: Any) -> bool:
    """Whether llm-compressor's compressed save of a model with this (transformers) config copies the source's
    tensors under MTP_PREFIX into the checkpoint (the module docstring)."""
    text = config.get_text_config()
    return any(getattr(text, f, 0) for f in MTP_DECLARED)


def _mtp_problems() -> list[str]:
    """What no longer holds of `mtp_copied`: the save's condition or its call, or the copy's default prefix."""
    from compressed_tensors.utils import save_mtp_tensors_to_checkpoint
    from llmcompressor.transformers.compression import compressed_tensors_utils

    source = inspect.getsource(compressed_tensors_utils.modify_save_pretrained)
    found = [f"llm-compressor's save no longer reads `{f}` to copy MTP tensors" for f in MTP_DECLARED]
    found = [w for w, f in zip(found, MTP_DECLARED, strict=True) if f not in source]
    if "save_mtp_tensors_to_checkpoint(model.name_or_path, save_dir)" not in source:
        found.append("llm-compressor's save no longer copies MTP tensors with save_mtp_tensors_to_checkpoint")
    prefix = inspect.signature(save_mtp_tensors_to_checkpoint).parameters.get("mtp_prefix")
    if prefix is None or prefix.default != MTP_PREFIX:
        found.append(f"save_mtp_tensors_to_checkpoint's mtp_prefix is no longer {MTP_PREFIX!r} by default")
    return found


def _pin_problems() -> list[str]:
    """What no longer holds of `unpinned`'s assumptions: the version, the class or its method and parameters."""
    from llmcompressor.pipelines import cache

    found = _version_problems()
    pin = getattr(getattr(cache, "IntermediatesCache", None), "pin_memory", None)
    if pin is None:
        found.append("llmcompressor.pipelines.cache.IntermediatesCache.pin_memory is gone")
    elif (params := tuple(inspect.signature(pin).parameters)) != PIN_MEMORY:
        found.append(f"IntermediatesCache.pin_memory takes {params}, checked on {PIN_MEMORY}")
    return found


@contextlib.contextmanager
def unpinned() -> Iterator[None]:
    """llm-compressor's `IntermediatesCache.pin_memory` a no-op while the block runs (nothing is pinned: for a torch
    without an accelerator, whose `Tensor.pin_memory()` raises), the library's own method put back after, however
    the block ends. Where `_pin_problems` finds anything, a warning says so and the library's method stays."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    if _warned(
        _pin_problems(),
        "llm-compressor's IntermediatesCache.pin_memory is left as it is (it fails on a torch without an accelerator)",
    ):
        yield
        return
    own = IntermediatesCache.pin_memory
    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = own


def _gptq_problems() -> list[str]:
    """What no longer holds of `weights_observed`'s assumptions: GPTQModifier's compress_modules, its Hessian
    bookkeeping, or llm-compressor's `observe`."""
    from llmcompressor.modifiers.gptq.base import GPTQModifier
    from llmcompressor.modifiers.quantization import calibration

    found = []
    compress = getattr(GPTQModifier, "compress_modules", None)
    if compress is None or tuple(inspect.signature(compress).parameters) != ("self",):
        found.append("GPTQModifier.compress_modules is gone or takes more than self")
    elif "self._num_samples" not in inspect.getsource(compress):
        found.append("GPTQModifier.compress_modules no longer compresses the modules of its _num_samples")
    observe = getattr(calibration, "observe", None)
    if observe is None or tuple(inspect.signature(observe).parameters) != ("module", "base_name"):
        found.append("llmcompressor.modifiers.quantization.calibration.observe is gone or re-signed")
    return found


@contextlib.contextmanager
def weights_observed() -> Iterator[None]:
    """GPTQ's `compress_modules` observing first the weight of every module it compresses whose weight observer
    has no statistics (module docstring), while the block runs; the library's own method put back after. Where
    `_gptq_problems` finds anything, a warning says so and the library's method stays."""
    from llmcompressor.modifiers.gptq.base import GPTQModifier
    from llmcompressor.modifiers.quantization.calibration import observe

    if _warned(
        _version_problems() + _gptq_problems(),
        "llm-compressor's GPTQModifier.compress_modules is left as it is (a Linear its tracer does "
        "not reach may stop GPTQ with 'No statistics available')",
    ):
        yield
        return
    own = GPTQModifier.compress_modules

    def compress_modules(self: Any) -> None:
        calibrated = list(self._num_samples)  # the modules GPTQ is about to compress
        observe([m for m in calibrated if _blind(m)], base_name="weight")
        own(self)

    GPTQModifier.compress_modules = compress_modules
    try:
        yield
    finally:
        GPTQModifier.compress_modules = own


def _fx_wrap_problems() -> list[str]:
    """What no longer holds of `fx_wraps_dropped`'s assumptions: torch's wrap table (compat/torch.py), or
    llm-compressor registering its rewritten forwards' namespaces through `torch.fx.wrap`."""
    from llmcompressor.pipelines.sequential import ast_helpers

    found = wrap_table_problems()
    source = inspect.getsource(ast_helpers.autowrap_forward)
    if '"self": module' not in source or "torch.fx.wrap" not in source:
        found.append("llm-compressor's autowrap_forward no longer execs the forward in a namespace holding the model")
    return found


@contextlib.contextmanager
def fx_wraps_dropped() -> Iterator[None]:
    """The entries the block adds to torch.fx's wrap table (llm-compressor's rewritten forwards' namespaces, which
    hold the model: module docstring) removed when it ends, however it ends; the entries that were there before
    stay. Where `_fx_wrap_problems` finds anything, a warning says so and the table is left as it is."""
    if _warned(
        _fx_wrap_problems(),
        "torch.fx's wrap table is left as it is (llm-compressor's traced forwards keep the model "
        "in memory after the run drops it)",
    ):
        yield
        return
    table = wrap_table()
    before = set(table)
    try:
        yield
    finally:
        for key in [k for k in table if k not in before]:
            del table[key]


EPOCH_END = ("self", "state", "event", "modules", "kwargs")  # on_sequential_epoch_end's parameters, as read


def _epoch_problems() -> list[str]:
    """What no longer holds of `every_module_calibrated`'s assumptions: QuantizationModifier's two callbacks."""
    from llmcompressor.modifiers.quantization import QuantizationModifier

    found = []
    epoch = getattr(QuantizationModifier, "on_sequential_epoch_end", None)
    if epoch is None or tuple(inspect.signature(epoch).parameters) != EPOCH_END:
        found.append(f"QuantizationModifier.on_sequential_epoch_end is gone or no longer takes {EPOCH_END}")
    elif "update_qparams(modules" not in inspect.getsource(epoch):
        found.append("QuantizationModifier.on_sequential_epoch_end no longer updates the qparams of its modules")
    if not callable(getattr(QuantizationModifier, "on_calibration_end", None)):
        found.append("QuantizationModifier.on_calibration_end is gone")
    return found


@contextlib.contextmanager
def every_module_calibrated() -> Iterator[None]:
    """QuantizationModifier's scales computed for every quantized module before its observers go (module
    docstring), while the block runs; the library's own methods put back after. Where `_epoch_problems` finds
    anything, a warning says so and the library's methods stay."""
    from compressed_tensors.quantization.utils import is_module_quantized
    from llmcompressor.modifiers.quantization import QuantizationModifier

    if _warned(
        _version_problems() + _epoch_problems(),
        "llm-compressor's QuantizationModifier callbacks are left as they are (a Linear its tracer "
        "does not reach keeps uncalibrated scales)",
    ):
        yield
        return
    own_epoch, own_end = QuantizationModifier.on_sequential_epoch_end, QuantizationModifier.on_calibration_end
    handled: set[int] = set()

    def on_sequential_epoch_end(self: Any, state: Any, event: Any, modules: list[Any], **kwargs: Any) -> None:
        handled.update(id(m) for m in modules)
        own_epoch(self, state, event, modules, **kwargs)

    def on_calibration_end(self: Any, state: Any, event: Any, **kwargs: Any) -> None:
        left = [m for m in state.model.modules() if is_module_quantized(m) and id(m) not in handled]
        if handled and left:  # a sequential run that missed some: the library's own update, for those
            on_sequential_epoch_end(self, state, event, left)
        own_end(self, state, event, **kwargs)

    QuantizationModifier.on_sequential_epoch_end = on_sequential_epoch_end
    QuantizationModifier.on_calibration_end = on_calibration_end
    try:
        yield
    finally:
        QuantizationModifier.on_sequential_epoch_end = own_epoch
        QuantizationModifier.on_calibration_end = own_end


def _fusion_problems() -> list[str]:
    """What no longer holds of `global_scales_shared`'s assumptions: FUSED_LAYER_NAMES a list of name tuples that
    fuse_weight_observers reads from its module."""
    from llmcompressor.observers import helpers

    names = getattr(helpers, "FUSED_LAYER_NAMES", None)
    if not isinstance(names, list) or not all(isinstance(g, tuple) for g in names):
        return ["llmcompressor.observers.helpers.FUSED_LAYER_NAMES is no longer a list of layer-name tuples"]
    if "in FUSED_LAYER_NAMES" not in inspect.getsource(helpers.fuse_weight_observers):
        return ["llm-compressor's fuse_weight_observers no longer reads FUSED_LAYER_NAMES"]
    return []


@contextlib.contextmanager
def global_scales_shared() -> Iterator[None]:
    """llm-compressor's FUSED_LAYER_NAMES extended with MERGED_BY_VLLM while the block runs (module docstring), the
    groups it already lists left as they are; put back after, however the block ends. Where `_fusion_problems`
    finds anything, a warning says so and the list stays."""
    from llmcompressor.observers import helpers

    if _warned(
        _version_problems() + _fusion_problems(),
        "llm-compressor's FUSED_LAYER_NAMES is left as it is (Qwen3.5's in_proj pairs keep separate "
        "NVFP4 global scales, which vLLM merges by their maximum)",
    ):
        yield
        return
    names = helpers.FUSED_LAYER_NAMES
    added = [g for g in MERGED_BY_VLLM if g not in names]
    names.extend(added)
    try:
        yield
    finally:
        for g in added:
            names.remove(g)


def _version_problems() -> list[str]:
    """The installed llm-compressor outside CHECKED, as a problem (none inside)."""
    return [w for w in [outside("llmcompressor", version("llmcompressor"), CHECKED)] if w]


def _warned(found: list[str], kept: str) -> bool:
    """Whether a guard found anything; if so a warning names what is `kept` as the library has it and why (the
    warning points at the `with` statement of the context manager that calls this)."""
    if found:
        warnings.warn(f"quantize: {kept}, since " + "; ".join(found), stacklevel=4)
    return bool(found)


def _blind(module: Any) -> bool:
    """Whether a module has a weight observer that has seen nothing yet."""
    observer = getattr(module, "weight_observer", None)
    return observer is not None and not observer.has_statistics


# where linearize_moe's `from_experts_module` calls offload_module (the generic one, and Llama 4's own)
_OFFLOADING = ("llmcompressor.modeling.moe.linear_experts", "llmcompressor.modeling.moe.llama4")
_LINEARIZE = ("linearize_moe", "get_non_linearized_moes", "get_linearized_moes")


def _llama4_reads_text_config() -> bool:
    """Whether llm-compressor's Llama 4 expert conversion reads `config.text_config` (the module docstring)."""
    from llmcompressor.modeling.moe.llama4 import Llama4LinearExperts

    method = getattr(Llama4LinearExperts, "from_experts_module", None)
    return method is not None and "config.text_config" in inspect.getsource(method)


@contextlib.contextmanager
def text_only_llama4() -> Iterator[None]:
    """llm-compressor's Llama 4 expert conversion given, for a text-only config (one without `text_config`), a
    config whose `text_config` is that config, while the block runs (the module docstring); the library's own
    method put back after."""
    from types import SimpleNamespace
    from unittest import mock

    from llmcompressor.modeling.moe.llama4 import Llama4LinearExperts

    if not _llama4_reads_text_config():
        yield
        return
    convert = Llama4LinearExperts.from_experts_module.__func__

    def from_experts_module(cls: Any, experts: Any, config: Any) -> Any:
        return convert(cls, experts, config if hasattr(config, "text_config") else SimpleNamespace(text_config=config))

    with mock.patch.object(Llama4LinearExperts, "from_experts_module", classmethod(from_experts_module)):
        yield


def linearize(model: Any) -> None:
    """llm-compressor's `linearize_moe(model)`, as `oneshot` runs it, a text-only Llama 4 included
    (`text_only_llama4`)."""
    from llmcompressor.modeling.moe.linearize import linearize_moe

    with text_only_llama4():
        linearize_moe(model)


def linearized_on_meta(model: Any) -> list[str]:
    """llm-compressor's `linearize_moe` on a meta-device model (its offload step made a no-op for the call):
    each fused-experts module it recognizes becomes per-expert Linear layers, as `oneshot` does to the loaded
    model (`linearize`). Returns the names of the expert modules it replaced."""
    from contextlib import ExitStack
    from unittest import mock

    import torch
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes

    found = get_non_linearized_moes(model)
    if found:
        with ExitStack() as stack, torch.device("meta"):
            for module in _OFFLOADING:
                stack.enter_context(mock.patch.object(import_module(module), "offload_module", lambda *a, **k: None))
            try:
                linearize(model)
            except (AttributeError, TypeError, ValueError, KeyError) as e:
                raise NotLinearizable(type(found[0][1]).__name__, f"{type(e).__name__}: {e}") from None
    return [n for n, _ in found]


class NotLinearizable(Exception):
    """llm-compressor recognizes a fused-experts module but its conversion to per-expert layers fails on it."""

    def __init__(self, experts_class: str, why: str):
        super().__init__(f"{experts_class}: {why}")
        self.experts_class, self.why = experts_class, why


def model_free_ptq_pt(model_dir: Path, folder: Path, config: Any, converter: Any = None) -> None:
    """llm-compressor's `model_free_ptq(model_dir, folder, config=config, max_workers=1, converter=converter)` (a
    compressed-tensors Converter run on each shard's tensors before the quantization: its public parameter), every
    shard written with save_pretrained's header metadata ({"format": "pt"}), and a shard's failed validation raised
    as its own exception (not printed as a traceback and swallowed)."""
    from functools import partial
    from unittest import mock

    import llmcompressor.entrypoints.model_free as model_free
    from safetensors.torch import save_file

    raising = partial(model_free.TensorProfiler, catch_exception=False)
    with (
        mock.patch.object(model_free, "save_file", partial(save_file, metadata=PT)),
        mock.patch.object(model_free, "TensorProfiler", raising),
    ):
        model_free.model_free_ptq(str(model_dir), str(folder), config=config, max_workers=1, converter=converter)
