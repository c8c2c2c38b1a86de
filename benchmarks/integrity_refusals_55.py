"""Issue 55's reproduced cases through the CLI, each in a fresh process: exit code, wall time and peak RSS, against
the promise of exit 2 before any model loads (under 2 s where no torch-level check is needed).

    python benchmarks/integrity_refusals_55.py [--out benchmarks/results/integrity_refusals_55.json]

Builds tiny seeded models from transformers' own config classes (tests/conftest.py, tests/moe_models.py) and the
bad inputs in a temporary folder; nothing is downloaded. The SIGTERM case is measured by
tests/convert/test_calibration.py::test_a_signal_ends_a_run_blocked_on_a_fifo_within_seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def recipe(d: Path, name: str, model: Path, scheme: str = "FP8_DYNAMIC", **extra: object) -> Path:
    """A recipe on `model`; the calibration cases take static FP8 (a calibrated scheme that converts fast)."""
    body = {
        "name": name,
        "method": "fp8",
        "scheme": scheme,
        "model": str(model),
        "output": str(d / "out" / name),
    }
    body.update(extra)
    path = d / f"{name}.yaml"
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


def weights_cases(d: Path, tiny: Path) -> dict[str, list[str]]:
    from safetensors import safe_open

    from conftest import nan_copy

    suite = str(ROOT / "evaluate" / "smoke.yaml")
    both = shutil.copytree(tiny, d / "both")
    shard = "model-00001-of-00001.safetensors"
    (both / "model.safetensors").rename(both / shard)
    with safe_open(str(both / shard), "pt") as st:
        names = list(st.keys())
    (both / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))
    nan_copy(both / shard, both / "model.safetensors")
    adapter = shutil.copytree(tiny, d / "adapter")
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "lora_alpha": 1e6, "r": 2}))
    missing = shutil.copytree(both, d / "missing-tensor")
    (missing / "model.safetensors").unlink()
    index = json.loads((missing / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.mlp.not_there.weight"] = shard
    (missing / "model.safetensors.index.json").write_text(json.dumps(index))
    return {
        "model.safetensors beside an index (eval)": ["eval", suite, str(both)],
        "a PEFT adapter in the folder (eval)": ["eval", suite, str(adapter)],
        "an index naming a tensor no shard holds (run, streamed)": [
            "run",
            str(recipe(d, "missing", missing, calibration=None, streaming="on")),
        ],
        "an index naming a tensor no shard holds (eval)": ["eval", suite, str(missing)],
    }


def moe_cases(d: Path) -> dict[str, list[str]]:
    from moe_models import make_tiny_moe
    from safetensors.torch import load_file, save_file

    moe = make_tiny_moe(d / "moe", "qwen3_moe")
    broken = shutil.copytree(moe, d / "moe-missing-expert")
    tensors = load_file(str(broken / "model.safetensors"))
    gone = sorted(n for n in tensors if ".experts." in n)[0]
    del tensors[gone]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    return {
        "a clean Qwen3-MoE with streaming: on (run)": [
            "run",
            str(recipe(d, "moe", moe, calibration=None, streaming="on")),
        ],
        "an expert tensor missing (run)": ["run", str(recipe(d, "moe-missing", broken, calibration=None))],
        "an expert tensor missing (eval)": ["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(broken)],
    }


def calibration_cases(d: Path, tiny: Path) -> dict[str, list[str]]:
    from datasets import Dataset

    text = [{"text": "the hacker wrote the kernel and the compiler " * 8} for _ in range(16)]
    saved = d / "saved"
    Dataset.from_list(text).save_to_disk(str(saved))
    fifo = shutil.copytree(saved, d / "saved-fifo")
    arrow = next(fifo.glob("data-*.arrow"))
    arrow.unlink()
    os.mkfifo(arrow)
    forged = shutil.copytree(saved, d / "saved-forged")
    state = json.loads((forged / "state.json").read_text())
    state["_data_files"] = [{"filename": "/etc/hostname"}]
    (forged / "state.json").write_text(json.dumps(state))
    templated = shutil.copytree(tiny, d / "templated")
    (templated / "chat_template.jinja").write_text("{{ raise_exception('no system role') }}")
    chats = d / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n" for _ in range(8)))
    small = {"samples": 2, "seq_len": 16}
    mix = [{"source": str(saved), "weight": 1e308}, {"source": str(saved), "weight": 1e308}]
    return {
        "an arrow file that is a FIFO (run)": [
            "run",
            str(recipe(d, "fifo", tiny, "FP8", calibration={**small, "source": str(fifo)})),
        ],
        "state.json naming /etc/hostname (run)": [
            "run",
            str(recipe(d, "forged", tiny, "FP8", calibration={**small, "source": str(forged)})),
        ],
        "a chat template that raises (run)": [
            "run",
            str(recipe(d, "template", templated, "FP8", calibration={**small, "source": str(chats)})),
        ],
        "mixture weights summing to inf (run)": [
            "run",
            str(recipe(d, "mix", tiny, "FP8", calibration={**small, "mixture": mix})),
        ],
    }


def build(d: Path) -> None:
    from conftest import make_tiny_llama

    tiny = make_tiny_llama(d / "tiny")
    cases = weights_cases(d, tiny) | moe_cases(d) | calibration_cases(d, tiny)
    (d / "cases.json").write_text(json.dumps(cases))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "integrity_refusals_55.json"))
    ap.add_argument("--build", help=argparse.SUPPRESS)  # the models and inputs, built in a child (torch loaded there)
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]  # the tests' model builders, issue 41's measure
    if args.build:
        build(Path(args.build))
        return
    from integrity_refusals import cpu, measure_with_rss

    rows = {}
    with tempfile.TemporaryDirectory(prefix="quantize-refusals-55-") as tmp:
        d = Path(tmp)
        # built in a child, so that this process never loads torch: a child's ru_maxrss counts its parent's
        # resident pages at the spawn (they survive exec), which would put torch's 500 MB in every case's peak
        subprocess.run([sys.executable, __file__, "--build", str(d)], check=True, stderr=subprocess.DEVNULL)
        cases = json.loads((d / "cases.json").read_text())
        for name, argv in cases.items():
            rows[name] = r = measure_with_rss(argv, d)
            print(f"{name:58s} exit {r['exit']}  {r['seconds']:5.2f} s  {r['peak_mib']:6.1f} MiB  {r['message'][:80]}")
    load = os.getloadavg()[0]
    result = {"cpu": cpu(), "date": time.strftime("%Y-%m-%d"), "load_average_1min": round(load, 2), "cases": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} (load average {load:.1f})")


if __name__ == "__main__":
    main()
