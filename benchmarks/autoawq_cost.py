"""What AutoAWQ 0.2.9 costs on this CPU: seconds per decoder layer of its AWQ search on the default model.

AutoAWQ (retired upstream; adopted by llm-compressor) needs transformers 4.x, so it runs in a throwaway
environment, not the project's:

    python3 -m venv /tmp/venv-ag && /tmp/venv-ag/bin/pip install torch==2.13.0 && /tmp/venv-ag/bin/pip install \
        transformers==4.51.3 "numpy<2" "pyarrow<18" accelerate==1.1.1 "datasets<3" zstandard && \
        /tmp/venv-ag/bin/pip install --no-deps autoawq==0.2.9
    /tmp/venv-ag/bin/python benchmarks/autoawq_cost.py "$(.venv/bin/quantize model path)" [--layers 3 | --save OUT]

As its users call it (AutoAWQForCausalLM.from_pretrained: float16 weights), 4-bit, group 64, zero point, GEMM,
on the calibration text of benchmarks/backends.py (the first 32 Jargon File calibration entries, split by AutoAWQ
into 32 windows of at most 256 tokens). AutoAWQ's per-layer loop is timed and stopped after --layers layers: the
whole model is then about num_hidden_layers × the mean (packing and saving not included). With --save, every layer
is quantized, packed and saved to OUT with AutoAWQ's save_quantized (plus the source's tokenizer files), as
benchmarks/backends.py's autoawq row does. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Enough(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--save", type=Path, help="quantize every layer and save the checkpoint here")
    args = ap.parse_args()
    import awq.quantize.quantizer as quantizer
    import torch
    from awq import AutoAWQForCausalLM
    from transformers import PreTrainedTokenizerFast

    times: list[float] = []

    def timed_layers(it, **_):
        t = time.perf_counter()
        for i in it:
            yield i
            times.append(time.perf_counter() - t)
            t = time.perf_counter()
            print(f"layer {i}: {times[-1]:.1f} s", flush=True)
            if args.save is None and len(times) >= args.layers:
                raise Enough

    quantizer.tqdm = timed_layers
    calib = ROOT / "quantize" / "data" / "jargon-calibration.jsonl"
    texts = [json.loads(line)["text"] for line in calib.read_text().splitlines()[:32]]
    # transformers 4.46 cannot read the tokenizer_config.json transformers 5 wrote; tokenizer.json it can
    tok = PreTrainedTokenizerFast(tokenizer_file=str(args.model / "tokenizer.json"))
    t0 = time.perf_counter()
    model = AutoAWQForCausalLM.from_pretrained(str(args.model))
    load = time.perf_counter() - t0
    cfg = {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"}
    with contextlib.suppress(Enough):
        model.quantize(tok, quant_config=cfg, calib_data=texts, max_calib_samples=32, max_calib_seq_len=256)
    if args.save is not None:
        import shutil

        model.save_quantized(str(args.save))
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (args.model / f).is_file():
                shutil.copy(args.model / f, args.save / f)
    n = model.model.config.num_hidden_layers
    mean = sum(times) / len(times)
    print(
        json.dumps(
            {
                "autoawq": "0.2.9",
                "dtype": str(next(model.model.parameters()).dtype),
                "threads": torch.get_num_threads(),
                "load_s": round(load, 1),
                "layer_s": [round(x, 1) for x in times],
                "layers": n,
                "projected_model_s": round(n * mean),
            }
        )
    )


if __name__ == "__main__":
    main()
