"""A scale-out projection of a sweep from its measured per-task times: N candidates on W workers.

    python benchmarks/sweep_projection.py SWEEP_JSON [--wall benchmarks/results/sweep_wall.json]
        [--candidates 5 20 100] [--workers 1 2 4 8 16]

A projection, not a measurement. The model: W identical workers, one task each at a time, each task taking the
time it took in the measured sweep (its last attempt's wall seconds in sweep.json, worker start-up included);
candidate k of a projected sweep takes the times of measured candidate k mod M (its conversion, if it had one,
and its gate). Tasks are started greedily as workers free up: the baseline first, then the conversions in order,
then each gate once its conversion and the baseline are done (the graph quantize sweep runs). Ignored: anything
that makes a task slower when others run beside it (memory bandwidth, a shared filesystem, a node's other
tasks) and the driver's own start-up (Ray's, about 4 s here). Lower bound on any schedule:
    T ≥ max(b + min_k g_k, max_k (c_k + g_k), (b + Σ_k c_k + Σ_k g_k) / W),
b the baseline's time, c_k and g_k candidate k's conversion and gate. Next to it: the measured points (the sweep
itself, and one after the other from benchmarks/sweep_wall.py when given).
"""

from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path


def makespan(baseline: float, cands: list[tuple[float, float]], workers: int) -> float:
    """Greedy list schedule of the sweep's graph (module docstring); cands = [(convert seconds, gate seconds)]."""
    free = [0.0] * workers  # when each worker is next free (a heap)
    heapq.heapify(free)
    start = heapq.heappop(free)
    base_done = start + baseline
    heapq.heappush(free, base_done)
    converted = []
    for c, _ in cands:
        t = heapq.heappop(free)
        converted.append(t + c)
        heapq.heappush(free, t + c)
    end = base_done
    for (_, g), conv_done in sorted(zip(cands, converted, strict=True), key=lambda x: x[1]):
        t = max(heapq.heappop(free), conv_done, base_done)
        end = max(end, t + g)
        heapq.heappush(free, t + g)
    return end


def lower_bound(baseline: float, cands: list[tuple[float, float]], workers: int) -> float:
    work = baseline + sum(c + g for c, g in cands)
    return max(baseline + min(g for _, g in cands), max(c + g for c, g in cands), work / workers)


def measured(path: Path) -> tuple[float, list[tuple[float, float]]]:
    """The baseline's seconds and each gated candidate's (convert, gate) seconds: from a sweep.json (SweepRecord), or
    from benchmarks/sweep_wall.py's JSON (the sweep side's task times)."""
    data = json.loads(path.read_text())
    if "sweep" in data and "tasks" in data["sweep"]:  # sweep_wall.py's own output, not a pipeline record
        times = {t["task"]: t["seconds"] or 0.0 for t in data["sweep"]["tasks"]}
        names = list(data["sweep"]["verdicts"])
    else:
        from quantize import records
        from quantize.records import SweepRecord

        rec = records.read(SweepRecord, path)
        times = {t.task: t.attempts[-1].seconds or 0.0 for t in rec.tasks if t.attempts}
        names = [c.name for c in rec.candidates if c.verdict is not None]
    return times.get("baseline", 0.0), [(times.get(f"convert {n}", 0.0), times.get(f"gate {n}", 0.0)) for n in names]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep_json")
    ap.add_argument("--wall", help="benchmarks/sweep_wall.py's JSON: the measured one-after-the-other point")
    ap.add_argument("--candidates", type=int, nargs="+", default=[5, 20, 100])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = ap.parse_args()
    b, cands = measured(Path(args.sweep_json))
    print(f"measured per task (s): baseline {b:.0f}; " + "; ".join(f"convert {c:.0f} + gate {g:.0f}" for c, g in cands))
    if args.wall:
        wall = json.loads(Path(args.wall).read_text())
        print(
            f"measured: one after the other {wall['sequential']['wall_seconds']:.0f} s (1 worker, all cores), "
            f"the sweep {wall['sweep']['wall_seconds']:.0f} s ({wall['cpus']} CPUs)"
        )
    print(
        "\nprojected makespan in minutes (lower bound in brackets): a projection from the times above, "
        "not a measurement"
    )
    print("candidates " + "".join(f"{f'W={w}':>16}" for w in args.workers))
    for n in args.candidates:
        cs = [cands[k % len(cands)] for k in range(n)]
        cells = "".join(f"{makespan(b, cs, w) / 60:>9.1f} ({lower_bound(b, cs, w) / 60:>4.1f})" for w in args.workers)
        print(f"{n:>10} {cells}")


if __name__ == "__main__":
    main()
