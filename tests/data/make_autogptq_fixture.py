"""Writes tests/data/autogptq-tiny/: a GPTQ checkpoint made by AutoGPTQ 0.7.1 (retired upstream; the Hub holds
many checkpoints it wrote), for tests/checkpoint/test_foreign.py. AutoGPTQ cannot live in any of the project's
environments (it needs transformers 4.x and numpy < 2), so it gets a throwaway one, and the source model comes
from the core environment (the tests rebuild the same tiny seeded Llama as the gate's baseline):

    .venv/bin/python -c 'import sys; sys.path.insert(0, "tests"); from pathlib import Path; \
        from conftest import make_tiny_llama; make_tiny_llama(Path("/tmp/tiny-512"), seed=0, vocab_size=512)'
    python3 -m venv /tmp/venv-ag && /tmp/venv-ag/bin/pip install torch==2.13.0 && /tmp/venv-ag/bin/pip install \
        auto-gptq==0.7.1 transformers==4.46.3 "numpy<2" "pyarrow<18" peft==0.13.2 accelerate==1.1.1 "datasets<3"
    /tmp/venv-ag/bin/python tests/data/make_autogptq_fixture.py /tmp/tiny-512

4-bit, group 64, asymmetric, no act-order, on the first 32 texts of quantize/data/jargon-calibration.jsonl, as the
GPTQModel fixture. AutoGPTQ 0.7.1 quantizes only on CUDA (its from_pretrained refuses without it and every layer
is moved to CUDA_0): on this CPU-only machine the script points CUDA_0 at the CPU and makes the CUDA
synchronisation calls no-ops; the GPTQ arithmetic and the packing are AutoGPTQ's own. What it writes is what its
users have: the weights under the legacy name gptq_model-4bit-64g.safetensors, quantize_config.json, the settings
also in config.json, a float16 zero bias for every quantized linear, and lm_head stored although the model ties it
to the embeddings. AutoGPTQ saves no tokenizer; the source model's is copied, as its users do with
tokenizer.save_pretrained.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main(src: Path) -> None:
    import auto_gptq.modeling._base as base
    from auto_gptq import AutoGPTQForCausalLM, BaseQuantizeConfig
    from transformers import PreTrainedTokenizerFast

    base.CUDA_0 = torch.device("cpu")
    torch.cuda.empty_cache = lambda: None
    torch.cuda.synchronize = lambda *a, **k: None
    calib = HERE.parents[1] / "quantize" / "data" / "jargon-calibration.jsonl"
    texts = [json.loads(line)["text"] for line in calib.read_text().splitlines()[:32]]
    # transformers 4.46 cannot read the tokenizer_config.json transformers 5 wrote; tokenizer.json it can
    tok = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"))
    available, torch.cuda.is_available = torch.cuda.is_available, lambda: True
    try:
        model = AutoGPTQForCausalLM.from_pretrained(
            str(src), BaseQuantizeConfig(bits=4, group_size=64, desc_act=False, sym=False)
        )
    finally:
        torch.cuda.is_available = available
    model.quantize([tok(t) for t in texts], batch_size=1)
    out = HERE / "autogptq-tiny"
    shutil.rmtree(out, ignore_errors=True)
    model.save_quantized(str(out), use_safetensors=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, out / f)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
