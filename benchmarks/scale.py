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
import shutil
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
# calibrated, through the offloaded path (--gptq): the builtin text through the checkpoint's word-level tokenizer
GPTQ = {
    "method": "gptq",
    "scheme": "W4A16",
    "group_size": 128,
    "ignore": ["lm_head"],
    "calibration": {"source": "builtin:jargon", "samples": 8, "seq_len": 128, "seed": 0},
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


CHUNK = 1 << 24  # elements generated at once for a large tensor (64 MiB of float32)


def _random_bf16_chunks(shape: list[int], rng):
    """A tensor's bytes in row chunks of about CHUNK elements, so a 1 GB weight never sits whole in memory. A
    numpy Generator gives the same bytes as _random_bf16 (its draws are sequential); a torch.Generator (--torch-rng,
    about 4x faster on this CPU, for the tens-of-GB sources) draws Normal(0, 0.02) directly in bf16."""
    if (len(shape) == 1 or shape[0] * shape[1] <= CHUNK) and not hasattr(rng, "manual_seed"):
        yield _random_bf16(shape, rng)
        return
    rows = max(1, CHUNK // shape[-1]) if len(shape) > 1 else shape[0]
    for i in range(0, shape[0], rows):
        part = [min(rows, shape[0] - i), *shape[1:]]
        if hasattr(rng, "manual_seed"):
            import torch

            if len(part) == 1:
                yield torch.ones(part, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
                continue
            x = torch.randn(part, generator=rng, dtype=torch.bfloat16).mul_(0.02)
            yield x.view(torch.int16).numpy().tobytes()
        else:
            yield _random_bf16(part, rng)


def write_shard(path: Path, tensors: list[tuple[str, list[int]]], rng=None, sparse: bool = False) -> int:
    """One safetensors file, tensor by tensor and large tensors in row chunks (BF16): random data, or with `sparse`
    only the header in a file truncated to its full size. Returns the bytes of its tensors."""
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
                for chunk in _random_bf16_chunks(shape, rng):
                    f.write(chunk)
    return offset


def write_llama(
    path: Path,
    s: Shape,
    layers: int,
    layers_per_shard: int = 1,
    seed: int = 0,
    sparse: bool = False,
    torch_rng: bool = False,
) -> Path:
    """A Llama checkpoint (config.json, shards with an index when there are several, a word-level tokenizer
    unless `sparse`), written shard by shard."""
    if torch_rng:
        import torch

        rng = torch.Generator().manual_seed(seed)
    else:
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


def run_polled(cmd: list[str], env: dict, nice: int = 0, every: float = 0.2) -> tuple[int, str, str, int]:
    """A child process with the summed RSS of its whole process tree polled every `every` seconds (psutil): its
    return code, stdout, stderr and the tree's peak RSS in bytes (a poll can miss a peak shorter than `every`;
    the child's own VmHWM, in its quantize.json, cannot)."""
    import psutil

    nice = max(0, nice - os.nice(0))  # `nice` is the child's niceness, not an increment on this process's own
    with open(os.devnull, "rb") as devnull:
        child = subprocess.Popen(
            ["nice", "-n", str(nice), *cmd] if nice else cmd,
            env=env,
            stdin=devnull,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    import threading

    peak = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal peak
        proc = psutil.Process(child.pid)
        while not stop.is_set():
            try:
                tree = [proc, *proc.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            stop.wait(every)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    out, err = child.communicate()
    stop.set()
    t.join()
    return child.returncode, out, err, peak


def convert(model: Path, out: Path, recipe: dict, streaming: str, nice: int = 0, max_memory: str | None = None) -> dict:
    """`quantize run` in a child process; its wall time, its quantize.json's peak RSS (the child's VmHWM) and the
    process tree's polled peak RSS. `streaming` is the recipe's streaming: (on, off), or for a calibrated recipe
    "offload-on"/"offload-off", its offload:. `max_memory`: run's --max-memory (the plan's budget)."""
    import yaml

    rfile = out.parent / f"{out.name}.yaml"
    setting = {"offload": streaming.split("-")[1]} if streaming.startswith("offload-") else {"streaming": streaming}
    rfile.write_text(yaml.safe_dump({"name": out.name, "model": str(model), "output": str(out), **recipe, **setting}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    rc, _, err, tree_peak = run_polled(
        [
            sys.executable,
            "-m",
            "quantize.cli",
            "run",
            str(rfile),
            "--quiet",
            "--force",
            *(["--max-memory", max_memory] if max_memory else []),
        ],
        env,
        nice,
    )
    wall = time.perf_counter() - t0
    if rc:
        raise SystemExit(f"quantize run {rfile} failed ({rc}): {err[-2000:]}")
    meta = json.loads((out / "quantize.json").read_text())
    read = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    written = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return {
        "path": meta["memory_plan"]["path"],
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(meta["memory"]["peak_rss_bytes"] / 2**20, 1),
        "tree_peak_rss_mib": round(tree_peak / 2**20, 1),
        "phases_s": {k: round(v, 1) for k, v in meta["time_seconds"].items()},
        "bits_per_weight": meta["bits"]["bits_per_weight"],
        "quantized_linear_bits_per_weight": meta["bits"]["quantized_linear_bits_per_weight"],
        "finite_checks": [c["stage"] for c in meta["finite_checks"]],
        "read_mb_s": round(read / 1e6 / wall, 2),
        "written_mb_s": round(written / 1e6 / wall, 2),
        "source_mib": round(read / 2**20, 2),
        "output_mib": round(written / 2**20, 2),
        "reload": meta["memory_plan"]["reload"],
    }


def disk_speed(work: Path, mib: int = 2048) -> dict:
    """The disk's sequential write and read speed under `work`, measured once with dd (write with fdatasync, read
    with O_DIRECT past the page cache), in MB/s; the file is removed."""
    f = work / "dd-probe.bin"
    work.mkdir(parents=True, exist_ok=True)
    speeds = {}
    for what, cmd in (
        ("write_mb_s", ["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={mib}", "conv=fdatasync"]),
        ("read_mb_s", ["dd", f"if={f}", "of=/dev/null", "bs=1M", "iflag=direct"]),
    ):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        speeds[what] = round(mib * 2**20 / 1e6 / (time.perf_counter() - t0), 1)
    f.unlink()
    return speeds


def expected_linear_bits(s: Shape, recipe: str) -> float:
    """The quantized Linears' bits per weight that the format's definition gives for this shape, to hold the
    headers' figure against: FP8 dynamic one bf16 scale per output row; NVFP4A16 one E4M3 scale per 16 weights
    and one float32 global scale per weight."""
    shapes = [sh for name, sh in layer_tensors(0, s) if len(sh) == 2]
    weights = sum(o * i for o, i in shapes)
    if recipe == "fp8-dynamic":
        return sum(o * i * 8 + o * 16 for o, i in shapes) / weights
    return sum(o * i * 4 + o * i // 16 * 8 + 32 for o, i in shapes) / weights


def cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "quantize.cli", *args], env=env, capture_output=True, text=True)
    return done.stdout + done.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=Path("/tmp/quantize-scale"))
    ap.add_argument("--in-memory", action="store_true", help="also convert on the in-memory path (streaming: off)")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument(
        "--gptq",
        nargs="+",
        choices=["on", "off"],
        help="GPTQ W4A16 (calibrated) with offload: on and/or off, instead of the data-free recipes",
    )
    ap.add_argument("--torch-rng", action="store_true", help="draw the weights with torch (faster; other bytes)")
    ap.add_argument("--nice", type=int, default=0, help="run the conversions at niceness N (not added to this one's)")
    ap.add_argument("--disk", action="store_true", help="measure the disk's speed with dd once, first")
    ap.add_argument(
        "--big",
        action="store_true",
        help="for sources bigger than memory: print quantize inspect and cost --checkpoint for each output, delete "
        "each output once measured and each source once converted (so one source and one output at most on disk)",
    )
    ap.add_argument(
        "--max-memory",
        help="quantize run's --max-memory (e.g. 660MiB): the plan's budget, which decides whether the output's full "
        "reload check is planned in (it fits) or the output is checked tensor by tensor",
    )
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "scale")
    args = ap.parse_args()
    s = Shape(
        hidden=args.hidden, intermediate=args.intermediate, heads=args.heads, kv_heads=args.kv_heads, vocab=args.vocab
    )
    disk = disk_speed(args.work) if args.disk else None
    if disk:
        print(json.dumps({"disk": disk}), flush=True)
    rows, texts = [], []
    for depth in args.depths:
        t0 = time.perf_counter()
        model = write_llama(args.work / f"llama-{depth}", s, depth, torch_rng=args.torch_rng)
        src_bytes = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        print(json.dumps({"depth": depth, "source_bytes": src_bytes, "write_s": round(time.perf_counter() - t0, 1)}))
        runs = [(r, m) for r in args.recipes for m in (["on", "off"] if args.in_memory else ["on"])]
        if args.gptq:
            runs = [("gptq-w4a16", f"offload-{m}") for m in args.gptq]
        for rname, streaming in runs:
            out = args.work / f"{rname}-{depth}-{streaming}"
            r = convert(model, out, GPTQ if args.gptq else RECIPES[rname], streaming, args.nice, args.max_memory)
            if not args.gptq:
                r["expected_linear_bits"] = round(expected_linear_bits(s, rname), 6)
            rows.append({"depth": depth, "recipe": rname, **r})
            print(json.dumps(rows[-1]), flush=True)
            if args.big:
                texts.append(f"## {rname}, {depth} layers\n\n$ quantize inspect\n{cli('inspect', str(out))}")
                texts.append(f"$ quantize cost --checkpoint\n{cli('cost', '--checkpoint', str(out))}")
                print(texts[-2] + texts[-1], flush=True)
                shutil.rmtree(out)
        if args.big:
            shutil.rmtree(model)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.with_suffix(".json").write_text(
        json.dumps(
            {"shape": s.__dict__, "cpu": cpu, "disk": disk, "max_memory": args.max_memory, "rows": rows}, indent=2
        )
        + "\n"
    )
    if texts:
        args.results.with_suffix(".txt").write_text("\n".join(texts))
    head = (
        "| depth | recipe | path | source (MiB) | output (MiB) | wall (s) | peak RSS (MiB) | tree peak RSS (MiB) "
        "| read MB/s | written MB/s | reload check |"
    )
    budget = f"; --max-memory {args.max_memory}" if args.max_memory else ""
    lines = [f"Measured on {cpu}; shape {s.__dict__}; disk {disk}{budget}.", "", head, "|" + "---|" * 11]
    lines += [
        f"| {r['depth']} | {r['recipe']} | {r['path']} | {r['source_mib']} | {r['output_mib']} | {r['wall_s']} | "
        f"{r['peak_rss_mib']} | {r['tree_peak_rss_mib']} | {r['read_mb_s']} | {r['written_mb_s']} | {r['reload']} |"
        for r in rows
    ]
    args.results.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
