"""Writes tests/data/gptqmodel-tiny/ (GPTQ) and tests/data/gptqmodel-awq-tiny/ (AWQ, GEMM layout): checkpoints made
by GPTQModel itself, for the tests that consume other tools' formats (tests/checkpoint/test_foreign.py). Run once in
the GPTQ environment (`make gptq-env`):

    GPTQMODEL_CPU_WORKERS=2 .venv-gptq/bin/python tests/data/make_gptqmodel_fixture.py [NAME ...]

(NAME: gptqmodel-tiny or gptqmodel-awq-tiny; none: both). The source is tests/conftest.py's tiny seeded
Llama with a 512-word vocabulary
(make_tiny_llama(seed=0, vocab_size=512)), which the tests rebuild as the gate's baseline; 4-bit, group 64,
asymmetric, no act-order, on the first 32 texts of quantize/data/jargon-calibration.jsonl. GPTQModel 7.6.0 on a CPU
writes the integrated layout (config.json quantization_config, model.safetensors) plus its quantize_config.json.
Its AWQ path asks for CUDA unless the torch kernel is named (BACKEND.AWQ_TORCH); the GEMM layout it then writes is
AutoAWQ's (qweight/qzeros int32 packed along the output features, scales (in/group, out) in float16).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from conftest import make_tiny_llama  # noqa: E402


def write(name: str, texts: list[str], src: Path) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.quantization import FORMAT, METHOD
    from gptqmodel.utils.backend import BACKEND

    common = dict(bits=4, group_size=64, sym=False, desc_act=False)
    if name == "gptqmodel-awq-tiny":
        qcfg, backend = QuantizeConfig(**common, quant_method=METHOD.AWQ, format=FORMAT.GEMM), BACKEND.AWQ_TORCH
    else:
        qcfg, backend = QuantizeConfig(**common), BACKEND.AUTO
    model = GPTQModel.load(str(src), qcfg)
    model.quantize(texts, batch_size=1, backend=backend)
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    model.save(str(out))
    (out / "quant_log.csv").unlink(missing_ok=True)  # GPTQModel's per-layer log: not part of the checkpoint
    print(f"wrote {out}")


def main(names: list[str]) -> None:
    calib = HERE.parents[1] / "quantize" / "data" / "jargon-calibration.jsonl"
    texts = [json.loads(line)["text"] for line in calib.read_text().splitlines()[:32]]
    with tempfile.TemporaryDirectory() as tmp:
        src = make_tiny_llama(Path(tmp) / "tiny", seed=0, vocab_size=512)
        for name in names or ["gptqmodel-tiny", "gptqmodel-awq-tiny"]:
            write(name, texts, src)


if __name__ == "__main__":
    main(sys.argv[1:])
