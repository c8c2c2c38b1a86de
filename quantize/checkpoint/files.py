"""A checkpoint folder on disk: its safetensors files, its config.json, its weights hash.

The one reader of `config.json` and the one list of a checkpoint's weight files; nothing here
imports torch or loads a model.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantize import cache
from quantize.checkpoint import ggufs
from quantize.checkpoint.architecture import expert_problems, mtp_declaration, mtp_of, routed_experts, stored_per_expert
from quantize.checkpoint.headers import all_tensors, check_shard_index
from quantize.errors import UsageError
from quantize.io import read_user_file, sha256_bytes, sha256_file, sha256_named

CONFIG = "config.json"
MAX_JSON_BYTES = 64 * 2**20  # a config, shard index or side quantization config: kilobytes to a few megabytes


SAFE_WEIGHTS = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME
SAFE_INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME


def safetensors_files(checkpoint: Path) -> list[Path]:
    """The weight files a load of the checkpoint reads, resolved as transformers resolves them (loaded_weights), or
    the file itself; every one inside the folder once links are followed (contained)."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_file():
        return [checkpoint]
    if not checkpoint.is_dir():
        what = "is not a regular file or a folder" if checkpoint.exists() else "does not exist"  # a FIFO, a device
        raise UsageError(f"{checkpoint} {what}; pass a checkpoint folder or a .safetensors file")
    refuse_pickles(checkpoint)
    refuse_adapters(checkpoint)
    return contained(checkpoint, loaded_weights(checkpoint))


def loaded_weights(checkpoint: Path) -> list[Path]:
    """The safetensors files `from_pretrained` reads from a folder, in the order it resolves them, where that
    order leaves no doubt; a folder whose files different loaders would read differently is refused, naming them:

        model.safetensors alone                  that file (transformers loads it first, whatever lies beside it)
        model.safetensors.index.json alone       the shards its weight_map names (a stray .safetensors beside
                                                 them is read by no loader: transformers and vLLM follow the index)
        one other NAME.safetensors, no index     that file (read as model.safetensors: loadable_view)
        model.safetensors and the index          refused where the index names other shards: transformers reads
                                                 the file, an index-following loader (vLLM) the shards, and an
                                                 identity over one does not cover the other (an index naming
                                                 model.safetensors alone, as model_free_ptq writes, is one model)
        several .safetensors, no index           refused: transformers reads model.safetensors or nothing, vLLM
                                                 every file
    config.json's `transformers_weights` (a file transformers then loads instead) is refused unless it names the
    file this resolution gives; a weight name that is not a regular file (a FIFO, a folder, a broken link) is
    refused before anything opens it."""
    single, index = checkpoint / SAFE_WEIGHTS, checkpoint / SAFE_INDEX
    present = sorted(p for p in checkpoint.iterdir() if p.name.endswith(".safetensors"))
    odd = [p.name for p in [*present, index] if os.path.lexists(p) and not p.is_file()]
    if odd:
        raise UsageError(
            f"{checkpoint}: {', '.join(odd)} {'is' if len(odd) == 1 else 'are'} not a regular file (a FIFO, a folder "
            "or a broken link); a weight file or shard index must be a plain file: replace it, or move it out"
        )
    if index.is_file():
        files, chosen = indexed_shards(checkpoint, index), SAFE_INDEX
        if single.is_file() and files != [single]:
            raise UsageError(
                f"{checkpoint} holds both {SAFE_WEIGHTS} and {SAFE_INDEX}, which names other shards: transformers "
                f"loads {SAFE_WEIGHTS} and ignores the shards, an index-following loader (vLLM) loads the shards, so "
                "the folder is two models. Keep one layout: remove the single file, or the index and its shards"
            )
        chosen = SAFE_WEIGHTS if single.is_file() else chosen
    elif len(present) == 1:
        files, chosen = present, present[0].name
    elif present:
        raise UsageError(
            f"{checkpoint} holds {len(present)} .safetensors files and no {SAFE_INDEX} "
            f"({', '.join(p.name for p in present[:4])}): transformers loads only {SAFE_WEIGHTS} (or nothing), "
            f"other loaders every file. Write the shard index (save_pretrained does), or keep one weight file"
        )
    else:
        found = ", ".join(sorted(p.name for p in checkpoint.iterdir())[:8]) or "nothing"
        raise UsageError(
            f"{checkpoint} holds no .safetensors file (found: {found}). quantize reads safetensors only; "
            "convert .bin/.pt weights with transformers' save_pretrained(safe_serialization=True)"
        )
    explicit = read_config(checkpoint, required=False).get("transformers_weights")
    if explicit is not None and explicit != chosen:
        raise UsageError(
            f"{checkpoint}/config.json sets transformers_weights to {explicit!r}, so transformers would load that "
            f"instead of {chosen}: quantize identifies and accounts for the standard layout only. Remove the key "
            "(and any weights it named), or rename the file to the standard name"
        )
    return files


def indexed_shards(checkpoint: Path, index: Path) -> list[Path]:
    """The shards a shard index's weight_map names, each a file name in the checkpoint's folder, each present."""
    try:
        weight_map = json.loads(read_user_file(index, "shard index", MAX_JSON_BYTES).decode("utf-8"))["weight_map"]
    except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as e:
        raise UsageError(f"{index} is not a valid shard index ({str(e)[:200]}); re-save the checkpoint") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise UsageError(f"{index}: weight_map must map tensor names to shard file names; re-save the checkpoint")
    names = sorted(set(weight_map.values()))
    outside = [n for n in names if Path(n).name != n or not n.endswith(".safetensors")]
    if outside:
        raise UsageError(
            f"{index} names a shard outside the checkpoint folder or not a .safetensors file: "
            f"{outside[0]!r}; shards are file names in the same folder"
        )
    files = [checkpoint / n for n in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise UsageError(f"{index} lists shards that are missing: {', '.join(missing)}")
    return files


ADAPTER_CONFIG = "adapter_config.json"  # peft's ADAPTER_CONFIG_NAME: transformers applies such an adapter at load


def refuse_adapters(checkpoint: Path) -> None:
    """A PEFT adapter in the folder is applied by `from_pretrained` (peft is installed with lm-eval) on top of the
    weights quantize identifies and accounts for; refused, so no identity or bits figure leaves it out."""
    if os.path.lexists(checkpoint / ADAPTER_CONFIG):
        raise UsageError(
            f"{checkpoint} holds a PEFT adapter ({ADAPTER_CONFIG}), which transformers applies on top of the weights "
            "when it loads the folder: quantize's identity, bits and conversions cover the weights alone. Merge the "
            "adapter into the weights (peft: model.merge_and_unload(), then save_pretrained) and pass the merged "
            "folder, or move the adapter's files out"
        )


ALLOW_SYMLINKS = "QUANTIZE_ALLOW_SYMLINKS"


def contained(checkpoint: Path, files: list[Path]) -> list[Path]:
    """Weight files must lie inside the checkpoint folder once links are followed. The Hugging Face cache's
    own layout (snapshots/REV/x -> ../../blobs/SHA, inside one models--ORG--NAME folder) is inside too;
    anything else needs QUANTIZE_ALLOW_SYMLINKS=1."""
    if os.environ.get(ALLOW_SYMLINKS) == "1":
        return files
    root = checkpoint.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        root = root.parent.parent  # a Hugging Face cache snapshot: its blobs are beside its snapshots
    for f in files:
        if not f.resolve().is_relative_to(root):
            raise UsageError(
                f"{f} links outside the checkpoint folder (to {f.resolve()}); copy the file in, or set "
                f"{ALLOW_SYMLINKS}=1 if the link is meant"
            )
    return files


# Files that unpickle (run code) when loaded: never read, and a folder holding one is refused.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def refuse_pickles(checkpoint: Path) -> None:
    found = sorted(p.name for p in checkpoint.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if found:
        raise UsageError(
            f"{checkpoint} holds pickle files ({', '.join(found[:3])}), which can run code when loaded. quantize reads "
            "safetensors only: move them out of the folder (or re-save with save_pretrained(safe_serialization=True))"
        )


def read_config(checkpoint: Path, required: bool = True) -> dict[str, Any]:
    """The checkpoint's config.json as a mapping ({} when absent and not required). One that is there but is not a
    regular file (a FIFO, a folder, a link to /dev/zero or to nothing) is refused, required or not, as
    identity_files refuses one: read as absent, `inspect` called such a checkpoint unquantized (a review)."""
    checkpoint = Path(checkpoint)
    path = (checkpoint if checkpoint.is_dir() else checkpoint.parent) / CONFIG
    if os.path.lexists(path) and not path.is_file():
        raise UsageError(
            f"{path} is not a regular file (a FIFO, a folder, a device or a broken link); the checkpoint's {CONFIG} "
            "must be a plain file: replace it, or move it out"
        )
    if not path.is_file():
        if required:
            raise UsageError(f"{checkpoint} has no {CONFIG}; pass a Hugging Face checkpoint folder")
        return {}
    return read_json_object(path, "fix or re-save the checkpoint's config")


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON file holding an object, or a UsageError naming the file and `fix`."""
    try:
        data = json.loads(read_user_file(path, "checkpoint file", MAX_JSON_BYTES, hint=fix).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: bad JSON, or an over-long integer
        raise UsageError(f"{path} is not valid JSON ({str(e)[:200]}); {fix}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


def write_config(checkpoint: Path, cfg: dict[str, Any]) -> None:
    (Path(checkpoint) / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")


def check_model_dir(path: Path) -> None:
    """A folder a model can be loaded from: config.json and safetensors weights (pickles refused)."""
    if not path.exists():
        raise UsageError(
            f"model folder {path} does not exist; give a local checkpoint folder (config.json and *.safetensors)"
        )
    if not path.is_dir():
        raise UsageError(
            f"model {path} is a file; `model:` takes a checkpoint folder holding config.json and *.safetensors"
        )
    if not (path / CONFIG).is_file():
        raise UsageError(
            f"{path} is not a model: it has no config.json. Point `model:` at a Hugging Face checkpoint folder "
            "(config.json, *.safetensors, tokenizer files)"
        )
    if not any(p.is_file() for p in path.glob("*.safetensors")):
        bins = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
        why = f" (found {', '.join(bins[:3])}: pickle formats can run code, so quantize refuses them)" if bins else ""
        raise UsageError(
            f"{path} holds no .safetensors weights{why}; convert it with transformers' "
            "save_pretrained(safe_serialization=True)"
        )
    refuse_pickles(path)
    read_config(path)  # a config.json transformers cannot read is the user's to fix, before any import
    identity_files(path)  # config and tokenizer files that read other files (check_redirects), refused first
    config_matches_headers(path)
    index_and_experts_match_headers(path)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


def config_matches_headers(checkpoint: Path) -> None:
    """What config.json implies, checked against the safetensors headers before a byte is allocated: the number
    of layers the weights hold, and the embedding's (vocab_size, hidden_size). A config that promises a
    100,000-layer model or a 10⁹-token vocabulary over a small file is refused here, in milliseconds, naming
    the tensor and both shapes, instead of growing to gigabytes in the model's constructor. The layers are
    num_hidden_layers decoder layers, and where config.json declares multi-token-prediction layers after them
    (architecture.mtp_layers: DeepSeek-V3's layers.61) either those too or none of them: a checkpoint saved by
    transformers keeps the declaration and drops the layers. The tensors of an MTP module stored under a prefix of its
    own (architecture.mtp_of: Qwen3-Next's `mtp.layers.0`) are neither decoder layers nor the embedding."""
    cfg = read_config(checkpoint, required=False)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    tensors, _ = all_tensors(safetensors_files(checkpoint))
    prefixed = mtp_of(cfg).in_prefix
    tensors = {n: t for n, t in tensors.items() if not prefixed(n)}
    fix = "fix config.json, or the weights that go with it"
    layers = {int(m.group(1)) for n in tensors if (m := _LAYER.search(n))}
    want = text.get("num_hidden_layers")
    key, mtp = mtp_declaration(cfg) if isinstance(want, int) else ("", range(0))
    if isinstance(want, int) and layers and max(layers) + 1 not in {want, mtp.stop}:
        declared = (
            f"num_hidden_layers {want} and {len(mtp)} multi-token-prediction layer(s) after them "
            f"({key} {len(mtp)}: layers.{want} to layers.{mtp.stop - 1}), so {want} or "
            f"{mtp.stop} layers in all"
            if mtp
            else f"num_hidden_layers {want}"
        )
        raise UsageError(
            f"{checkpoint}: config.json says {declared}, but the weights hold {max(layers) + 1} layers "
            f"(layers.0 to layers.{max(layers)}); {fix}"
        )
    emb = next((t for n, t in sorted(tensors.items()) if n.endswith(EMBEDDINGS)), None)
    implied = [text.get("vocab_size"), text.get("hidden_size")]
    if emb is not None and len(emb.shape) == 2 and all(isinstance(x, int) for x in implied) and emb.shape != implied:
        raise UsageError(
            f"{checkpoint}: tensor {emb.name} has shape {emb.shape} in {emb.file}, and config.json's vocab_size "
            f"and hidden_size imply {implied}; {fix}"
        )


def index_matches_headers(checkpoint: Path, tensors: dict[str, Any]) -> None:
    """The shard index, where there is one, against its shards' tensors (`tensors`: all_tensors of
    safetensors_files, which read and checked the index): headers.check_shard_index."""
    if (index := Path(checkpoint) / SAFE_INDEX).is_file():
        weight_map = json.loads(read_user_file(index, "shard index", MAX_JSON_BYTES).decode("utf-8"))["weight_map"]
        check_shard_index(index, weight_map, tensors)


def index_and_experts_match_headers(checkpoint: Path) -> None:
    """The shard index against its shards' headers (headers.check_shard_index) and the routed experts' tensors
    against config.json (architecture.expert_problems), from the headers alone, before torch is imported: a tensor
    the index names that no shard holds, an expert missing, past config.json's count, or of another shape than its
    fellows is refused (exit 2) naming the tensor, in milliseconds, where the model's load or model_free_ptq
    stopped on it with exit 3 after seconds. An expert quantized unlike its fellows is refused on every layout: the
    engines read one scheme for a layer's experts (expert_problems), whatever our per-expert loader could read."""
    tensors, _ = all_tensors(safetensors_files(checkpoint))
    index_matches_headers(checkpoint, tensors)
    shapes = {n: (t.shape, t.dtype) for n, t in tensors.items()}
    cfg = read_config(checkpoint, required=False)
    if problems := expert_problems(cfg, shapes):
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(
            f"{checkpoint}: the routed experts' tensors do not match config.json or each other: "
            f"{'; '.join(problems[:3])}{more}. transformers stacks each layer's experts into one tensor, so every "
            "expert must hold the same tensors, shapes and dtypes as the others, and vLLM reads every expert with "
            "expert 0's scheme: an expert quantized unlike its fellows is read wrongly by both. Fix config.json, or "
            "the weights that go with it (quantize the layer's experts alike)"
        )


# how the reload stage of a checkpoint read by the per-expert loader names it (convert/checks.reloaded_with); the
# run's summary repeats that stage, which says which loaders read the checkpoint (convert/render.run_text)
PER_EXPERT_LOADER = "quantize's per-expert loader"


def reads_per_expert(checkpoint: Path) -> bool:
    """Whether the per-expert loader (checkpoint/decompressed.py) reads a checkpoint: its quant_method is
    compressed-tensors, config.json declares routed experts (architecture.routed_experts) and its safetensors
    headers store them per expert (a checkpoint of fused expert tensors is transformers' to read). The headers
    are read only for such a checkpoint."""
    if quant_method(checkpoint) != "compressed-tensors" or routed_experts(read_config(checkpoint)) is None:
        return False
    tensors, _ = all_tensors(safetensors_files(checkpoint))
    return stored_per_expert(tensors)


# What transformers needs installed to load a checkpoint of each quantization method (its quantizers' own checks:
# GPTQ through optimum and GPTQModel, AWQ through GPTQModel and accelerate).
LOADER_PACKAGES = {"gptq": ("optimum", "gptqmodel"), "awq": ("gptqmodel", "accelerate")}

# Pre-integration layouts (AutoGPTQ, AutoAWQ) keep the quantization settings beside config.json, not in it.
SIDE_CONFIGS = {"quantize_config.json": "gptq", "quant_config.json": "awq"}


def side_quantization_config(path: Path) -> tuple[str, dict[str, Any]] | None:
    """A pre-integration layout's settings as transformers' `quantization_config`, and the file they came from;
    None when config.json has its own quantization_config or there is no side file.

        AutoGPTQ / GPTQModel  quantize_config.json {"bits", "group_size", "desc_act", "sym", ...}: as written
        AutoAWQ               quant_config.json {"w_bit", "q_group_size", "zero_point", "version"}: renamed to
                              AwqConfig's {"bits", "group_size", "zero_point", "version"}"""
    if read_config(path).get("quantization_config"):
        return None
    return side_file(path)


def side_file(path: Path) -> tuple[str, dict[str, Any]] | None:
    """The side file's settings as transformers' `quantization_config` (side_quantization_config), without looking
    at config.json first."""
    for name, method in SIDE_CONFIGS.items():
        if (f := Path(path) / name).is_file():
            side = read_json_object(f, "re-save the checkpoint with the tool that quantized it")
            if method == "awq":
                rename = {"w_bit": "bits", "q_group_size": "group_size"}
                side = {rename.get(k, k): v for k, v in side.items()}
                side["version"] = str(side.get("version", "gemm")).lower()
            return name, {**side, "quant_method": method}
    return None


def is_quantized(path: Path) -> bool:
    """Whether the checkpoint is quantized already: config.json has a quantization_config, or a pre-integration
    quantizer left its side file (SIDE_CONFIGS)."""
    return bool(read_config(path).get("quantization_config")) or side_file(path) is not None


def quant_method(path: Path) -> str | None:
    """The checkpoint's quantization method (config.json's quantization_config, else a side file), lower case."""
    qc = read_config(path).get("quantization_config") or {}
    if not qc and (side := side_file(path)) is not None:
        qc = side[1]
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    return str(method).lower() if method else None


def missing_packages(names: tuple[str, ...] | list[str]) -> list[str]:
    """Those of `names` that cannot be imported here (found without importing them)."""
    import importlib.util

    return [m for m in names if importlib.util.find_spec(m) is None]


def check_loadable(path: Path) -> None:
    """A quantized checkpoint whose loader packages are not installed is the user's to fix (exit 2), named before
    any model loads; transformers would stop at the first missing one, so all are named at once. `inspect` needs
    none of them (it reads headers)."""
    method = quant_method(path)
    need = LOADER_PACKAGES.get(method) if method else None
    if missing := missing_packages(need or ()):
        side = side_quantization_config(path)
        where = f"{side[0]}, quant_method" if side else "config.json quantization_config.quant_method"
        raise UsageError(
            f"{path} is a {str(method).upper()} checkpoint ({where}: {method}); "
            f"transformers loads it through {' and '.join(need or ())}, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed here. They are not part of quantize's core "
            "environment (GPTQModel 7.0-7.6 pins numpy 2.2.6, below quantize's pin; newer releases pull another "
            "torch): `make gptq-env` builds an environment of its own with them (.venv-gptq), where "
            "`.venv-gptq/bin/quantize eval|gate` scores this checkpoint. `quantize inspect` reads it here without them."
        )


@contextlib.contextmanager
def loadable_view(path: Path) -> Iterator[Path]:
    """The folder transformers (or vLLM) should load `path` from. Most checkpoints: `path` itself. A
    pre-integration layout gets a temporary view beside nothing it could overwrite: every file linked, config.json
    with the side file's settings as its quantization_config (side_quantization_config), and a single
    unconventionally named weight file (AutoGPTQ's gptq_model-4bit-128g.safetensors) linked as
    model.safetensors. The view lives while the model loads; the checkpoint itself is never written."""
    path = Path(path)
    side = side_quantization_config(path)
    weights = [f for f in path.glob("*.safetensors") if f.is_file()]
    rename = (
        weights[0]
        if len(weights) == 1
        and weights[0].name != "model.safetensors"
        and not (path / "model.safetensors.index.json").is_file()
        else None
    )
    if side is None and rename is None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="quantize-view-") as tmp:
        view = Path(tmp)
        for f in path.iterdir():
            if f.is_file() and f.name != CONFIG:
                (view / ("model.safetensors" if f == rename else f.name)).symlink_to(f.resolve())
        cfg = read_config(path)
        if side is not None:
            cfg["quantization_config"] = side[1]
        write_config(view, cfg)
        yield view


# Files besides the weights that change what a checkpoint computes: its config, tokenizer, chat template
# and generation defaults. The tokenizer's are every file name a transformers tokenizer class reads
# (VOCAB_FILES_NAMES across transformers.models: tests/checkpoint/test_identity.py fails on a name missing here).
IDENTITY_FILES = (
    "config.json",
    "quantize_config.json",  # a pre-integration layout's quantization settings (SIDE_CONFIGS)
    "quant_config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "sentencepiece.model",
    "spm.model",
    "spm_char.model",
    "source.spm",
    "target.spm",
    "bpe.codes",
    "dict.txt",
    "entity_vocab.json",
    "emoji.json",
    "normalizer.json",
    "vocab-src.json",
    "vocab-tgt.json",
    "target_vocab.json",
    "byte_maps.json",
    "word_shape.json",
    "word_pronunciation.json",
    "prophetnet.tokenizer",
    "chat_template.jinja",
    "chat_template.json",
    # where tokenizer.json is absent, transformers' tokenizer looks for Mistral's and tiktoken's files by name
    # (PreTrainedTokenizerBase.from_pretrained's fallback pattern; tests/checkpoint/test_loaded_files.py pins it)
    "tekken.json",
    "tiktoken.model",
)
CHAT_TEMPLATES = "additional_chat_templates"  # a folder of NAME.jinja the tokenizer loads as named templates
CUSTOM_GENERATE = "custom_generate"  # generate.py (and its requirements) replaces generate() under trust_remote_code
# what else that fallback pattern can match as a whole name (and then reads): `tokenizer\.model\.*` ("tokenizer.model"
# and dots), `tiktoken\.model` glued to the class's first VOCAB_FILES_NAMES key, and those keys (each ends in _file)
_FALLBACK_NAMES = re.compile(r"^(tokenizer\.model\.+|tiktoken\.model\w+|\w+_file)$")
# Keys by which transformers reads another file in the place of one this project reads and identifies: config.json's
# `configuration_files` (configuration_utils.get_configuration_file picks config.VERSION.json by transformers'
# version) and tokenizer_config.json's `fast_tokenizer_files` (get_fast_tokenizer_file: tokenizer.VERSION.json).
REDIRECTS = {
    "config.json": ("configuration_files", "config.json"),
    "tokenizer_config.json": ("fast_tokenizer_files", "tokenizer.json"),
}


NOT_TOKENIZER = (
    "config.json",
    "quantize_config.json",
    "quant_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
TOKENIZER_FILES = tuple(n for n in IDENTITY_FILES if n not in NOT_TOKENIZER)
ARCHITECTURE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def tokenizer_files(checkpoint: Path) -> tuple[tuple[str, str], ...]:
    """(name, sha256) of each TOKENIZER_FILES file the checkpoint has: two checkpoints with equal tuples have one
    tokenizer byte for byte (loader.same_vocabulary loads both where they differ)."""
    return tuple((n, sha256_file(checkpoint / n)) for n in TOKENIZER_FILES if (checkpoint / n).is_file())


def vocabulary_sha256(checkpoint: Path) -> str | None:
    """_vocabulary_sha256 of the checkpoint, memoized per its tokenizer files' hashes (as loader.same_vocabulary
    memoizes its reading): a report reads the baseline's vocabulary once, whatever the candidates."""
    return _vocabulary_sha256(str(checkpoint), tokenizer_files(Path(checkpoint)))


@functools.lru_cache(maxsize=16)
def _vocabulary_sha256(path: str, _files: tuple[tuple[str, str], ...]) -> str | None:
    """sha256 of the vocabulary the fast tokenizer at `path` maps (token -> id, added tokens included, as the
    tokenizers library reads its tokenizer.json: what transformers' get_vocab returns) with the added tokens its
    tokenizer_config.json declares (added_tokens_decoder), or None where it has no tokenizer.json or either file
    does not read. Equal hashes are one vocabulary, told without transformers (the report's check, where the
    tokenizer files differ in bytes: a conversion re-saves tokenizer_config.json with keys of its own);
    loader.same_vocabulary, the gate's, loads both tokenizers."""
    import tokenizers

    checkpoint = Path(path)
    try:
        raw = read_user_file(checkpoint / "tokenizer.json", "tokenizer.json", MAX_JSON_BYTES)
        vocab = tokenizers.Tokenizer.from_str(raw.decode("utf-8")).get_vocab(with_added_tokens=True)
        cfg_path = checkpoint / "tokenizer_config.json"
        cfg = (
            json.loads(read_user_file(cfg_path, "tokenizer_config.json", MAX_JSON_BYTES).decode("utf-8"))
            if cfg_path.is_file()
            else {}
        )
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # unreadable in any way, the tokenizers library's Rust panics too (a BaseException)
        return None
    added = cfg.get("added_tokens_decoder") if isinstance(cfg, dict) else None
    return sha256_bytes(json.dumps([sorted(vocab.items()), added if isinstance(added, dict) else None]).encode())


def architecture(checkpoint: Path) -> dict[str, Any]:
    """What makes two checkpoints one model at two precisions: config.json's type and shapes."""
    cfg = read_config(checkpoint, required=False)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return {k: cfg.get(k, text.get(k)) for k in ARCHITECTURE_KEYS}


def identity_sha256(checkpoint: Path) -> str:
    """The checkpoint's identity: sha256 over its weights hash (the files a load reads: safetensors_files, or a
    GGUF's parts) and every file of IDENTITY_FILES and CHAT_TEMPLATES it has. Scores are cached and compared under
    this hash, so the same weights under another config or tokenizer are another checkpoint; what a load reads
    beyond them (a PEFT adapter, another weight layout) is refused where it is resolved, and check_identity holds a
    load to it. Each file's stat keys (_file_key) are taken before its bytes are hashed (or its hash is served from
    a memo) and kept, the first time this process takes the identity of this folder (_HELD), for
    check_identity."""
    checkpoint = Path(checkpoint)
    side = identity_files(checkpoint)
    stats = {os.path.abspath(f): _file_key(f) for f in (*weight_paths(checkpoint), *(checkpoint / n for n in side))}
    parts = [b"weights " + weights_sha256(checkpoint).encode()]
    for name in side:
        parts.append(f"\n{name} ".encode() + sha256_file(checkpoint / name).encode())
    identity = sha256_bytes(b"".join(parts))
    with _HELD_LOCK:
        key = (os.path.realpath(checkpoint), identity)
        if key not in _HELD:
            while len(_HELD) >= MAX_HELD:
                del _HELD[next(iter(_HELD))]  # the oldest: its check falls back to hashing again
            _HELD[key] = stats
    return identity


def weight_paths(checkpoint: Path) -> list[Path]:
    """The weight files a load reads, which weights_sha256 hashes: safetensors_files, or a GGUF's every part
    (ggufs.weight_files)."""
    weights = ggufs.weight_files(checkpoint)
    return list(weights) if weights is not None else safetensors_files(checkpoint)


# The stat keys of the files each identity was taken from, per (the folder's real path, identity), kept from the
# first time this process took that identity (a later taking, after the files were rewritten to the same bytes,
# keeps the first: it does not excuse what happened in between); dropped when check_identity refuses.
_HELD: dict[tuple[str, str], dict[str, tuple[Any, ...] | None]] = {}
_HELD_LOCK = threading.Lock()
MAX_HELD = 4096
_CALLS = [0]  # how deep in held_per_call this process is: the outermost call starts the table afresh


@contextlib.contextmanager
def held_per_call() -> Iterator[None]:
    """One call of the API (every CLI command is one: api._boundary) holds the identities it takes to the files as
    it found them; the next call starts afresh. A process that calls the API in a loop (run, gate, run again with
    force into the same folder, gate) rewrites a folder with the same bytes between two calls: its second gate was
    refused, naming a writer that did not exist (review r5). Within one call, nothing that took an identity earlier
    excuses a change since (calls nested inside it keep the outer call's table)."""
    with _HELD_LOCK:
        if _CALLS[0] == 0:
            _HELD.clear()
        _CALLS[0] += 1
    try:
        yield
    finally:
        with _HELD_LOCK:
            _CALLS[0] -= 1


def _file_key(f: Path) -> tuple[Any, ...] | None:
    """A file's stat keys (_stat_key) as found through any link, and the link's own where it is one (a Hub snapshot's
    link pointed at another blob and back moves the link's inode and ctime, not the blob's); None where it cannot be
    stat'ed (gone)."""
    try:
        st, lst = os.stat(f), os.lstat(f)
    except OSError:
        return None
    return (_stat_key(st), _stat_key(lst) if stat.S_ISLNK(lst.st_mode) else None)


def identity_view(checkpoint: Path, folder: Path) -> Path:
    """`folder` made a view of the checkpoint holding links to exactly what its identity covers: the IDENTITY_FILES
    it has, and its weights by the names a reader of the folder takes (model.safetensors, or the shard index and the
    shards it names). What a library that walks a whole folder (llama.cpp's converter, llm-compressor's
    model_free_ptq, which copies every other file into its output) is given: nothing else of the folder is read."""
    folder.mkdir()
    weights = safetensors_files(checkpoint)
    for name in identity_files(checkpoint):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to((checkpoint / name).resolve())
    if (checkpoint / SAFE_WEIGHTS).is_file() or not (checkpoint / SAFE_INDEX).is_file():
        (folder / SAFE_WEIGHTS).symlink_to(weights[0].resolve())  # one file: read as model.safetensors
    else:
        (folder / SAFE_INDEX).symlink_to((checkpoint / SAFE_INDEX).resolve())
        for f in weights:
            (folder / f.name).symlink_to(f.resolve())
    return folder


def identity_files(checkpoint: Path) -> list[str]:
    """The names (relative to the folder) of the files besides the weights that the identity hashes (IDENTITY_FILES,
    the named chat templates, and the folder's *.py files, which --trust-remote-code runs); a name of
    IDENTITY_FILES that is there but is not a regular file (a FIFO, a folder, a broken link) is refused before a
    library opens it."""
    found = []
    for name in IDENTITY_FILES:
        if os.path.lexists(f := checkpoint / name):
            if not f.is_file():
                raise UsageError(
                    f"{f} is not a regular file (a FIFO, a folder or a broken link); the checkpoint's {name} must be "
                    "a plain file: replace it, or move it out"
                )
            found.append(name)
    if checkpoint.is_dir():
        found += sorted(f.name for f in checkpoint.iterdir() if _FALLBACK_NAMES.match(f.name) and f.is_file())
    for folder in (CHAT_TEMPLATES, CUSTOM_GENERATE):
        if (sub := checkpoint / folder).is_dir():
            found += sorted(f"{folder}/{f.name}" for f in sub.iterdir() if f.is_file())
    # the folder's own Python: what config.json's auto_map runs under --trust-remote-code (keyed apart too)
    found += sorted(f.name for f in checkpoint.glob("*.py") if f.is_file())
    check_redirects(checkpoint, found)
    return found


def check_redirects(checkpoint: Path, hashed: list[str]) -> None:
    """Refuse (UsageError) a checkpoint whose config files make transformers read a file that is not the one this
    project reads and identifies (`hashed`, names in the folder): a REDIRECTS key listing other files, or a
    tokenizer_config.json `*_file` entry naming an existing file that is none of them. transformers opens such an
    entry where it points (a relative one from the working folder) for the keys its tokenizer class does not name in
    VOCAB_FILES_NAMES (GemmaTokenizer's `vocab_file`, for one), so a file outside the folder could build the tokenizer
    while the identity stayed the same."""
    fix = "the folder's own files are found by their names"
    for name, (key, own) in REDIRECTS.items():
        if name not in hashed:
            continue
        listed = read_json_object(checkpoint / name, "fix or re-save the checkpoint").get(key)
        if listed is not None and (not isinstance(listed, list) or any(f != own for f in listed)):
            raise UsageError(
                f"{checkpoint / name} lists {key} = {json.dumps(listed)[:200]}: transformers then reads the one its "
                f"version picks in {own}'s place, while this project reads and identifies {own}. Put what that file "
                f"holds into {own} and remove `{key}` ({fix})"
            )
    if "tokenizer_config.json" not in hashed:
        return
    allowed = {os.path.realpath(checkpoint / n) for n in hashed}
    for key, value in read_json_object(checkpoint / "tokenizer_config.json", "re-save the tokenizer").items():
        named = key.endswith("_file") and isinstance(value, str) and value and os.path.lexists(value)
        if named and os.path.realpath(value) not in allowed:
            raise UsageError(
                f"{checkpoint / 'tokenizer_config.json'}: {key} = {value!r} names a file that is not one of the "
                "checkpoint's own tokenizer files, and transformers may build the tokenizer from it while the "
                f"checkpoint's identity does not cover it. Remove `{key}` ({fix}), or copy the file in under its "
                "tokenizer file name"
            )


def hf_path(path: str | os.PathLike[str]) -> str:
    """The path string handed to transformers' from_pretrained: absolute (links kept). transformers reads the string
    besides the folder: AutoTokenizer matches a config's `_name_or_path`, which is that string, against Hub ids
    (tokenization_auto.MODEL_IDS_TO_TOKENIZERS_BACKEND) and picks another tokenizer class on a match, so a relative
    path spelled like `deepseek-ai/deepseek-coder-1b` tokenized differently from the same folder named otherwise,
    under one identity. An absolute path names no Hub id."""
    return os.path.abspath(os.fspath(path))


def check_identity(checkpoint: Path, identity: str) -> None:
    """After a load and the work on what it loaded: the checkpoint is still the files its identity was taken from.
    Every file the identity covers must have the stat keys it had when identity_sha256 took the identity in this
    process (device, inode, size, mtime and ctime, a link's own too: _file_key): a file replaced (a rename) or written
    in place since then moves its inode or ctime, which no user-space call sets back, and the evidence is withheld,
    exit 2, naming the file, whatever its bytes are now. Its hash is not taken again to excuse it: weights renamed
    aside for the load and put back, or a GGUF (scored from a memory map of the file) written in place and restored,
    hash to the identity again while what was loaded was other weights. Then the identity is taken again (a file
    added, such as a tokenizer file, is no held file): another identity is exit 2 too. An identity this process did
    not take is held to its hash alone. Unchanged files cost a stat each and the small side files' hashes."""
    checkpoint = Path(checkpoint)
    key = (os.path.realpath(checkpoint), identity)
    with _HELD_LOCK:
        held = _HELD.get(key, {})
    moved = next((f for f, was in held.items() if _file_key(Path(f)) != was), None)
    if moved is not None:
        with _HELD_LOCK:
            _HELD.pop(key, None)  # refused once: a run after the writing stops takes the identity afresh
        raise UsageError(
            f"{checkpoint} changed while it was being read: {moved} was replaced or written (its inode, size, mtime "
            f"or ctime moved) after the identity {identity[:16]} was taken from it, so what was loaded may not be what "
            "the identity names, even where its bytes are the same again. Nothing was kept and no verdict is given: "
            "run again once the folder is no longer being written"
        )
    if (now := identity_sha256(checkpoint)) != identity:
        with _HELD_LOCK:
            _HELD.pop(key, None)
        raise UsageError(
            f"{checkpoint} changed while it was being read: its identity was {identity[:16]} when it was hashed and "
            f"is {now[:16]} now (a weight, config or tokenizer file was replaced or rewritten), so what was loaded "
            "may not be what the identity names. Nothing was kept and no verdict is given: run again once the "
            "folder is no longer being written"
        )


HUB_BLOB = re.compile(r"^[0-9a-f]{64}$")
REREAD = "QUANTIZE_REREAD_WEIGHTS"  # "1": read Hub blobs and check them against their names (--reread-weights)


def hub_blob_sha256(f: Path) -> str | None:
    """The sha256 a Hugging Face cache names a weight file's blob by, where `f` sits in that cache's own layout,
    else None (its bytes are hashed). The layout, as snapshot_download leaves an LFS file:

        .../models--ORG--NAME/snapshots/REV/FILE  a link whose own target, taken as written, is
        .../models--ORG--NAME/blobs/<64 hex>      a regular file in the same models--ORG--NAME folder

    The link is resolved one step without leaving that folder: a blob reached through another link (the blobs
    folder or the blob itself a link elsewhere), a blob of another models--* folder, or a plain folder whose files
    link into some nested models--*/blobs is not a Hub snapshot, and is identified by its bytes."""
    if not f.is_symlink():
        return None
    snapshot = f.parent.resolve()
    repo = snapshot.parent.parent
    if snapshot.parent.name != "snapshots" or not repo.name.startswith("models--") or repo.name == "models--":
        return None
    target = Path(os.path.normpath(snapshot / os.readlink(f)))  # one step, as written (relative to the snapshot)
    if target.parent != repo / "blobs" or not HUB_BLOB.match(target.name) or target.parent.is_symlink():
        return None
    if target.is_symlink() or not target.is_file() or f.resolve() != target:
        return None
    return target.name


def hub_blobs(checkpoint: Path) -> list[tuple[Path, str]]:
    """The weight files whose part in the checkpoint's identity is their Hub blob's name (weights_sha256), each with
    that name; [] where the weights are identified by their bytes (a GGUF's always are: ggufs.weights_sha256)."""
    if ggufs.find(checkpoint) is not None:
        return []
    return _named_blobs(safetensors_files(checkpoint))


def _named_blobs(files: list[Path]) -> list[tuple[Path, str]]:
    named = [(f, hub_blob_sha256(f)) for f in files]
    return [(f, name) for f, name in named if name] if files and all(name for _, name in named) else []


def check_blob(f: Path, name: str) -> None:
    """A Hub blob's bytes must hash to its name: a UsageError naming the blob, the sha256 it claims and the one it
    has, where they differ (the cache was altered or damaged after the download, or built to borrow an identity)."""
    blob = f.resolve()
    st = blob.stat()
    found = _blob_sha256(str(blob), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if found != name:
        raise UsageError(
            f"{f} links to the Hub cache blob {blob}, whose bytes do not hash to its name: it claims sha256 {name}, "
            f"its bytes hash to {found}. The cache was altered or damaged after the download (or built to borrow "
            "another checkpoint's identity): no verdict rests on it. Delete that blob and download the model again"
        )


@functools.lru_cache(maxsize=256)
def _blob_sha256(path: str, size: int, mtime_ns: int, ctime_ns: int, ino: int) -> str:
    """A blob's bytes hashed once per process while the file is unchanged (the stat is part of the key)."""
    return sha256_file(Path(path))


def _blobs_of(checkpoint: Path) -> list[tuple[Path, str]]:
    """hub_blobs of a folder, none where it holds no weights to list (no identity to check: whatever reads it
    refuses or skips it, with its own message; `agree` over a folder skips it and measures the others)."""
    try:
        return hub_blobs(checkpoint)
    except UsageError:
        return []


class BlobCheck:
    """The Hub blobs behind some checkpoints' identities (hub_blobs), read back and checked against their names
    (check_blob) in a background thread while the caller goes on: hashing reads the files and hashlib releases the
    interpreter lock, so it runs beside scoring. `wait()` joins it and raises the first blob whose name lies."""

    def __init__(self, checkpoints: list[Path]) -> None:
        blobs = {f.resolve(): (f, name) for c in checkpoints if Path(c).is_dir() for f, name in _blobs_of(Path(c))}
        self.blobs = list(blobs.values())
        self.error: UsageError | None = None
        self.seconds = 0.0  # wall time of the check in its thread
        self._thread = threading.Thread(target=self._run, name="quantize-blob-check", daemon=True)
        if self.blobs:
            self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            for f, name in self.blobs:
                check_blob(f, name)
        except UsageError as e:
            self.error = e
        except OSError as e:  # a blob gone or unreadable mid-gate: nothing vouches for its name either
            self.error = UsageError(f"could not read the Hub cache blob behind {e.filename}: {e.strerror}")
        self.seconds = time.perf_counter() - t0

    def wait(self) -> None:
        if self.blobs:
            self._thread.join()
        if self.error is not None:
            raise self.error


def weights_sha256(checkpoint: Path) -> str:
    """sha256 over the lines "NAME SHA256\n" of the checkpoint's safetensors files, in name order, each line a
    file's name and the sha256 of its bytes: the same files have one weights hash whatever their layout.

    A folder of files: each file's sha256 from its bytes (as read, through any link), streamed. A Hugging Face cache
    snapshot (hub_blob_sha256: the cache's own layout, nothing else) whose every weight file links to a blob named
    by a sha256: each file's sha256 is its blob's name, taken without reading a byte (a 140 GB baseline is
    identified in milliseconds on a runner that restored the Hub cache), the same line its bytes would give. The
    name is never the sole basis of a verdict: `quantize gate` reads every such blob back in a background thread
    while it scores (BlobCheck) and refuses the verdict where one does not hash to its name; with
    QUANTIZE_REREAD_WEIGHTS=1 (`--reread-weights`) every blob is read and checked here, before anything else, and
    the hash is the same. (Before WEIGHTS_HASH_VERSION 2 a folder was hashed as one stream of names and bytes, so
    the two layouts of the same bytes had two identities: docs/reliability.md, "Re-score note".)

    A folder's hash is memoized in the process (one gate hashes each checkpoint for scoring, for agreement and for
    the report) and in the cache (`lookup_weights_hash`: every process on this machine, such as a sweep's
    workers, finds it again until a file changes or the machine reboots); a rewritten file is hashed again.
    A GGUF (a .gguf path, or a folder of one: ggufs.weights_sha256) is hashed from its bytes, memoized in the process
    while its stat holds."""
    if (gguf := ggufs.weights_sha256(checkpoint)) is not None:
        return gguf
    files = safetensors_files(checkpoint)
    if blobs := _named_blobs(files):
        if os.environ.get(REREAD) == "1":
            for f, name in blobs:
                check_blob(f, name)
        return sha256_named([(f.name, name) for f, name in blobs])
    return _sha256_of_files(tuple((f.name, str(f.resolve()), _stat_key(f.stat())) for f in files))


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is replaced or written: device, inode, size, mtime and ctime (the last settable by
    no user-space call, so a rewrite with its old size and mtime put back still moves it)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# 2 (2026-12-04): the lines "NAME SHA256" for a folder too, where 1 hashed a folder as one stream of names and bytes
WEIGHTS_HASH_VERSION = 2


@functools.lru_cache(maxsize=64)
def _sha256_of_files(files: tuple[tuple[str, str, tuple[int, int, int, int, int]], ...]) -> str:
    named = [(name, Path(path)) for name, path, *_ in files]
    if (found := lookup_weights_hash(named)) is not None:
        return found
    sha = sha256_named([(name, sha256_file(path)) for name, path in named])
    store_weights_hash(named, sha)
    return sha


# The weights hash memo: $QUANTIZE_CACHE/identity/KEY.json, KEY = sha256(this machine's boot id,
# WEIGHTS_HASH_VERSION, and per file: name, path, device, inode, size, mtime, ctime) (quantize/cache.py
# `memo_path`). It is only ever found again by the same files on the same machine since its last boot, unchanged
# (any write, rename or chmod moves a file's ctime, which no user-space call can set back): one restored from
# another machine, or written before a reboot, never matches, so a cache writer elsewhere cannot choose an
# identity here.


def _weights_memo_path(files: list[tuple[str, Path]]) -> Path | None:
    stats = []
    for name, path in files:
        st = path.stat()
        stats.append([name, str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return cache.memo_path("identity", "", {"files": stats, "v": WEIGHTS_HASH_VERSION})


def lookup_weights_hash(files: list[tuple[str, Path]]) -> str | None:
    """The weights hash of these files as an earlier process here computed it (the memo above), else None."""
    found = cache.read_memo(_weights_memo_path(files), "weights_sha256")
    hexdigits = "0123456789abcdef"
    return found if isinstance(found, str) and len(found) == 64 and all(c in hexdigits for c in found) else None


def store_weights_hash(files: list[tuple[str, Path]], sha256: str) -> None:
    cache.write_memo(_weights_memo_path(files), {"weights_sha256": sha256})


def checkpoint_folders(given: list[str]) -> list[Path]:
    """Checkpoints, each given or found one level below a folder given (such as outputs/): folders with a
    config.json, GGUF files and folders holding one (ggufs.find)."""
    paths: list[Path] = []
    for c in given:
        p = Path(c)
        if ggufs.find(p) is not None:
            paths.append(p)
        elif p.is_dir() and not (p / "config.json").is_file():
            found = sorted(d for d in p.iterdir() if (d / "config.json").is_file() or _gguf_folder(d))
            if not found:
                raise UsageError(
                    f"{p} is neither a checkpoint nor a folder of checkpoints (no config.json in it or in "
                    "its subfolders); pass checkpoint folders, or a folder holding them such as outputs"
                )
            paths += found
        elif p.is_dir():
            paths.append(p)
        else:
            raise UsageError(
                f"{p} is not a checkpoint folder{'' if p.exists() else ' (it does not exist)'}; "
                "pass checkpoint folders, or a folder holding them such as outputs"
            )
    return list(dict.fromkeys(paths))


def _gguf_folder(d: Path) -> bool:
    """A folder of a GGUF checkpoint (one GGUF, no safetensors); one whose GGUFs cannot be told apart is not."""
    try:
        return d.is_dir() and ggufs.find(d) is not None
    except UsageError:
        return False
