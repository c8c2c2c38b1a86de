"""What the GPU checks share (tests/evaluate/test_vllm.py, tests/evaluate/test_cuda.py): the formats of 2026
each converts the tiny model to, and an A/A gate. FORMATS: scheme (with "+KV" for an FP8 key-value cache) -> the
recipe's extra fields, with "calibration" standing for the tests' small calibration set (convert/test_engine.CAL).

By vLLM's docs FP8 W8A8 computes in FP8 from compute capability 8.9 (Marlin weight-only from 7.5), NVFP4's FP4
tensor cores are SM100's and below it vLLM runs NVFP4 weight-only (then its activations are not rounded as HF's
are)."""

FORMATS = {
    "NVFP4A16": {},
    "NVFP4": {"calibration": "cal"},
    "MXFP4A16": {},
    "MXFP4": {},
    "FP8_BLOCK": {},
    "W4AFP8": {},
    "FP8_DYNAMIC+KV": {"kv_cache": {"scheme": "FP8"}, "calibration": "cal"},
}


def convert(tmp_path, model, fmt: str, capsys):
    """`model` converted to `fmt` by `quantize run` (RTN, or FP8's own method) under tmp_path/out/f."""
    from convert.test_engine import CAL, run_ok, write_recipe

    fields = dict(FORMATS[fmt])
    fields["calibration"] = CAL if fields.get("calibration") else None
    scheme = fmt.split("+")[0]
    method = "fp8" if scheme == "FP8_DYNAMIC" else "rtn"
    run_ok(write_recipe(tmp_path, model, "f", method=method, scheme=scheme, **fields), capsys)
    return tmp_path / "out" / "f"


def aa_gate(policy, suite, model, capsys):
    """A sequential gate of `model` against itself on `suite` (facts accuracy, prose perplexity, agreement KL and
    top-1), its policy written to `policy`: the exit code, the verdict, and the KL and top-1 evidence."""
    import json

    from quantize import records
    from quantize.cli import main
    from quantize.records import Verdict

    policy.write_text(
        f"suite: {suite}\nsequential: {{looks: [0.5, 1.0]}}\nrules:\n"
        "  - {task: core_facts, metric: acc, margin: 0.4}\n  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n"
        "  - {agreement: kl, max: 0.05}\n  - {agreement: top1, min: 0.9}\n"
    )
    code = main(["gate", str(policy), "--baseline", str(model), "--candidate", str(model), "--json"])
    v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    kl = next(r for r in v.rules if r.rule == "agreement kl").evidence
    top1 = next(r for r in v.rules if r.rule == "agreement top1").evidence
    return code, v, kl, top1
