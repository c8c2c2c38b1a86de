"""Scoring on a CUDA device with the HF backends, no vLLM needed (`make test-gpu`): every format of
tests/formats.py scored on the GPU as on the CPU, our scorer (`backend: quantize`) against lm-eval's stock HFLM
on the GPU for Llama, Gemma 3 (sliding windows), gpt-oss, Qwen3-MoE and DeepSeek-V3 (MoE), and an A/A gate with
`device: cuda`. Figures are printed (`-s`) for docs/results.md."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("isolated_cache")]

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from formats import FORMATS, aa_gate, convert  # noqa: E402

from conftest import suite_file  # noqa: E402

GPU_TOL = 1e-3  # nats per request: float32 on the GPU, other kernels and reduction orders than the CPU's


def _suite(base, device: str, backend: str = "hf"):
    extra = f"backend: {backend}\ndevice: {device}\ndtype: float32\n"
    return suite_file(base / f"suite-{backend}-{device}.yaml", base / "golden" / "v1", extra=extra)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_scores_on_cuda_as_on_the_cpu(golden, tiny_model, tmp_path, capsys, fmt):
    """One converted checkpoint, decompressed and run (activations fake-quantized where the format says so) by
    HF on the CPU and on the GPU, both in float32: the agreement's top-k must be near identical."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.agreement import _scorer, agreement_requests, baseline_topk, compare
    from quantize.evaluate.suite import open_suite

    ckpt = convert(tmp_path, tiny_model, fmt, capsys)
    cpu, gpu = open_suite(_suite(golden, "cpu")), open_suite(_suite(golden, "cuda"))
    reqs = agreement_requests(cpu)
    base = baseline_topk(_scorer(cpu, ckpt, LastModel()), reqs, 5)
    out = compare(_scorer(gpu, ckpt, LastModel()), reqs, base)
    print(f"\nFIGURE format {fmt}: positions {out['positions']} kl_mean {out['kl_mean']:.3e} top1 {out['top1']:.4f}")
    assert out["positions"] == int(base.counts.sum())
    assert out["kl_mean"] < 1e-3 and out["top1"] > 0.97, out


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_oss", "qwen3_moe", "deepseek_v3"])
def test_our_scorer_equals_stock_hflm_on_cuda(tmp_path, family):
    """tests/evaluate/test_lm.py's items on the GPU in float32: our scorer against stock HFLM there (the same
    is_greedy, log-likelihoods within GPU_TOL), against itself on the CPU, and an item's floats the same alone
    as among the others (the same shapes run the same kernels)."""
    import families
    from test_lm import items, ours, stock

    from quantize.checkpoint.loader import LastModel

    path = families.build(family, tmp_path / family)
    on_gpu = LastModel().get(path, dtype="float32", on="cuda")
    reqs = items(on_gpu, 8, greedy=True)
    theirs = stock(on_gpu, batch_size=4, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    lm = ours(on_gpu, batch_size=16, max_length=24)
    mine = lm.loglikelihood(reqs, disable_tqdm=True)
    on_cpu = LastModel().get(path, dtype="float32", on="cpu")
    cpu = ours(on_cpu, batch_size=16, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    vs_stock = float(np.abs(np.array([a for a, _ in mine]) - [a for a, _ in theirs]).max())
    vs_cpu = float(np.abs(np.array([a for a, _ in mine]) - [a for a, _ in cpu]).max())
    print(f"\nFIGURE family {family}: max|ours-stock| on cuda {vs_stock:.2e}, max|cuda-cpu| {vs_cpu:.2e}")
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert vs_stock <= GPU_TOL and vs_cpu <= GPU_TOL
    for d in (0, 5):
        item = [r for r in reqs if r.doc_id == d]
        assert lm.loglikelihood(item, disable_tqdm=True) == [
            a for r, a in zip(reqs, mine, strict=True) if r.doc_id == d
        ]


@pytest.mark.parametrize("backend", ["quantize", "hf"])
def test_a_a_gate_on_cuda_passes_with_zero_disagreement(golden, tiny_model, capsys, backend):
    """A sequential gate of a checkpoint against itself, scored and compared on the GPU: pass, KL ~0, top-1 1."""
    code, v, kl, top1 = aa_gate(golden / f"aa-{backend}.yaml", _suite(golden, "cuda", backend), tiny_model, capsys)
    print(f"\nFIGURE A/A gate on cuda ({backend}): {v.verdict}, kl {kl.value:.2e}, top1 {top1.value:.4f}")
    assert code == 0 and v.verdict == "pass"
    assert kl.value < 1e-6 and top1.value == 1.0
