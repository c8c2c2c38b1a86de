"""Every candidate's verdict in float32 and in bf16, rule by rule, from saved verdicts or benchmarks/gate_time.py
runs on the same policy (one with its suite as written, one with `dtype: bfloat16`).

    python benchmarks/dtype_verdicts.py --float32 FILE [FILE ...] --bf16 FILE [FILE ...]

A FILE is a verdict (`quantize gate --json`, gate.json) or a gate_time.py JSON (its rows' per-rule outcomes).
Candidates are matched by their folder's name. Each rule shows its outcome in float32 / bf16 (pass, reg =
regression, inc = inconclusive, "-" = untested: an agreement regression stopped the gate first); "moved" marks a
candidate whose verdict differs between the dtypes. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHORT = {"pass": "pass", "regression": "reg", "inconclusive": "inc", "untested": "-"}


def outcomes(files: list[Path]) -> dict[str, tuple[str, dict[str, str]]]:
    """Candidate folder name -> (verdict, rule -> outcome)."""
    from quantize.records import Verdict, read

    out = {}
    for f in files:
        data = json.loads(f.read_text())
        if "rows" in data:
            for r in data["rows"]:
                if "rule_looks" in r:
                    rules = {k: v[0] for k, v in r["rule_looks"].items()}
                    out[Path(r["candidate"]).name] = (r["sequential_verdict"], rules)
        else:
            v = read(Verdict, f)
            out[Path(v.provenance.candidate.checkpoint.path).name] = (v.verdict, {r.rule: r.verdict for r in v.rules})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--float32", nargs="+", type=Path, required=True)
    ap.add_argument("--bf16", nargs="+", type=Path, required=True)
    args = ap.parse_args()
    a, b = outcomes(args.float32), outcomes(args.bf16)
    names = [n for n in b if n in a]
    rules = list(a[names[0]][1]) if names else []
    print("| candidate | float32 | bf16 | | " + " | ".join(rules) + " |")
    print("|---" * (4 + len(rules)) + "|")
    for n in names:
        (va, ra), (vb, rb) = a[n], b[n]
        cells = [f"{SHORT[ra[r]]} / {SHORT[rb[r]]}" for r in rules]
        print(f"| {n} | {va} | {vb} | {'**moved**' if va != vb else 'same'} | " + " | ".join(cells) + " |")
    print(f"\n{sum(a[n][0] != b[n][0] for n in names)} of {len(names)} verdicts moved")


if __name__ == "__main__":
    main()
