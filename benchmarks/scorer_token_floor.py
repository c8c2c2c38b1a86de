"""How far computing each context once can cut a golden set's token work (issue 45's "1.5× faster" goal).

    python benchmarks/scorer_token_floor.py [--golden golden/core/v2] [--model ~/.cache/quantize/models/...]

Counts, per task of a core-style golden set (analogy, cloze, kv, facts: `context`/`question` and
`target`/`choices`; prose: `text`), the tokens lm-eval's stock HFLM runs through the model (one row, context +
continuation, per request; the requests of an item whose continuations are one token share a row, its logits
cache) against the tokens of each distinct context once plus every continuation (what our scorer runs, padding
aside). Their ratio bounds the speed-up any context sharing can give at equal cost per token. Tokens by the
model's own tokenizer, without special tokens; rolling perplexity documents count their length on both sides.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", type=Path, default=ROOT / "golden" / "core" / "v2")
    ap.add_argument("--model", type=Path, default=Path("~/.cache/quantize/models/SmolLM2-135M-Instruct").expanduser())
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)

    def n_tokens(s: str) -> int:
        return len(tok(s, add_special_tokens=False)["input_ids"])

    total_stock = total_once = 0
    for path in sorted((args.golden / "data").glob("*.jsonl")):
        stock = once = 0
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if "text" in r:  # a rolling document: the same windows either way
                stock += n_tokens(r["text"])
                once += n_tokens(r["text"])
                continue
            ctx = r.get("question", r.get("context"))
            conts = [" " + c for c in r["choices"]] if "choices" in r else [r["target"]]
            c = n_tokens(ctx)
            ks = [n_tokens(ctx + k) - c for k in conts]
            multi = [k for k in ks if k > 1]
            stock += sum(c + k for k in multi) + (c + 1 if len(multi) < len(ks) else 0)
            once += c + sum(ks)
        total_stock += stock
        total_once += once
        print(f"{path.stem}: stock {stock:,} tokens, each context once {once:,}, ratio {stock / once:.2f}")
    print(f"all: stock {total_stock:,}, each context once {total_once:,}: at most {total_stock / total_once:.2f}x")


if __name__ == "__main__":
    main()
