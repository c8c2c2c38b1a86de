"""What vLLM reads of a per-expert checkpoint of the families transformers reads only fused (quantize/checkpoint/
vllm_reading.py): data read in vLLM 0.34.0's source, which cannot be asked here (vLLM is not installed). Each entry
is held to docs/vllm-loading.md, which gives the same file, function and lines; the one rule it restates (which
parameter names vLLM's Granite 4 loader moves onto the experts) is held to what quantize writes per format."""

from __future__ import annotations

import re

import pytest

from quantize.checkpoint import vllm_reading

from conftest import ROOT

EXPERT = "model.layers.0.block_sparse_moe.experts.3"
# the tensors llm-compressor writes for one expert projection, by format (tiny Granite 4 outputs, session 45)
STORED = {
    "fp8": ["weight", "weight_scale"],
    "fp8-static": ["weight", "weight_scale", "input_scale"],
    "w4a16-asym": ["weight_packed", "weight_scale", "weight_shape", "weight_zero_point"],
    "nvfp4a16": ["weight_packed", "weight_scale", "weight_global_scale"],
    "mxfp4": ["weight_packed", "weight_scale"],
    "nvfp4": ["weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"],
}


def names(fmt: str) -> list[str]:
    return [f"{EXPERT}.{p}.{s}" for p in ("gate_proj", "up_proj", "down_proj") for s in STORED[fmt]]


@pytest.mark.parametrize("family", sorted(vllm_reading.PER_EXPERT))
def test_each_reading_is_the_one_docs_vllm_loading_cites(family):
    """Every file, function and line range an entry cites is in docs/vllm-loading.md's section on that family (Q8
    gpt-oss, Q9 Granite 4), read in the same version: the code and the doc say one thing."""
    doc = (ROOT / "docs" / "vllm-loading.md").read_text()
    heading = {"gpt_oss": "## Q8: gpt-oss", "granitemoehybrid": "## Q9: Granite 4"}[family]
    section = doc[doc.index(heading) :].split("\n## ")[0]
    assert vllm_reading.VLLM_READ.split()[-1] in section
    where = vllm_reading.PER_EXPERT[family].where
    cited = re.findall(r"models/\w+\.py|[A-Z]\w+\.\w+|\b_\w+|\d+-\d+", where)
    assert len(cited) >= 3, where
    for c in cited:
        assert c in section, (family, c)


@pytest.mark.parametrize("fmt", sorted(STORED))
def test_vllm_places_every_granite_expert_tensor_but_an_nvfp4_input_global_scale(fmt):
    """maybe_remap_moe_expert_param_name moves `w13_weight*`, `*_input_scale` and the like under the experts'
    parameters, and not `w13_input_global_scale`: of what quantize writes, only NVFP4 with FP4 activations holds a
    tensor vLLM 0.34.0's Granite 4 loader cannot place, and the sentence says so instead of "reads it"."""
    unread = vllm_reading.unread("granitemoehybrid", names(fmt))
    said = vllm_reading.said("granitemoehybrid", names(fmt))
    assert said is not None and "granitemoehybrid.py" in said
    if fmt == "nvfp4":
        assert unread == ["input_global_scale"] and "not their input_global_scale" in said
    else:
        assert unread == [] and said.startswith(f"{vllm_reading.VLLM_READ} reads it,")


def test_a_family_vllm_reads_nothing_of_or_one_not_listed():
    """gpt-oss: vLLM reads none of its per-expert quantized experts, whatever their tensors; a family this module
    does not speak for (Qwen3-MoE: transformers reads it per expert) gets no sentence."""
    said = vllm_reading.said("gpt_oss", names("fp8"))
    assert said is not None and "does not read" in said and "gpt_oss.py" in said
    assert vllm_reading.unread("gpt_oss", names("nvfp4")) == []
    assert vllm_reading.said("qwen3_moe", names("fp8")) is None
