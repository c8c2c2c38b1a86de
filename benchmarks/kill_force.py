"""kill -9 at random moments of `quantize run --force` over an existing output (tiny seeded model, GPTQ).

After every kill: the target still holds a complete checkpoint (its quantize.json reads through the
record model), and no other folder beside it looks complete (a visible name holding quantize.json).
The next run reports what the killed one left; the last run, with --clean, removes it all.
Prints a line per kill and writes benchmarks/results/kill_force.txt."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def quantize(*argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quantize.cli", *argv], capture_output=True, text=True, env=env, check=False
    )


def main(kills: int = 20, seed: int = 0) -> None:
    from quantize import records
    from quantize.records import RunRecord

    from conftest import make_tiny_llama

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "QUANTIZE_CACHE": str(tmp / "cache")}
        model = make_tiny_llama(tmp / "tiny")
        out = tmp / "outputs" / "ck"
        recipe = tmp / "r.yaml"
        recipe.write_text(
            f"method: gptq\nscheme: W4A16\ngroup_size: 64\nmodel: {model}\noutput: {out}\n"
            "calibration: {samples: 4, seq_len: 32}\n"
        )
        t0 = time.perf_counter()
        assert quantize("run", str(recipe), "--quiet", env=env).returncode == 0
        full = time.perf_counter() - t0
        # half the kills anywhere in a run; half while it writes: after its temporary folder appears
        # (saving, the dtype cast, the reload check, accounting, the swap, removing the old output)
        plan = [("run", rng.uniform(0, full)) if k % 2 == 0 else ("write", rng.uniform(0, 0.1)) for k in range(kills)]
        lines = [
            f"one complete run: {full:.1f} s; {kills} kills: half at a uniform time in [0, {full:.1f}] s of the run, "
            "half at a uniform time in [0, 0.1] s after its temporary folder appears "
            "(it lives about 0.09 s on the tiny model: saving, the reload check, the swap)"
        ]
        ok = True
        for k, (phase, at) in enumerate(plan):
            p = subprocess.Popen(
                [sys.executable, "-m", "quantize.cli", "run", str(recipe), "--force", "--quiet"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if phase == "write":
                tmp_dir = out.parent / f".{out.name}.tmp-{p.pid}"
                while not tmp_dir.exists() and p.poll() is None:
                    time.sleep(0.005)
            time.sleep(at)
            finished = p.poll() is not None
            if not finished:
                os.kill(p.pid, signal.SIGKILL)
            p.wait()
            complete = (out / "quantize.json").is_file() and records.read(RunRecord, out / "quantize.json")
            lookalikes = [
                d.name
                for d in out.parent.iterdir()
                if d != out and not d.name.startswith(".") and (d / "quantize.json").exists()
            ]
            left = sorted(d.name for d in out.parent.iterdir() if d.name.startswith("."))
            good = bool(complete) and not lookalikes
            ok &= good
            lines.append(
                f"kill {k + 1:2d} {at:4.2f} s into {'the run' if phase == 'run' else 'writing'}"
                f"{' (had finished)' if finished else ''}: target "
                f"{'complete' if complete else 'MISSING'}; look-alikes {lookalikes or 'none'}; "
                f"left {left or 'nothing'}"
            )
        r = quantize("run", str(recipe), "--force", "--quiet", "--clean", env=env)
        rest = sorted(d.name for d in out.parent.iterdir())
        ok &= r.returncode == 0 and rest == ["ck"]
        lines.append(
            f"next run with --clean: exit {r.returncode}; {r.stderr.strip() or 'nothing to report'}; "
            f"folder now holds {rest}"
        )
        lines.append("ALL INVARIANTS HELD" if ok else "AN INVARIANT FAILED")
    text = "\n".join(lines)
    print(text)
    (ROOT / "benchmarks" / "results" / "kill_force.txt").write_text(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
