"""Issue 41's bad inputs through the CLI, each in a fresh process: its exit code, wall time and peak RSS (the child's
VmHWM through wait4's ru_maxrss), against the promise of exit 2 in under 2 s and under 500 MB.

    python benchmarks/integrity_refusals.py [--out benchmarks/results/integrity_refusals.json]

Builds what it needs in a temporary folder (a FIFO, a 60,000-entry sweep, a safetensors header with `__metadata__:
[]`, recipes with names that are no folder name, a golden set with a bad item line); no model is loaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def header_file(path: Path, metadata: object) -> None:
    header = {"__metadata__": metadata, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)


def cases(d: Path) -> dict[str, list[str]]:
    fifo = d / "items.fifo"
    os.mkfifo(fifo)
    big = d / "big-sweep.yaml"
    big.write_text("recipes:\n" + "".join(f"  - r{i}.yaml\n" for i in range(60_000)) + "policy: gates/ci.yaml\n")
    ckpt = d / "meta-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    header_file(ckpt / "model.safetensors", [])
    up = d / "up.yaml"
    up.write_text("name: ../UP\nmethod: rtn\nscheme: W8A16\n")
    surrogate = d / "surrogate.yaml"
    surrogate.write_text('name: "a\\ud800"\nmethod: rtn\nscheme: W8A16\n')
    address = d / "address.yaml"
    address.write_text(f"recipes: [{ROOT / 'recipes' / 'fp8-e4m3.yaml'}]\npolicy: gates/ci.yaml\n")
    address.write_text(address.read_text() + 'cluster: {address: "local\\n"}\n')
    golden = d / "golden" / "v1"
    shutil.copytree(ROOT / "golden" / "answers" / "v1", golden)
    data = next((golden / "data").glob("*.jsonl"))
    lines = data.read_text().splitlines()
    data.write_text("\n".join(["not json", *lines[1:]]) + "\n")
    manifest = json.loads((golden / "MANIFEST.json").read_text())  # resealed: the item check, not the hash, refuses
    for name, entry in manifest["files"].items():
        blob = (golden / name).read_bytes()
        entry["sha256"] = hashlib.sha256(blob).hexdigest()
    (golden / "MANIFEST.json").write_text(json.dumps(manifest))
    return {
        "golden new --from FIFO": ["golden", "new", str(d / "new" / "v1"), "--from", str(fifo), "--type", "greedy"],
        "card --verdict FIFO": ["card", str(ckpt), "--verdict", str(fifo)],
        "card --verdict /dev/zero": ["card", str(ckpt), "--verdict", "/dev/zero"],
        "golden new --from /dev/zero": ["golden", "new", str(d / "z"), "--from", "/dev/zero", "--type", "greedy"],
        "sweep of 60,000 recipes": ["sweep", str(big)],
        "__metadata__: [] (inspect)": ["inspect", str(ckpt)],
        "__metadata__: [] (eval)": ["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(ckpt)],
        "recipe name ../UP": ["run", str(up)],
        "recipe name with a lone surrogate": ["run", str(surrogate)],
        'cluster.address "local\\n"': ["sweep", str(address)],
        "golden verify: a line that is not JSON": ["golden", "verify", str(golden)],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "integrity_refusals.json"))
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="quantize-refusals-") as tmp:
        d = Path(tmp)
        for name, argv in cases(d).items():
            rows[name] = measure_with_rss(argv, d)
            r = rows[name]
            print(f"{name:42s} exit {r['exit']}  {r['seconds']:5.2f} s  {r['peak_mib']:6.1f} MiB  {r['message'][:90]}")
    result = {"cpu": cpu(), "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0], "cases": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def measure_with_rss(argv: list[str], cwd: Path) -> dict[str, object]:
    """Run one case; its exit, wall time, peak RSS (ru_maxrss of the child, from wait4) and last stderr line."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", "quantize.cli", *argv],
            os.environ | {"PYTHONPATH": str(ROOT)},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, err.fileno(), 2),
            ],
        )
        deadline = time.monotonic() + 60
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                done, status, usage = os.wait4(pid, 0)
                break
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "seconds": round(seconds, 2),
        "peak_mib": round(usage.ru_maxrss / 1024, 1),
        "message": " / ".join(line.strip() for line in lines)[:300],
    }


if __name__ == "__main__":
    main()
