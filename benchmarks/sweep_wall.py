"""`quantize sweep sweeps/default.yaml` against the same candidates one after the other, on this machine, in one run.

    python benchmarks/sweep_wall.py [--sweep sweeps/default.yaml] [--only sequential|sweep] [--json OUT]

Each side starts from nothing but the default model: its own empty score cache (the model folder copied in) and
its own empty output folder, so each converts every recipe, scores the baseline in full once and gates every
candidate with the sweep's policy.
- one after the other: what `make gate-all` does, as commands: `quantize run` for each recipe, then
  `quantize gate POLICY --baseline MODEL --candidate OUT --junit --json` for each output, then `quantize report`,
  in one process each (torch at its default threads: all cores);
- the sweep: `quantize sweep` on a copy of the sweep file writing to its own output folder (a local cluster; the
  file's resources say how many tasks share the cores and at how many threads).
Prints both wall times, their ratio and every verdict (the two sides must agree), and writes them (--json).
Nothing else may run meanwhile: two torch jobs on 2 cores are several times slower than one after the other.
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

import yaml

ROOT = Path(__file__).resolve().parent.parent
Q = str(Path(sys.executable).parent / "quantize")


def fresh_cache(root: Path) -> dict[str, str]:
    """An empty cache holding only the default model (copied, so no score or identity memo is shared)."""
    from quantize.checkpoint.loader import default_model_dir

    cache = root / "cache"
    shutil.copytree(default_model_dir(), cache / "models" / default_model_dir().name)
    return os.environ | {"QUANTIZE_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def verdicts(out: Path) -> dict[str, str]:
    from quantize import records
    from quantize.records import Verdict

    return {f.parent.name: records.read(Verdict, f).verdict for f in sorted(out.glob("*/gate.json"))}


def sequential(spec: dict, root: Path) -> dict:
    env, out = fresh_cache(root), root / "out"
    model = subprocess.run([Q, "model", "path"], env=env, capture_output=True, text=True, check=True).stdout.strip()
    t0 = time.monotonic()
    steps = []
    for recipe in spec["recipes"]:
        name = yaml.safe_load((ROOT / recipe).read_text()).get("name") or Path(recipe).stem
        s = time.monotonic()
        subprocess.run([Q, "run", str(ROOT / recipe), "--output", str(out / name), "--quiet"], env=env, check=True)
        steps.append({"step": f"convert {name}", "seconds": round(time.monotonic() - s, 1)})
    for folder in sorted(p for p in out.iterdir() if (p / "quantize.json").is_file()):
        s = time.monotonic()
        with open(folder / "gate.json", "w") as fh:
            rc = subprocess.run(
                [
                    Q,
                    "gate",
                    str(ROOT / spec["policy"]),
                    "--baseline",
                    model,
                    "--candidate",
                    str(folder),
                    "--junit",
                    str(folder / "gate.xml"),
                    "--json",
                    "--quiet",
                ],
                env=env,
                stdout=fh,
            ).returncode
        if rc > 1:
            sys.exit(f"the gate of {folder} failed (exit {rc})")
        steps.append({"step": f"gate {folder.name}", "seconds": round(time.monotonic() - s, 1)})
    s = time.monotonic()  # gate-all ends with the report, as the sweep does
    subprocess.run(
        [
            Q,
            "report",
            str(out),
            "--baseline",
            model,
            "--policy",
            str(ROOT / spec["policy"]),
            "--out",
            str(root / "report"),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    steps.append({"step": "report", "seconds": round(time.monotonic() - s, 1)})
    return {"wall_seconds": round(time.monotonic() - t0, 1), "steps": steps, "verdicts": verdicts(out)}


def sweep(spec: dict, root: Path) -> dict:
    env, out = fresh_cache(root), root / "out"
    copy = dict(spec, output=str(out), name="wall")
    copy["recipes"] = [str(ROOT / r) for r in spec["recipes"]]
    copy["policy"] = str(ROOT / spec["policy"])
    f = root / "sweep.yaml"
    f.write_text(yaml.safe_dump(copy))
    t0 = time.monotonic()
    rc = subprocess.run([Q, "sweep", str(f)], env=env).returncode
    wall = round(time.monotonic() - t0, 1)
    if rc > 1:
        sys.exit(f"the sweep failed (exit {rc})")
    from quantize import records
    from quantize.records import SweepRecord

    record = records.read(SweepRecord, out / "sweep-wall" / "sweep.json")
    tasks = [
        {
            "task": t.task,
            "seconds": t.attempts[-1].seconds,
            "node": t.attempts[-1].node[:12],
            "threads": t.attempts[-1].threads,
        }
        for t in record.tasks
        if t.attempts
    ]
    return {"wall_seconds": wall, "tasks": tasks, "verdicts": verdicts(out), "resources": spec.get("resources")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", default=str(ROOT / "sweeps" / "default.yaml"))
    ap.add_argument("--only", choices=["sequential", "sweep"])
    ap.add_argument("--json", help="write the figures here (a side already in the file is kept: run --only twice)")
    args = ap.parse_args()
    spec = yaml.safe_load(Path(args.sweep).read_text())
    result: dict = {"sweep_file": args.sweep, "cpus": os.cpu_count()}
    if args.json and Path(args.json).is_file():  # a side measured before (--only) is kept beside the other
        result = json.loads(Path(args.json).read_text()) | result
    with tempfile.TemporaryDirectory(prefix="sweep-wall-") as tmp:
        for side, fn in (("sequential", sequential), ("sweep", sweep)):
            if args.only in (None, side):
                (Path(tmp) / side).mkdir()
                result[side] = fn(spec, Path(tmp) / side)
                print(f"{side}: {result[side]['wall_seconds']:.0f} s  {result[side]['verdicts']}", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if "sequential" in result and "sweep" in result:
        result["ratio_sweep_to_sequential"] = round(
            result["sweep"]["wall_seconds"] / result["sequential"]["wall_seconds"], 3
        )
        result["same_verdicts"] = result["sweep"]["verdicts"] == result["sequential"]["verdicts"]
        print(
            f"sweep / one after the other: {result['ratio_sweep_to_sequential']:.2f}; same verdicts: "
            f"{result['same_verdicts']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
