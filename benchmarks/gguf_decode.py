"""llama.cpp's measured batch-1 decode speed on this machine beside `quantize cost`'s bytes bound for it.

The decode bounds are computed, never measured (a step cannot be faster than reading its bytes at the memory's
bandwidth). Here each GGUF of the default model (its own Q4_1, the BF16 and the types of --types made from it by
llama.cpp's quantizer) is loaded in llama.cpp with THREADS threads, a fixed PROMPT-token prompt is decoded, then GEN
tokens are generated one at a time (greedy, each its own decode call: batch 1); the time per generated token, the
best of REPEATS runs, stands beside `quantize cost --checkpoint GGUF --hardware local --batch 1` at the mean context
of the generation (weights plus KV cache read per step, divided by this machine's measured read bandwidth:
quantize/cost/local.py). The share of the bound a format reaches is bound / measured.

Run it on an otherwise idle machine (another job halves both figures); rows go to
benchmarks/results/gguf_decode.json and the table is printed. Needs `make model` and `make gguf-env`.

    python benchmarks/gguf_decode.py [--types Q8_0 Q4_K_M IQ4_XS]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = ROOT / "benchmarks" / "results" / "gguf_decode.json"
THREADS = 2
PROMPT = 64
GEN = 128
REPEATS = 3


def decode_ms(gguf: Path) -> float:
    """Milliseconds per generated token at batch 1 (module docstring), the best of REPEATS."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf),
        n_ctx=PROMPT + GEN + 8,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,  # the logits of each step, to take its argmax (one row a step: its cost is the copy)
        verbose=False,
    )
    try:
        prompt = llm.tokenize(b"The history of the city begins " * 16, add_bos=True)[:PROMPT]
        best = float("inf")
        for _ in range(REPEATS):
            llm.reset()
            llm.eval(prompt)
            t0 = time.perf_counter()
            for _ in range(GEN):
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                llm.eval([tok])
            best = min(best, (time.perf_counter() - t0) / GEN * 1e3)
        return best
    finally:
        llm.close()


def bound_ms(gguf: Path) -> tuple[float, dict]:
    from quantize import api
    from quantize.cost.bounds import Workload

    cost = api.decode_cost(gguf, hardware="local", workload=Workload(context_tokens=PROMPT + GEN // 2, batch=1))
    return cost.formats["measured"].batch1_step_bound_ms, cost.hardware.model_dump()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="*", default=["Q8_0", "Q4_K_M", "IQ4_XS"])
    args = ap.parse_args()
    from gguf_gates import WORK, requantize

    from quantize.checkpoint.accounting import bits_report
    from quantize.checkpoint.loader import find_gguf

    source = find_gguf()
    bf16 = requantize(source, WORK / "bf16" / "model.gguf", "BF16")
    files = {"Q4_1 (the default model's own)": source, "BF16": bf16}
    files |= {t: requantize(bf16, WORK / t.lower() / "model.gguf", t) for t in args.types}
    rows = []
    for name, gguf in files.items():
        bound, hardware = bound_ms(gguf)
        measured = decode_ms(gguf)
        bits = bits_report(gguf)
        rows.append(
            {
                "file": name,
                "bytes": bits.total_bytes,
                "bits_per_weight": round(bits.bits_per_weight, 3),
                "measured_ms_per_token": round(measured, 3),
                "tokens_per_second": round(1e3 / measured, 1),
                "bound_ms_per_token": round(bound, 3),
                "share_of_bound": round(bound / measured, 3),
            }
        )
        print(f"{name:32s} {rows[-1]}", flush=True)
    out = {"threads": THREADS, "prompt": PROMPT, "generated": GEN, "repeats": REPEATS, "hardware": hardware}
    out["rows"] = rows
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
