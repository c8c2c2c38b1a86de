"""Whether llama.cpp's scores move with the CPU kernels its build compiled in: the same GGUF scored by `quantize eval`
under two builds of the same llama-cpp-python version, same threads and decode chunk, each into an empty score
cache of its own (nothing served across).

    python benchmarks/llamacpp_kernels.py OTHER_BUILD [...] [--gguf FILE] [--suite evaluate/smoke.yaml] [--json OUT]

OTHER_BUILD: a folder holding another build of llama-cpp-python (`pip install --no-cache-dir --no-deps --target
OTHER_BUILD llama-cpp-python==VERSION` with other CMAKE_ARGS, e.g. -DGGML_AVX2=OFF -DGGML_FMA=OFF
-DGGML_LLAMAFILE=OFF; without --no-cache-dir pip installs the wheel it built before, whatever the CMAKE_ARGS now),
put first on PYTHONPATH for its run. Per task (server_samples.compare): the items whose answer differs (right/wrong
items) and the largest |Δ log-likelihood| of any choice or document; each build's `llama_print_system_info()`
(the CPU features its ggml backend uses) and digest (machine.build_identity).

Measured (2026-12-07, the 2-core AMD EPYC, the default model's Q4_1 GGUF, evaluate/smoke.yaml): a build without
AVX2, FMA and llamafile's matmuls against `make gguf-env`'s moved choices by up to 0.41 nats and documents by up to
1.88, and one key-value answer (benchmarks/results/llamacpp_kernels.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_samples import compare  # benchmarks/: per task, answers that differ and the largest |Δ ll|

from quantize import records
from quantize.machine import cpu_kernels
from quantize.records import ScoreDoc

ROOT = Path(__file__).resolve().parent.parent


def scored(suite: str, gguf: Path, pythonpath: str | None) -> tuple[ScoreDoc, str]:
    """`quantize eval --json --items` under a fresh cache, with `pythonpath` first, read as its typed record; and that
    build's system info."""
    env = {**os.environ, "QUANTIZE_CACHE": tempfile.mkdtemp(prefix="llamacpp-kernels-")}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (pythonpath, env.get("PYTHONPATH")) if x)
    probe = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    info = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    info = info.stdout.strip()
    exe = str(Path(sys.executable).with_name("quantize"))
    done = subprocess.run([exe, "eval", suite, str(gguf), "--json", "--items", "-q"], env=env, capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip
    if done.returncode:
        sys.exit(f"quantize eval failed ({done.returncode}): {done.stderr[-2000:]}")
    return records.loads(ScoreDoc, done.stdout.encode(), Path("quantize eval --json --items")), info


def main() -> None:
    from quantize.checkpoint.loader import find_gguf
    from quantize.machine import build_identity, llamacpp_build

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("others", type=Path, nargs="+", metavar="OTHER_BUILD")
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--suite", default="evaluate/smoke.yaml")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "llamacpp_kernels.json")
    args = ap.parse_args()
    gguf = args.gguf or find_gguf()
    base, base_info = scored(args.suite, gguf, None)
    builds = []
    for folder in args.others:
        other, info = scored(args.suite, gguf, str(folder))
        tasks = compare(base, other)
        builds.append({"folder": str(folder), "build": build_identity(folder / "llama_cpp" / "lib"),
                       "system_info": info, "tasks": tasks})  # fmt: skip
        print(folder, info)
        for task, row in tasks.items():
            print(" ", task, json.dumps(row))
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": cpu_kernels(),
        "gguf": gguf.name,
        "suite": args.suite,
        "engine": base.provenance.engine,
        "installed_build": {"build": llamacpp_build(), "system_info": base_info},
        "other_builds": builds,
    }
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print("installed:", llamacpp_build(), base_info)
    print(f"wrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
