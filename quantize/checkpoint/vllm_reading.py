"""What vLLM reads of a per-expert compressed-tensors checkpoint, for the MoE families whose experts transformers 5
reads only fused (expert_names.per_expert_loader false: Granite 4, gpt-oss), where llm-compressor writes quantized
experts one Linear per projection (`…experts.N.gate_proj.weight_packed`).

vLLM is not installed here (it cannot be on the 2-core CPU machine), so it cannot be asked at run time: this is
what its source says, read in the PyPI wheel vllm-0.34.0 (`vllm/_version.py` commit g62d4bc3c7), each entry with
the file, function and lines it comes from (docs/vllm-loading.md Q8 for gpt-oss, Q9 for Granite 4, where the same
citations stand; tests/checkpoint/test_vllm_reading.py holds the two to each other). A family not listed here is
not one this module speaks for (the per-expert families transformers reads are docs/vllm-loading.md's Q1 and Q5).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VLLM_READ = "vLLM 0.34.0"  # the version whose source the entries below were read in


@dataclass(frozen=True)
class Reading:
    """Whether vLLM's model of a family loads its per-expert quantized experts (`reads`), where that is decided
    (`where`: the file under vllm/, the function and its lines) and how (`how`: one clause)."""

    reads: bool
    where: str
    how: str
    remapped: bool = False  # its names go through maybe_remap_moe_expert_param_name (REMAPPED) before the lookup


PER_EXPERT: dict[str, Reading] = {
    "granitemoehybrid": Reading(
        reads=True,
        where="vllm/model_executor/models/granitemoehybrid.py, GraniteMoeHybridModel.get_expert_mapping "
        "(lines 408-433) and load_weights' _load_quant_expert (lines 472-504, tried first on every tensor: 510)",
        how="each `block_sparse_moe.experts.N.gate_proj.`, `up_proj.` or `down_proj.` tensor, whatever its suffix "
        "(weight, weight_scale, weight_packed, ...), is loaded into its FusedMoE's `w13_` or `w2_` parameter of that "
        "suffix, expert N's gate, up or down shard",
        remapped=True,
    ),
    "gpt_oss": Reading(
        reads=False,
        where="vllm/model_executor/models/gpt_oss.py, GptOssModel._load_weights_other (lines 1147-1310; load_weights "
        "sends a compressed-tensors checkpoint there, lines 1326-1366)",
        how="a compressed-tensors gpt-oss's experts are read only fused (`.w13_weight`, `.w2_weight`, lines "
        "1187-1235) or under vLLM's own per-expert names `experts.N.w13_weight`/`w2_*` (lines 73-82, 1258-1280), "
        "and a name the model has no parameter for is skipped (lines 1248-1250): llm-compressor's "
        "`experts.N.gate_proj.*` tensors would load as nothing, silently",
    ),
}

# vllm/model_executor/model_loader/weight_utils.py, maybe_remap_moe_expert_param_name (lines 1893-1966): the
# parameter names it moves under `experts.routed_experts.`, where the FusedMoE holds its parameters (`expert_param_
# suffixes`, lines 1931-1946, matched as `.{suffix}` inside the name or at its end, lines 1950-1953); a name it leaves
# alone is looked up where no parameter is, and _load_quant_expert stops on it (`params_dict[name_mapped]`: KeyError)
REMAPPED = (
    "w13_weight",
    "w2_weight",
    "w13_weight_scale",
    "w2_weight_scale",
    "w13_input_scale",
    "w2_input_scale",
    "w13_bias",
    "w2_bias",
    "w13_scale",
    "w2_scale",
    "w13_qweight",
    "w2_qweight",
    "w13_qzeros",
    "w2_qzeros",
    "w13_weight_shape",
    "w2_weight_shape",
)

_STORED = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.(\w+)$")


def unread(model_type: str, stored: list[str]) -> list[str]:
    """The suffixes of the stored per-expert tensors (`stored`: the checkpoint's tensor names) that vLLM's model of
    `model_type` cannot place (a remapped family: the parameter name REMAPPED does not cover, e.g. NVFP4's
    `input_global_scale` as `w13_input_global_scale`), sorted; [] for a family not listed or not remapped."""
    reading = PER_EXPERT.get(model_type)
    if reading is None or not reading.remapped:
        return []
    out = set()
    for name in stored:
        if m := _STORED.search(name):
            param = f"experts.{'w2' if m.group(1) == 'down_proj' else 'w13'}_{m.group(2)}"
            if not any(f".{s}" in param or param.endswith(s) for s in REMAPPED):
                out.add(m.group(2))
    return sorted(out)


def said(model_type: str, stored: list[str]) -> str | None:
    """What vLLM makes of a per-expert checkpoint of `model_type` holding the tensors `stored`, in a sentence that
    names the version read, the file and the function; None for a family this module does not speak for."""
    reading = PER_EXPERT.get(model_type)
    if reading is None:
        return None
    if not reading.reads:
        return f"{VLLM_READ} does not read its quantized experts ({reading.where}: {reading.how})"
    if missing := unread(model_type, stored):
        return (
            f"{VLLM_READ} reads its experts' names ({reading.where}) but not their {', '.join(missing)}: "
            "maybe_remap_moe_expert_param_name (model_loader/weight_utils.py, lines 1931-1953) does not move such a "
            "name to the experts' parameters, so its load stops there (KeyError), by reading its source"
        )
    return f"{VLLM_READ} reads it, by reading its source ({reading.where}: {reading.how})"
