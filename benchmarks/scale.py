"""Conversion at scale: does the streamed path's memory stay flat as the model grows deeper?

Writes random-weight Llama-shaped checkpoints of one decoder-layer shape at several depths, shard by shard and
tensor by tensor (never a whole model in memory; one decoder layer per shard by default), then converts each with
FP8 dynamic and NVFP4A16 through `quantize run` in a child process (streaming: on, and the in-memory path where
--in-memory asks for it) and records wall time, peak RSS (the child's VmHWM, which quantize.json records as
memory.peak_rss_bytes) and bytes read and written per second. Writes benchmarks/results/scale.{md,json}.

    python benchmarks/scale.py --depths 2 4 [--hidden 256 --intermediate 512 --vocab 2048] [--in-memory]

`write_llama(..., sparse=True)` writes the headers only, into files truncated to their full size (sparse: nothing
is allocated): the header-only checkpoints the memory plan's tests refuse.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {
    "fp8-dynamic": {"method": "fp8", "scheme": "FP8_DYNAMIC", "calibration": None},
    "nvfp4a16": {"method": "rtn", "scheme": "NVFP4A16", "calibration": None},
}


@dataclass(frozen=True)
class Shape:
    hidden: int = 256
    intermediate: int = 512
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def layer_tensors(i: int, s: Shape) -> list[tuple[str, list[int]]]:
    p = f"model.layers.{i}."
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [
        (p + "input_layernorm.weight", [s.hidden]),
        (p + "mlp.down_proj.weight", [s.hidden, s.intermediate]),
        (p + "mlp.gate_proj.weight", [s.intermediate, s.hidden]),
        (p + "mlp.up_proj.weight", [s.intermediate, s.hidden]),
        (p + "post_attention_layernorm.weight", [s.hidden]),
        (p + "self_attn.k_proj.weight", [kv, s.hidden]),
        (p + "self_attn.o_proj.weight", [s.hidden, q]),
        (p + "self_attn.q_proj.weight", [q, s.hidden]),
        (p + "self_attn.v_proj.weight", [kv, s.hidden]),
    ]


def config(s: Shape, layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "num_hidden_layers": layers,
        "vocab_size": s.vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def _random_bf16(shape: list[int], rng) -> bytes:
    """Normal(0, 0.02) weights as bf16 bytes (float32's upper half), ones for a norm: one tensor in memory."""
    import numpy as np

    if len(shape) == 1:
        return np.full(shape, 0x3F80, dtype=np.uint16).tobytes()  # 1.0 in bf16
    x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
    return (x >> 16).astype(np.uint16).tobytes()


def write_shard(path: Path, tensors: list[tuple[str, list[int]]], rng=None, sparse: bool = False) -> int:
    """One safetensors file, tensor by tensor (BF16): random data, or with `sparse` only the header in a file
    truncated to its full size. Returns the bytes of its tensors."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads its header to 8 bytes
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        if sparse:
            f.truncate(8 + len(raw) + offset)
        else:
            for _, shape in tensors:
                f.write(_random_bf16(shape, rng))
    return offset


def write_llama(
    path: Path, s: Shape, layers: int, layers_per_shard: int = 1, seed: int = 0, sparse: bool = False
) -> Path:
    """A Llama checkpoint (config.json, shards with an index when there are several, a word-level tokenizer
    unless `sparse`), written shard by shard."""
    import numpy as np

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    groups = [list(range(i, min(i + layers_per_shard, layers))) for i in range(0, layers, layers_per_shard)]
    shards = []
    for k, g in enumerate(groups):
        tensors = [t for i in g for t in layer_tensors(i, s)]
        if k == 0:
            tensors.insert(0, ("model.embed_tokens.weight", [s.vocab, s.hidden]))
        if k == len(groups) - 1:
            tensors.append(("model.norm.weight", [s.hidden]))
        shards.append(tensors)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    total = sum(write_shard(path / n, t, rng, sparse) for n, t in zip(names, shards, strict=True))
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t: n for n, ts in zip(names, shards, strict=True) for t, _ in ts},
        }
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(config(s, layers), indent=2))
    if not sparse:
        _tokenizer(s.vocab).save_pretrained(path)
    return path


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]
    t = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1} | {w: i + 2 for i, w in enumerate(words)}, "<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")


def convert(model: Path, out: Path, recipe: dict, streaming: str) -> dict:
    """`quantize run` in a child process; its quantize.json's wall time and peak RSS (the child's VmHWM)."""
    import yaml

    rfile = out.parent / f"{out.name}.yaml"
    rfile.write_text(yaml.safe_dump({"name": out.name, "model": str(model), "output": str(out), **recipe}))
    rfile.write_text(rfile.read_text() + f"streaming: '{streaming}'\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "quantize.cli", "run", str(rfile), "--quiet", "--force"],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"quantize run {rfile} failed ({done.returncode}): {done.stderr[-2000:]}")
    meta = json.loads((out / "quantize.json").read_text())
    read = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    written = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return {
        "path": meta["memory_plan"]["path"],
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(meta["memory"]["peak_rss_bytes"] / 2**20, 1),
        "read_mb_s": round(read / 1e6 / wall, 2),
        "written_mb_s": round(written / 1e6 / wall, 2),
        "source_mib": round(read / 2**20, 2),
        "output_mib": round(written / 2**20, 2),
        "reload": meta["memory_plan"]["reload"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("/tmp/quantize-scale"))
    ap.add_argument("--in-memory", action="store_true", help="also convert on the in-memory path (streaming: off)")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "scale")
    args = ap.parse_args()
    s = Shape(hidden=args.hidden, intermediate=args.intermediate, vocab=args.vocab)
    rows = []
    for depth in args.depths:
        model = write_llama(args.work / f"llama-{depth}", s, depth)
        for rname, recipe in RECIPES.items():
            for streaming in ["on", "off"] if args.in_memory else ["on"]:
                r = convert(model, args.work / f"{rname}-{depth}-{streaming}", recipe, streaming)
                rows.append({"depth": depth, "recipe": rname, **r})
                print(json.dumps(rows[-1]), flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.with_suffix(".json").write_text(
        json.dumps({"shape": s.__dict__, "cpu": cpu, "rows": rows}, indent=2) + "\n"
    )
    head = (
        "| depth | recipe | path | source (MiB) | output (MiB) | wall (s) | peak RSS (MiB) | read MB/s | written MB/s |"
    )
    lines = [f"Measured on {cpu}; shape {s.__dict__}.", "", head, "|" + "---|" * 9]
    lines += [
        f"| {r['depth']} | {r['recipe']} | {r['path']} | {r['source_mib']} | {r['output_mib']} | {r['wall_s']} | "
        f"{r['peak_rss_mib']} | {r['read_mb_s']} | {r['written_mb_s']} |"
        for r in rows
    ]
    args.results.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
