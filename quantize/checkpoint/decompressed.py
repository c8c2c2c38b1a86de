"""A compressed-tensors checkpoint of a model with routed experts, read per expert.

transformers 5 builds an MoE's experts as fused 3-D tensors, and reads a compressed-tensors checkpoint's
per-expert tensors into them only for a few formats (integrations.compressed_tensors.DecompressExperts, 5.17: FP8
with per-channel or per-tensor scales, MXFP4 and symmetric packed integer weights; not NVFP4's global scale nor a
zero point: transformers_reading), with one scheme for all experts and
without the experts' activation quantization (its fused experts are no Linear a scheme can sit on). This loader
reads any format on any family llm-compressor linearizes, as transformers reads a dense compressed-tensors
model, step by step:

1. the model transformers builds from config.json, its weights on the meta device (buffers computed for real);
2. its fused experts turned into per-expert Linear layers by llm-compressor's own `linearize_moe` (the layout
   llm-compressor quantized and saved), on the meta device (compat.llmcompressor.linearized_on_meta);
3. the checkpoint's quantization_config applied to it (compressed-tensors' `apply_quantization_config`, the
   targets and ignore list read over the model's names: expert_names.ModelNames), and its modules compressed
   on the meta device (`ModelCompressor.compress_model`), so each quantized module holds the parameters the
   checkpoint stores (`weight_packed`, `weight_scale`, `weight_global_scale`, `input_scale`, ...);
4. every stored tensor put in its place, streamed one at a time from the safetensors files: a stored tensor
   with no place, or a place no tensor fills (tied weights aside), is reported as missing or unexpected, and
   never left random (the caller refuses it: loader.check_loading_info); tensors transformers merges into one of
   the model's on load besides the experts (Kimi-Linear's q/k/v_conv1d into conv1d: expert_names.ModelNames.merged)
   are concatenated in order on their first dimension, as that conversion does (transformers 5.17's
   Concatenate(dim=0)), and the result must fit its place;
5. the weights decompressed to dense (`ModelCompressor.decompress_model`), the activation and KV-cache
   quantization the config declares left applied, as transformers leaves it on a dense model.

The model keeps its per-expert layers (llm-compressor's linearized modules), which compute what the fused ones
compute.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from quantize.checkpoint.expert_names import ModelNames, per_expert_loader
from quantize.checkpoint.files import hf_path, read_config, safetensors_files
from quantize.compat.compressed_tensors_targets import first_target
from quantize.compat.llmcompressor import NotLinearizable, linearized_on_meta
from quantize.compat.transformers import expert_reading
from quantize.errors import UsageError


def load_decompressed(path: Path, trust_remote_code: bool = False, dtype: Any = "auto") -> tuple[Any, dict[str, Any]]:
    """The model at `path` (a checkpoint files.reads_per_expert accepts) with dense weights, and what its load found, as
    from_pretrained's loading info: {"missing_keys", "unexpected_keys", "mismatched_keys"} (by the checkpoint's
    names where a tensor was stored, by the model's where none was). dtype: a torch dtype or "auto"
    (config.json's), the dtype the model is built in: a stored 16- or 32-bit float (a plain weight, a scale) takes
    the dtype of its place, a quantized payload (FP8, integers) keeps its own."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from transformers import CompressedTensorsConfig

    model = _meta_model(path, trust_remote_code, dtype)
    names = ModelNames(str(model.config.model_type))
    ct = CompressedTensorsConfig.from_dict(dict(read_config(path)["quantization_config"]))
    compressor = ModelCompressor.from_compression_config(ct)
    qconfig = compressor.quantization_config
    if qconfig is not None:
        for group in qconfig.config_groups.values():
            group.targets = [names.target(t) for t in group.targets]
        qconfig.ignore = [names.target(t) for t in qconfig.ignore or []]
        with torch.device("meta"):
            apply_quantization_config(model, qconfig, run_compressed=False, show_progress=False)
            if ct.is_quantization_compressed:
                compressor.compress_model(model)
    info = _load_stored(model, path, names)
    if qconfig is not None and ct.is_quantization_compressed and not info["missing_keys"]:
        compressor.decompress_model(model)
    model.config.quantization_config = ct
    return model, info


def transformers_reading(path: Path) -> str | None:
    """Whether transformers' own loader reads this per-expert checkpoint's experts as stored (a checkpoint files.
    reads_per_expert accepts): None where the first routed expert's weight it dequantizes is the one
    compressed-tensors' decompression gives (the layer's experts share one scheme: architecture.expert_problems), else
    why not (compat.transformers.expert_reading: on 5.17 NVFP4's global scale and an asymmetric scheme's zero point
    are not read; a family it reads only fused, Granite 4: expert_names.per_expert_loader, not at all). Reads that
    expert's tensors alone."""
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors import safe_open

    cfg = read_config(path)
    if not per_expert_loader(str(cfg["model_type"])):
        return (
            "it has no per-expert loader for this family, whose routed experts it reads only as fused 3-D tensors: "
            "from_pretrained would leave them missing, initialised at random"
        )
    names = ModelNames(str(cfg["model_type"]))
    config = QuantizationConfig.model_validate(cfg["quantization_config"])
    groups = {names.target(t): g for g in config.config_groups.values() for t in g.targets}
    for f in safetensors_files(path):
        with safe_open(str(f), "pt") as st:
            keys = list(st.keys())
            first = next((m.group(0) for n in keys if (m := re.match(r".*\.experts\.\d+\.\w+(?=\.)", n))), None)
            if first is None:
                continue
            target = first_target(names.tensor(f"{first}.weight").removesuffix(".weight"), groups)
            if target is None:
                return None  # its experts are not quantized: stored as transformers reads any weight
            stored = {n: st.get_tensor(n) for n in keys if n.startswith(f"{first}.")}
            return expert_reading(str(cfg["model_type"]), dict(cfg["quantization_config"]), stored, groups[target])
    return None


def _meta_model(path: Path, trust_remote_code: bool, dtype: Any) -> Any:
    """The model config.json describes, its parameters on the meta device and its buffers computed, its fused
    experts turned into llm-compressor's per-expert Linear layers."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(hf_path(path), trust_remote_code=trust_remote_code)
        if dtype in (None, "auto"):
            dtype = getattr(config, "dtype", None) or torch.float32
        quantization = config.quantization_config
        del config.quantization_config  # built plain: the scheme is applied below, on the per-expert layers
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
        config.quantization_config = quantization
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{path}/config.json does not describe a causal LM that transformers knows: {e}") from None
    try:
        linearized_on_meta(model)
    except NotLinearizable as e:
        raise UsageError(
            f"{path}: {model.config.model_type}'s fused experts ({e.experts_class}) cannot be turned into "
            f"per-expert layers by llm-compressor ({e.why[:200]}), so its per-expert compressed tensors have no "
            "place to be read into. Score it with an engine that reads this family's quantized experts (vLLM)"
        ) from None
    return model


def _load_stored(model: Any, path: Path, names: ModelNames) -> dict[str, Any]:
    """Every stored tensor into its place in `model` (streamed, one tensor in memory at a time besides what is
    already placed and the parts of a merged tensor), in the dtype the model holds there where both are floating
    point and the model's is not a quantized payload, else as stored (a payload stored in another dtype than its
    place's, or where the model holds plain floats, is reported as mismatched, as a shape that differs); tensors
    transformers merges on load (ModelNames.merged: Kimi-Linear's q/k/v_conv1d) concatenated in order on their first
    dimension into the model's one, as its conversion does; then the model's tied weights tied. Returns the loading
    info."""
    import torch
    from safetensors import safe_open

    places = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    expected = set(model.state_dict().keys())
    info = _Info(model, places)
    parts: dict[str, dict[int, tuple[str, Any]]] = {}
    counts: dict[str, int] = {}
    for f in safetensors_files(path):
        with safe_open(str(f), "pt") as st:
            for stored in st.keys():  # noqa: SIM118 (a safe_open has no __iter__)
                name = names.tensor(stored)
                if name in places and name in expected:
                    info.put(stored, name, st.get_tensor(stored))
                elif (merge := names.merged(name)) is not None and merge[0] in places and merge[0] in expected:
                    parts.setdefault(merge[0], {})[merge[1]] = (stored, st.get_tensor(stored))
                    counts[merge[0]] = merge[2]
                else:
                    info.unexpected.append(stored)
    for name, got in parts.items():
        if sorted(got) != list(range(counts[name])):  # a part missing: the stored ones have no place alone
            info.unexpected += [stored for stored, _ in got.values()]
            continue
        merged = torch.cat([got[i][1] for i in range(counts[name])], dim=0)
        info.put(got[0][0], name, merged)
    model.tie_weights()
    now = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    missing = sorted(n for n in expected - info.filled if n not in now or now[n].device == torch.device("meta"))
    missing += sorted(n for n, t in now.items() if t.device == torch.device("meta") and n not in missing)
    return {"missing_keys": missing, "unexpected_keys": sorted(info.unexpected), "mismatched_keys": info.mismatched}


class _Info:
    """What a load has filled, and the stored tensors it could not place (unexpected) or whose shape or dtype did not
    fit their place (mismatched)."""

    def __init__(self, model: Any, places: dict[str, Any]):
        self.model, self.places = model, places
        self.filled: set[str] = set()
        self.unexpected: list[str] = []
        self.mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    def put(self, stored: str, name: str, tensor: Any) -> None:
        old = self.places[name]
        if not any(_fits(tensor, place) for place in _places(self.model, name, old)):
            self.mismatched.append((stored, tuple(tensor.shape), tuple(old.shape)))
            return
        _put(self.model, name, _as_placed(tensor, old))
        self.filled.add(name)


def _fits(tensor: Any, place: Any) -> bool:
    """Whether a stored tensor can be read into a place: the same shape, and the same dtype where either is a
    payload (_payload)."""
    same_shape = tuple(tensor.shape) == tuple(place.shape)
    return same_shape and (tensor.dtype == place.dtype or not (_payload(place) or _payload(tensor)))


def _places(model: Any, name: str, place: Any) -> list[Any]:
    """The layouts a stored tensor may have in the place `name`: its own, and for a pack-quantized module's zero
    point also the packed one. compressed-tensors (0.19) compresses a module on the meta device without packing an
    asymmetric scheme's zero points, and packs them (int32, along the output dimension: pack_to_int32 with
    packed_dim=0) when it compresses real weights, as a saved checkpoint holds them."""
    import torch

    module_name, _, attr = name.rpartition(".")
    scheme = getattr(model.get_submodule(module_name), "quantization_scheme", None)
    if attr != "weight_zero_point" or scheme is None or scheme.weights is None or place.dtype == torch.int32:
        return [place]
    if getattr(scheme.format, "value", scheme.format) != "pack-quantized" or place.ndim != 2:
        return [place]
    from compressed_tensors.compressors.pack_quantized import pack_to_int32

    packed = pack_to_int32(torch.zeros(tuple(place.shape), dtype=torch.int8), scheme.weights.num_bits, packed_dim=0)
    return [place, packed]


def _payload(place: Any) -> bool:
    """Whether a tensor is a quantized payload (integers, or a float of one byte: FP8 weights and scales), which
    is read only into a place of its own dtype (a cast would change its values' meaning)."""
    return not place.is_floating_point() or place.element_size() < 2


def _as_placed(tensor: Any, old: Any) -> Any:
    """A stored floating-point tensor in the dtype of its place where that is a 16- or 32-bit float (a plain
    weight, a scale), else as stored (a payload: _payload)."""
    if tensor.is_floating_point() and not _payload(old):
        return tensor.to(old.dtype)
    return tensor


def _put(model: Any, name: str, tensor: Any) -> None:
    """`tensor` in place of the parameter or buffer `name` (a parameter stays a parameter, trainable where the one
    it replaces was and its values are floating point; a buffer keeps its persistence)."""
    import torch

    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    if isinstance(old := getattr(module, attr), torch.nn.Parameter):
        tensor = torch.nn.Parameter(tensor, requires_grad=old.requires_grad and tensor.is_floating_point())
    setattr(module, attr, tensor)
