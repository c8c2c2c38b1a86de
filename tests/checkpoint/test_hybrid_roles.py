"""`quantize inspect`'s roles and parts on the hybrid families (issue #57): linear attention, state-space (Mamba2),
convolution and indexer parameters have roles and parts of their own; the unknown role ('other') holds nothing
but norms; Nemotron-H's `mixer` modules split into attention, Mamba and MLP.

Each checkpoint is the family's model from transformers' own classes with random weights, saved by
save_pretrained: the names a published checkpoint stores, which differ from the model's own names where the family
has a conversion (Granite 4's experts are `block_sparse_moe.input_linear` on disk, `experts.gate_up_proj` in
memory)."""

from __future__ import annotations

import families
import pytest

from quantize.checkpoint import accounting, architecture
from quantize.checkpoint.headers import TensorInfo

HYBRIDS = ["qwen3_next", "qwen3_5_text", "kimi_linear", "nemotron_h", "granitemoehybrid", "falcon_h1", "lfm2"]
# the MoE and new-attention families whose saved names a review found of unknown role or part (router biases,
# attention sinks, Gemma 4's layer scalar)
OTHERS = ["deepseek_v32", "gpt_oss", "minimax_m2", "ernie4_5_moe", "gemma4_text"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrids")
    return {f: (accounting.bits_report(families.build(f, root / f)), root / f) for f in [*HYBRIDS, *OTHERS]}


def _roles(ckpt) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "np") as f:
        shapes = {n: list(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118 (safe_open has no iteration)
    names = set(shapes)
    return {n: accounting.role_of(n, TensorInfo(n, "BF16", s, 0, "x"), names) for n, s in shapes.items()}


@pytest.mark.parametrize("family", [*HYBRIDS, *OTHERS])
def test_nothing_but_norms_has_the_unknown_role(family, reports):
    report, ckpt = reports[family]
    roles = _roles(ckpt)
    assert [n for n, r in roles.items() if r == "other"] == []  # these families' norms are all named norms
    assert not any("unknown role" in note for note in report.notes)
    # a part of its own for no more than a scalar a layer (Gemma 4's layer_scalar)
    other = [n for n in roles if architecture.part_of(n.rsplit(".", 1)[0], roles[n]) == "other"]
    assert all(roles[n] == "scalar" for n in other), other
    assert report.bytes_by_part.get("other", {}).get("bytes", 0) == 2 * len(other)


@pytest.mark.parametrize(
    "family,where,role,part",
    [
        ("granitemoehybrid", "block_sparse_moe.input_linear.weight", "linear_kept", "routed_experts"),
        ("granitemoehybrid", "block_sparse_moe.output_linear.weight", "linear_kept", "routed_experts"),
        ("granitemoehybrid", "block_sparse_moe.router.layer.weight", "linear_kept", "router"),
        ("minimax_m2", "block_sparse_moe.e_score_correction_bias", "bias", "router"),
        ("ernie4_5_moe", "mlp.moe_statics.e_score_correction_bias", "bias", "router"),
        ("gpt_oss", "self_attn.sinks", "scalar", "attention"),
        ("gemma4_text", "layer_scalar", "scalar", "other"),
        ("gemma4_text", "per_layer_input_gate.weight", "linear_kept", "embedding"),
    ],
)
def test_saved_moe_names_and_scalars(family, where, role, part, reports):
    """Granite 4's experts and router as save_pretrained writes them, router biases wherever a family keeps them,
    and per-head or per-layer scalars: each was `other` (73% of a saved Granite 4's bytes)."""
    roles = {n: r for n, r in _roles(reports[family][1]).items() if n.endswith(f"layers.1.{where}")}
    assert list(roles.values()) == [role]
    assert architecture.part_of(next(iter(roles)).rsplit(".", 1)[0], role) == part


def test_saved_granite_4_prices_its_routed_experts(reports):
    """Its fused experts, as saved, were `other`: no routed experts, no MoE layer, `quantize cost` refused it."""
    report, _ = reports["granitemoehybrid"]
    assert [(e.layer, e.experts_stored) for e in report.expert_layers] == [(i, 4) for i in range(4)]
    assert report.routed_expert_share and report.routed_expert_share > 0.5
    # 4 layers of 4 experts: input_linear [4, 512, 128] and output_linear [4, 128, 256] in bf16
    assert report.bytes_by_part["routed_experts"]["bytes"] == 4 * 2 * (4 * 512 * 128 + 4 * 128 * 256)


@pytest.mark.parametrize(
    "family,where,role",
    [
        ("qwen3_next", "layers.0.linear_attn.A_log", "state"),
        ("qwen3_next", "layers.0.linear_attn.conv1d.weight", "conv"),
        ("kimi_linear", "layers.0.self_attn.A_log", "state"),  # its forget gate's, `forget_gate.A_log` in memory
        ("nemotron_h", "layers.0.mixer.D", "state"),
        ("nemotron_h", "layers.0.mixer.conv1d.weight", "conv"),
        ("nemotron_h", "embeddings.weight", "embedding"),
        ("granitemoehybrid", "layers.0.mamba.dt_bias", "state"),
        ("lfm2", "layers.0.conv.conv.weight", "conv"),
    ],
)
def test_state_space_and_convolution_roles(family, where, role, reports):
    roles = _roles(reports[family][1])
    assert [r for n, r in roles.items() if n.endswith(where)] == [role]


def _part_bytes(report, part: str) -> int:
    return report.bytes_by_part.get(part, {}).get("bytes", 0)


def test_nemotron_h_parts_are_attention_mamba_and_mlp(reports):
    """layers_block_type: mamba, attention, mlp, moe; every block's module is `mixer`."""
    report, ckpt = reports["nemotron_h"]
    for part in ("attention", "mamba", "mlp", "routed_experts", "router", "shared_experts", "embedding"):
        assert _part_bytes(report, part) > 0, part
    parts = {
        n: architecture.part_of(n.rsplit(".", 1)[0], r)
        for n, r in _roles(ckpt).items()
        if ".mixer." in n and r not in ("norm",)
    }
    assert {p for n, p in parts.items() if ".layers.0." in n} == {"mamba"}
    assert {p for n, p in parts.items() if ".layers.1." in n} == {"attention"}
    assert {p for n, p in parts.items() if ".layers.2." in n} == {"mlp"}
    # hidden 128: q and o 128 × 128, k and v 2 × 32 × 128, 2 bytes each
    assert _part_bytes(report, "attention") == 2 * (2 * 128 * 128 + 2 * 64 * 128)


@pytest.mark.parametrize(
    "family,part",
    [
        ("qwen3_next", "linear_attention"),
        ("qwen3_5_text", "linear_attention"),
        ("kimi_linear", "linear_attention"),  # its KDA layers are `self_attn` too: config.json's layer_types says
        ("granitemoehybrid", "mamba"),
        ("falcon_h1", "mamba"),
        ("lfm2", "short_conv"),
        ("deepseek_v32", "indexer"),
    ],
)
def test_new_parts(family, part, reports):
    assert _part_bytes(reports[family][0], part) > 0


def test_kimi_linear_attention_layers_are_told_from_its_mla_layers(reports):
    """Layers 0 and 2 are Kimi Delta Attention, 1 and 3 MLA (families.MIXED), all named self_attn."""
    _, ckpt = reports["kimi_linear"]
    linear = architecture.linear_attention_layers(families.config("kimi_linear").to_dict())
    assert linear == {0, 2}
    parts = {
        n: architecture.part_of(n.rsplit(".", 1)[0], r, linear)
        for n, r in _roles(ckpt).items()
        if ".self_attn." in n and r != "norm"
    }
    assert {p for n, p in parts.items() if ".layers.0." in n or ".layers.2." in n} == {"linear_attention"}
    assert {p for n, p in parts.items() if ".layers.1." in n or ".layers.3." in n} == {"attention"}


def test_a_layer_norms_bias_is_a_norm(reports):
    """A review (r3, session 44): DeepSeek-V3.2's indexer LayerNorm (`self_attn.indexer.k_norm`) has a bias; the
    norm rule matched `.weight` only, so its bias was role `bias` and `left_16bit` listed it with the catch-all
    "no rule of quantize's plan names it" while its weight was exempt as a norm."""
    roles = _roles(reports["deepseek_v32"][1])
    found = {n: r for n, r in roles.items() if ".indexer.k_norm." in n}
    assert {n.rsplit(".", 1)[1] for n in found} == {"weight", "bias"}
    assert set(found.values()) == {"norm"}
