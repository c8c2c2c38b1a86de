"""How far an AWQ (GEMM) checkpoint's own weights are from its source, read without any loader.

AWQ scales each input channel of a linear by s and divides the norm before it by s, so the stored weights alone
cannot be compared with the source's; their product with the norm can. For the q_proj of a few layers:

    relative error = ||W_q ⊙ γ_q − W ⊙ γ|| / ||W ⊙ γ||,   W (out, in), γ (in,) the input_layernorm weight,

with W_q dequantized by AutoAWQ's own unpacker (awq.utils.packing_utils.dequantize_gemm). Used on the backends
table's AutoAWQ row: it separates a bad checkpoint from a bad loader. Runs where autoawq is installed:

    /tmp/venv-ag/bin/python benchmarks/awq_effective_error.py SOURCE CHECKPOINT [CHECKPOINT ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LAYERS = (0, 10, 29)


def main() -> None:
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors import safe_open

    source, *checkpoints = (Path(a) for a in sys.argv[1:])
    for ckpt in checkpoints:
        cfg = json.loads((ckpt / "config.json").read_text())["quantization_config"]
        errors = {}
        with (
            safe_open(str(ckpt / "model.safetensors"), "pt") as q,
            safe_open(str(source / "model.safetensors"), "pt") as s,
        ):
            for layer in LAYERS:
                name = f"model.layers.{layer}.self_attn.q_proj"
                w = dequantize_gemm(
                    q.get_tensor(f"{name}.qweight"),
                    q.get_tensor(f"{name}.qzeros"),
                    q.get_tensor(f"{name}.scales"),
                    cfg["bits"],
                    cfg["group_size"],
                ).T.float()  # (out, in)
                norm = f"model.layers.{layer}.input_layernorm.weight"
                ref = s.get_tensor(f"{name}.weight").float() * s.get_tensor(norm).float()
                errors[layer] = round(((w * q.get_tensor(norm).float() - ref).norm() / ref.norm()).item(), 4)
        print(json.dumps({"checkpoint": str(ckpt), "q_proj_relative_error_by_layer": errors}))


if __name__ == "__main__":
    main()
