"""What the gate's background read of Hub blobs costs (quantize/checkpoint/files.py `BlobCheck`).

    python benchmarks/blob_check.py [--model DIR] [--runs 2] [--out benchmarks/results/blob_check.json]

1. sha256 throughput of the model's weights file on this machine, the file in the page cache (one thread).
2. `quantize gate` wall time with the check and without it, on the default model laid out as a Hugging Face cache
   snapshot (models--ORG--NAME/snapshots/REV -> blobs/SHA), one A/A gate on core_facts' 8 smoke items with an
   accuracy rule: the baseline's scores cached by a first run, the candidate scored in every run (as the gate now always
   does). Runs alternate with/without; "without" replaces BlobCheck by one that checks nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def hub_layout(model: Path, root: Path) -> Path:
    from quantize.io import sha256_file

    repo = root / "models--bench--model"
    snap = repo / "snapshots" / ("ab" * 20)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in model.iterdir():
        if f.is_file() and f.suffix != ".sha256" and f.name != "SOURCE.json":
            name = sha256_file(f) if f.suffix == ".safetensors" else sha256_file(f)[:40]
            shutil.copyfile(f, repo / "blobs" / name)
            (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / name)
    return snap


def main() -> None:
    from quantize.checkpoint.loader import default_model_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=default_model_dir())
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "blob_check.json")
    args = ap.parse_args()

    from quantize.checkpoint import files
    from quantize.flows import gate as gate_flow
    from quantize.io import sha256_file

    weights = args.model / "model.safetensors"
    size = weights.stat().st_size
    sha256_file(weights)  # into the page cache
    hash_s = []
    for _ in range(3):
        t0 = time.perf_counter()
        sha256_file(weights)
        hash_s.append(time.perf_counter() - t0)

    with tempfile.TemporaryDirectory(prefix="blob-check-") as tmp:
        os.environ["QUANTIZE_CACHE"] = str(Path(tmp) / "cache")
        snap = hub_layout(args.model, Path(tmp) / "hub")
        suite, policy = Path(tmp) / "suite.yaml", Path(tmp) / "policy.yaml"
        suite.write_text(
            f"golden: {ROOT / 'golden' / 'core' / 'v1'}\nsubset: smoke\ntasks: [core_facts]\nbatch_size: 8\n"
        )
        policy.write_text(
            f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n"
        )

        class Off:
            def __init__(self, _checkpoints: list[Path]) -> None:
                pass

            def wait(self) -> None:
                pass

        checks: list[files.BlobCheck] = []
        real = gate_flow.BlobCheck

        def on(cps: list[Path]) -> files.BlobCheck:
            checks.append(real(cps))
            return checks[-1]

        gate_flow.run_gate(policy, snap, snap)  # the baseline's scores into the cache
        walls: dict[str, list[float]] = {"with": [], "without": []}
        for _ in range(args.runs):
            for mode, cls in (("with", on), ("without", Off)):
                gate_flow.BlobCheck = cls  # type: ignore[assignment,misc]
                files._blob_sha256.cache_clear()  # noqa: SLF001 - each run reads the blob, as a new process would
                t0 = time.perf_counter()
                v = gate_flow.run_gate(policy, snap, snap)
                walls[mode].append(time.perf_counter() - t0)
                assert v.provenance.candidate_scores == "computed"
        gate_flow.BlobCheck = real  # type: ignore[misc]

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    result = {
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0]},
        "weights_bytes": size,
        "sha256_seconds": [round(s, 3) for s in hash_s],
        "sha256_mb_per_s": round(size / 1e6 / statistics.median(hash_s), 1),
        "gate_seconds": {k: [round(x, 2) for x in v] for k, v in walls.items()},
        "gate_median_seconds": {k: round(statistics.median(v), 2) for k, v in walls.items()},
        "check_seconds_in_thread": [round(c.seconds, 3) for c in checks],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
