"""The vLLM backend end to end (`backend: vllm`): scores and agreement from one engine per checkpoint, the
agreement's top-k from vLLM's prompt log-probabilities. Needs an accelerator and vLLM (`make test-gpu`);
the conversion from prompt log-probabilities is tested without either in tests/evaluate/test_agreement.py."""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("isolated_cache")]

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from formats import FORMATS, aa_gate, convert  # noqa: E402

from conftest import suite_file  # noqa: E402


def _suite(base, backend: str):
    extra = f"backend: {backend}\n" + ("vllm: {gpu_memory_utilization: 0.3}\n" if backend == "vllm" else "")
    return suite_file(base / f"suite-{backend}.yaml", base / "golden" / "v1", extra=extra)


def test_sequential_a_a_gate_on_vllm_builds_one_engine_per_checkpoint(golden, tiny_model, capsys, monkeypatch):
    from lm_eval.models import vllm_causallms

    built = []
    real = vllm_causallms.VLLM.__init__

    def counting(self, *a, **k):
        built.append(k.get("pretrained"))
        real(self, *a, **k)

    monkeypatch.setattr(vllm_causallms.VLLM, "__init__", counting)
    code, v, kl, top1 = aa_gate(golden / "seq-vllm.yaml", _suite(golden, "vllm"), tiny_model, capsys)
    assert code == 0 and v.verdict == "pass"
    assert kl.value < 1e-3 and top1.value > 0.99  # the same engine on the same checkpoint
    assert len(built) == 1  # baseline and candidate are one checkpoint: one engine for scores and agreement


def test_vllm_agreement_matches_hf_on_the_same_checkpoint(golden, tiny_model, capsys):
    """The baseline's top-k from HF on the GPU, the candidate's prompt log-probabilities from vLLM: the same
    model, two engines; their agreement must be near perfect (kernels differ, numerics nearly not)."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.agreement import VLLMScorer, _scorer, agreement_requests, baseline_topk, compare
    from quantize.evaluate.suite import open_suite

    hf, vl = open_suite(_suite(golden, "hf")), open_suite(_suite(golden, "vllm"))
    reqs = agreement_requests(hf)
    models = LastModel()
    base = baseline_topk(_scorer(hf, tiny_model, models), reqs, 5)
    scorer = _scorer(vl, tiny_model, models)
    assert isinstance(scorer, VLLMScorer)
    out = compare(scorer, reqs, base)
    assert out["positions"] == int(base.counts.sum())
    assert out["kl_mean"] < 0.01 and out["top1"] > 0.95


# Each format of 2026 (tests/formats.py) as vLLM serves it against the same checkpoint scored by HF (dequantized,
# activations fake-quantized) on the GPU: one checkpoint, two engines.
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_serves_on_vllm_as_hf_scores_it(golden, tiny_model, tmp_path, capsys, fmt):
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.agreement import _scorer, agreement_requests, baseline_topk, compare
    from quantize.evaluate.suite import open_suite

    ckpt = convert(tmp_path, tiny_model, fmt, capsys)
    scheme = fmt.split("+")[0]
    hf, vl = open_suite(_suite(golden, "hf")), open_suite(_suite(golden, "vllm"))
    reqs = agreement_requests(hf)
    base = baseline_topk(_scorer(hf, ckpt, LastModel()), reqs, 5)
    out = compare(_scorer(vl, ckpt, LastModel()), reqs, base)
    assert out["positions"] == int(base.counts.sum())
    weight_only_there = scheme == "NVFP4" and torch.cuda.get_device_capability() < (10, 0)
    if weight_only_there:
        assert math.isfinite(out["kl_mean"]), out
    else:
        assert out["kl_mean"] < 0.02 and out["top1"] > 0.9, out
