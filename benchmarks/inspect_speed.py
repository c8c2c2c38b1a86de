"""How much `quantize inspect` reads, and how fast, against the size of the checkpoint.

Builds synthetic checkpoints of growing size (a 4-bit compressed-tensors layout, sharded like
transformers does, without writing real weights: the data sections are sparse files) and times
the header-only accounting. Prints bytes read against file size and the time per call.

    python benchmarks/inspect_speed.py
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quantize.checkpoint.accounting import bits_report


def sparse_shard(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A valid safetensors file whose data section is a hole: header written, data never touched."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def build(folder: Path, layers: int, hidden: int, shards: int) -> None:
    g, weight_map, per = 128, {}, max(1, layers // shards)
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for layer in range(s * per, min(layers, (s + 1) * per)):
            for proj, (o, i) in {
                "q_proj": (hidden, hidden),
                "k_proj": (hidden // 8, hidden),
                "v_proj": (hidden // 8, hidden),
                "o_proj": (hidden, hidden),
                "gate_proj": (4 * hidden, hidden),
                "up_proj": (4 * hidden, hidden),
                "down_proj": (hidden, 4 * hidden),
            }.items():
                base = f"model.layers.{layer}.{proj}"
                tensors[f"{base}.weight_packed"] = ("I32", [o, i // 8], o * i // 2)
                tensors[f"{base}.weight_scale"] = ("BF16", [o, i // g], o * (i // g) * 2)
            tensors[f"model.layers.{layer}.input_layernorm.weight"] = ("BF16", [hidden], hidden * 2)
        sparse_shard(folder / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "pack-quantized",
                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": g}}},
                }
            }
        )
    )


def main() -> None:
    print(f"{'checkpoint':<22}{'file bytes':>20}{'header bytes read':>20}{'read share':>12}{'ms per inspect':>16}")
    for label, layers, hidden, shards in [
        ("1B-like", 16, 2048, 1),
        ("8B-like", 32, 4096, 4),
        ("70B-like", 80, 8192, 30),
        ("405B-like", 126, 16384, 100),
    ]:
        with tempfile.TemporaryDirectory() as d:
            build(Path(d), layers, hidden, shards)
            bits_report(d)  # warm the page cache for the headers
            t0 = time.perf_counter()
            n = 5
            for _ in range(n):
                r = bits_report(d)
            ms = 1000 * (time.perf_counter() - t0) / n
            print(
                f"{label:<22}{r.file_bytes:>20,}{r.header_bytes_read:>20,}"
                f"{r.header_bytes_read / r.file_bytes:>12.2e}{ms:>16.1f}"
            )


if __name__ == "__main__":
    main()
