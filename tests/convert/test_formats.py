"""The formats of 2026 (NVFP4, MXFP4, FP8 block, W4A8 and an FP8 KV cache), each through compressed-tensors' own
preset on a tiny seeded Llama: the recipe layer's checks, the layer plan where the format's group cannot divide
a layer, true bits read from the headers alone against the closed forms (and every byte against the
safetensors library), and the checkpoint reloading to finite logits."""

from __future__ import annotations

import math
from typing import Any

import pytest
from convert.test_engine import CAL, plan, run_ok, write_recipe

from quantize.checkpoint.accounting import bits_report
from quantize.cli import main
from quantize.convert.recipe import FORMATS, Scheme, parse_recipe
from quantize.errors import UsageError

# tiny Llama: hidden 128, intermediate 192, 4 heads of 32, 2 KV heads; 7 linears × 2 layers
FORMAT_RUNS = {
    "NVFP4A16": dict(method="rtn", scheme="NVFP4A16", calibration=None),
    "NVFP4": dict(method="rtn", scheme="NVFP4", calibration=CAL),
    "MXFP4A16": dict(method="rtn", scheme="MXFP4A16", calibration=None),
    "MXFP4": dict(method="rtn", scheme="MXFP4", calibration=None),
    "FP8_BLOCK": dict(method="rtn", scheme="FP8_BLOCK", calibration=None),
    "W4AFP8": dict(method="rtn", scheme="W4AFP8", calibration=None),
}


def _closed_form(scheme: str, out: int, inp: int) -> float:
    """Bits per weight of one quantized linear, from the format's definition:
    NVFP4   4 (E2M1) + 8/16 (an E4M3 scale per 16) + 32/(out·in) (one FP32 global scale)
    MXFP4   4 + 8/32 (an E8M0 scale per 32)
    FP8 blk 8 + 16·⌈out/128⌉·⌈in/128⌉/(out·in) (a scale per 128×128 block, partial blocks rounded up, stored in
            the 16-bit dtype the conversion ran in: 8 + 16/16384 where 128 divides both sides; 32/16384 in float32)
    W4AFP8  8 + 16/g: int4 values that compressed-tensors 0.19 stores one a byte (int-quantized: it packs int4
            only for weight-only schemes), a 16-bit scale per group g (128, or 64 where 128 does not divide)"""
    n = out * inp
    if scheme.startswith("NVFP4"):
        return 4 + 8 / 16 + 32 / n
    if scheme.startswith("MXFP4"):
        return 4 + 8 / 32
    if scheme == "FP8_BLOCK":
        return 8 + 16 * math.ceil(out / 128) * math.ceil(inp / 128) / n
    g = 128 if inp % 128 == 0 else 64
    return 8 + 16 / g


SHAPES = {  # (out, in) of each linear of the tiny model
    "q_proj": (128, 128),
    "k_proj": (64, 128),
    "v_proj": (64, 128),
    "o_proj": (128, 128),
    "gate_proj": (192, 128),
    "up_proj": (192, 128),
    "down_proj": (128, 192),
}


@pytest.mark.parametrize("scheme", list(FORMAT_RUNS))
def test_each_format_converts_reloads_and_has_its_closed_form_bits(tmp_path, tiny_model, capsys, scheme):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import LastModel

    meta = run_ok(write_recipe(tmp_path, tiny_model, scheme.lower(), **FORMAT_RUNS[scheme]), capsys)
    out = tmp_path / "out" / scheme.lower()
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits).all()
    # as the scorer loads it on a CPU: float32 (FP4 decompresses to bf16, which once met float32 in F.linear)
    scored, _ = LastModel().get(out, dtype="float32", on="cpu")
    assert torch.isfinite(scored(input_ids=torch.tensor([[1, 5, 9, 2]])).logits).all()
    report = bits_report(out)
    assert report.parameters == bits_report(tiny_model).parameters  # packed FP4 unpacked to the source's count
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # every byte as the safetensors library reads it
        stored = sum(t.numel() * t.element_size() for t in (f.get_tensor(k) for k in f.keys()))  # noqa: SIM118
    assert report.total_bytes == stored
    rows = {m.module.rsplit(".", 1)[-1]: m for m in report.modules if m.module.startswith("model.layers.0.")}
    kept = {"down_proj"} if scheme == "FP8_BLOCK" else set()  # 192 input features: no 128-wide block fits
    for name, (o, i) in SHAPES.items():
        m = rows[name]
        if name in kept:
            assert m.format == "bf16" or "payload" not in m.roles, m
            continue
        meta_bytes = m.roles.get("quant_meta", 0)  # input scales, weight_shape: the layer's metadata, not weight bits
        got = 8 * (m.bytes - meta_bytes) / m.parameters
        assert got == pytest.approx(_closed_form(scheme, o, i), rel=1e-9), (name, m.format, m.roles)
    assert meta["layer_plan"]["quantized_layers"] == 14 - 2 * len(kept)


def test_nvfp4_and_mxfp4_layouts_are_named(tmp_path, tiny_model, capsys):
    run_ok(write_recipe(tmp_path, tiny_model, "nv", **FORMAT_RUNS["NVFP4A16"]), capsys)
    run_ok(write_recipe(tmp_path, tiny_model, "mx", **FORMAT_RUNS["MXFP4A16"]), capsys)
    nv, mx = bits_report(tmp_path / "out" / "nv"), bits_report(tmp_path / "out" / "mx")
    q = next(m for m in nv.modules if m.module.endswith("layers.0.self_attn.q_proj"))
    assert q.format == "fp4 g16" and q.roles["payload"] == 128 * 128 // 2  # two E2M1 values a byte
    assert q.roles["scale"] == 128 * 128 // 16 + 4  # an E4M3 scale per 16, one FP32 global scale
    q = next(m for m in mx.modules if m.module.endswith("layers.0.self_attn.q_proj"))
    assert q.format == "fp4 g32" and q.roles["scale"] == 128 * 128 // 32  # an E8M0 byte per 32
    assert nv.quantized_linear_bits_per_weight == pytest.approx(4.5, abs=0.01)
    assert mx.quantized_linear_bits_per_weight == pytest.approx(4.25, abs=1e-9)


def test_fp8_block_names_its_blocks(tmp_path, tiny_model, capsys):
    run_ok(write_recipe(tmp_path, tiny_model, "blk", **FORMAT_RUNS["FP8_BLOCK"]), capsys)
    report = bits_report(tmp_path / "out" / "blk")
    mods = {m.module.rsplit(".", 1)[-1]: m for m in report.modules if ".layers.0." in m.module}
    assert mods["q_proj"].format == "f8_e4m3 block 128x128" and mods["gate_proj"].format == "f8_e4m3 block 128x128"
    assert "payload" not in mods["down_proj"].roles


def test_a_quantized_kv_cache_is_recorded_and_its_scales_have_their_own_role(tmp_path, tiny_model, capsys):
    fields = dict(method="fp8", scheme="FP8_DYNAMIC", calibration=CAL, kv_cache={"scheme": "FP8"})
    meta = run_ok(write_recipe(tmp_path, tiny_model, "kv", **fields), capsys)
    import json

    qc = json.loads((tmp_path / "out" / "kv" / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"]["num_bits"] == 8 and qc["kv_cache_scheme"]["type"] == "float"
    assert meta["recipe"]["resolved"]["kv_cache"] == {"scheme": "FP8"}
    from safetensors import safe_open

    report = bits_report(tmp_path / "out" / "kv")
    with safe_open(str(tmp_path / "out" / "kv" / "model.safetensors"), "pt") as f:
        kv = [f.get_tensor(k) for k in f.keys() if k.endswith(("k_scale", "v_scale"))]  # noqa: SIM118
    assert len(kv) == 2 * 2  # a k_scale and a v_scale per layer
    assert report.bytes_by_role["kv_scale"] == sum(t.numel() * t.element_size() for t in kv)
    assert report.parameters == bits_report(tiny_model).parameters
    # inspect --modules shows each attention module, which holds only the scales, as their holder (it was format
    # "?", bits "unknown": a row of unknown role)
    holders = [m for m in report.modules if "kv_scale" in m.roles]
    assert len(holders) == 2 and all(m.module.endswith("self_attn") for m in holders)
    assert all(m.format == "kv_scale" and m.parameters == 0 and m.bytes == m.roles["kv_scale"] for m in holders)
    assert sum(m.bytes for m in holders) == report.bytes_by_role["kv_scale"]
    assert not [m.module for m in report.modules if m.format.startswith("?")]
    assert main(["inspect", "--modules", str(tmp_path / "out" / "kv")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[1:] for r in rows if r and r[0] in {m.module for m in holders}] == [
        ["kv_scale", "0", f"{m.bytes:,}", "-"] for m in holders
    ]


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(method="rtn", scheme="NVFP4", calibration=None), "needs calibration data"),
        (dict(method="rtn", scheme="MXFP4A16", group_size=64, calibration=None), "fixes its own groups (32"),
        (dict(method="fp8", scheme="NVFP4A16"), "does not support scheme NVFP4A16"),
        (dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None, kv_cache={"scheme": "FP8"}), "static scales"),
        (dict(method="rtn", scheme="W4A16", kv_cache={"scheme": "NVFP4"}), "refuses group quantization of attention"),
        (dict(method="rtn", scheme="W4A16", kv_cache={"scheme": "INT8"}), "kv_cache.scheme"),
        (dict(method="gptq", scheme="MXFP4", calibration=CAL), "does not support scheme MXFP4"),
    ],
)
def test_format_recipes_refused_with_what_to_do(tmp_path, tiny_model, capsys, fields, message):
    assert main(["run", str(write_recipe(tmp_path, tiny_model, "bad", **fields))]) == 2
    assert message in capsys.readouterr().err


def test_the_format_fixes_fp4_groups_and_int4_takes_a_smaller_one(tiny_model):
    """192 input features: W4AFP8's 128 becomes 64 (smaller-group); FP4's 16 and 32 divide; FP8 block's 128 does
    not divide down_proj, which a block format keeps at 16 bits rather than change the format."""
    w4 = plan(tiny_model, method="rtn", scheme="W4AFP8", group_size=None)
    assert {g: len(v) for g, v in w4.groups.items()} == {128: 12, 64: 2}
    nv = plan(tiny_model, method="rtn", scheme="NVFP4A16", group_size=None)
    assert list(nv.groups) == [16] and not nv.kept
    blk = plan(tiny_model, method="rtn", scheme="FP8_BLOCK", group_size=None)
    assert all("the format's group of 128" in why for why in blk.kept.values()) and len(blk.kept) == 2
    assert all(n.endswith("down_proj") for n in blk.kept)
    assert set(FORMATS) == {Scheme(s) for s in FORMAT_RUNS}
    with pytest.raises(UsageError, match="group_size"):
        parse_recipe({"method": "rtn", "scheme": "NVFP4", "group_size": 16})


@pytest.mark.parametrize("kv", ["FP8", "FP8_PER_HEAD"])
def test_the_scorer_runs_the_quantized_kv_cache(tmp_path, tiny_model, capsys, kv):
    """Same weights (FP8 dynamic is data-free and deterministic), one with a quantized KV cache: the scorer's
    model quantizes K and V in attention (compressed-tensors' hook) with the stored static scales, so its logits
    equal the plain checkpoint's with a reference attention that first rounds K and V (after RoPE, before the
    GQA repeat) by the definition, K̂ = E4M3(K / s_k) · s_k and V̂ likewise, s one per tensor or per KV head;
    and they differ from the plain checkpoint's by that rounding."""
    import torch
    from safetensors.torch import load_file
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from quantize.checkpoint.loader import LastModel

    names = {"dyn": {"calibration": None}, "kv": {"kv_cache": {"scheme": kv}, "calibration": CAL}}
    for name, extra in names.items():
        recipe = write_recipe(tmp_path, tiny_model, name, method="fp8", scheme="FP8_DYNAMIC", **extra)
        run_ok(recipe, capsys)
    a, b = (load_file(str(tmp_path / "out" / n / "model.safetensors")) for n in names)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the weights are the same
    assert set(b) - set(a) == {f"model.layers.{i}.self_attn.{s}" for i in range(2) for s in ("k_scale", "v_scale")}
    assert b["model.layers.0.self_attn.k_scale"].numel() == (2 if kv == "FP8_PER_HEAD" else 1)  # 2 KV heads

    def rounded(x: Any, s: Any) -> Any:  # x (batch, kv_heads, T, head_dim), s one or one per KV head
        s = s.float().reshape(1, -1, 1, 1)
        return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s

    def reference_attention(module: Any, q: Any, k: Any, v: Any, mask: Any, **kw: Any) -> Any:
        at = f"model.layers.{module.layer_idx}.self_attn."
        k, v = rounded(k, b[at + "k_scale"]), rounded(v, b[at + "v_scale"])
        return sdpa_attention_forward(module, q, k, v, mask, **kw)

    AttentionInterface.register("kv_reference", reference_attention)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4] * 4])
    with torch.no_grad():
        scored = LastModel().get(tmp_path / "out" / "kv", dtype="float32", on="cpu")[0](input_ids=ids).logits
        plain, _ = LastModel().get(tmp_path / "out" / "dyn", dtype="float32", on="cpu")
        without = plain(input_ids=ids).logits
        plain.set_attn_implementation("kv_reference")
        torch.testing.assert_close(scored, plain(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert (scored - without).abs().max() > 1e-3


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # FP4 E2M1 magnitudes by the low three bits; bit 3 is the sign


def _fp4_reference(stored: dict, prefix: str, scheme: str) -> Any:
    """A linear's weight dequantized from its stored tensors by the formats' definitions, written here and not
    taken from compressed-tensors: two E2M1 values a byte (low nibble first), times the group scale, which is
    2^(e − 127) for MXFP4's E8M0 byte and the E4M3 scale over the FP32 global scale for NVFP4."""
    import torch

    packed = stored[prefix + "weight_packed"]
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
    magnitude = torch.tensor(E2M1)[(nibbles & 7).long()]
    values = torch.where((nibbles & 8) > 0, -magnitude, magnitude)
    s = stored[prefix + "weight_scale"]
    if scheme.startswith("MXFP4"):
        scale = torch.pow(2.0, s.float() - 127)
    else:
        scale = s.float() / stored[prefix + "weight_global_scale"].float()
    return values * scale.repeat_interleave(values.shape[1] // s.shape[1], dim=1)


def _scored_and_source(tmp_path: Any, tiny_model: Any, capsys: Any, scheme: str) -> tuple[dict, Any, Any]:
    """The tiny model converted to `scheme`: its stored tensors, the model as the scorer loads it (float32, CPU)
    and the source model in float32, to take reference weights."""
    import torch
    from safetensors.torch import load_file

    from quantize.checkpoint.loader import LastModel, load_model

    run_ok(write_recipe(tmp_path, tiny_model, scheme.lower(), **FORMAT_RUNS[scheme]), capsys)
    out = tmp_path / "out" / scheme.lower()
    scored, _ = LastModel().get(out, dtype="float32", on="cpu")
    return load_file(str(out / "model.safetensors")), scored, load_model(tiny_model, dtype=torch.float32)[0]


@pytest.mark.parametrize("scheme", ["NVFP4A16", "MXFP4A16"])
def test_scored_fp4_logits_equal_a_reference_fake_quantization(tmp_path, tiny_model, capsys, scheme):
    """The scorer's model (dequantized at load, float32) holds the reference weights: exactly for MXFP4, to bf16
    rounding for NVFP4 (compressed-tensors dequantizes in bf16). Its logits equal the source model's with those
    weights in place: nothing but the weights changes a weight-only format's forward."""
    import torch

    stored, scored, reference = _scored_and_source(tmp_path, tiny_model, capsys, scheme)
    linears = sorted(k.removesuffix("weight_packed") for k in stored if k.endswith("weight_packed"))
    assert len(linears) == 14
    with torch.no_grad():
        for prefix in linears:
            want = _fp4_reference(stored, prefix, scheme)
            got = scored.get_parameter(prefix + "weight").float()
            if scheme.startswith("MXFP4"):  # power-of-two scales: every product is exact in bf16
                assert torch.equal(got, want), prefix
            else:  # compressed-tensors dequantizes in bf16: equal to bf16 rounding (2⁻⁸ relative)
                torch.testing.assert_close(got, want, rtol=2**-8, atol=0, msg=prefix)
            reference.get_parameter(prefix + "weight").copy_(got)
        ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4] * 4])
        torch.testing.assert_close(scored(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def _fp4(x: Any) -> Any:
    """x rounded to the nearest E2M1 value (magnitudes clamped at 6; the first, smaller one at a tie)."""
    import torch

    grid = torch.tensor(E2M1)
    return torch.sign(x) * grid[(x.abs().clamp(max=6.0).unsqueeze(-1) - grid).abs().argmin(-1)]


def _act_reference(scheme: str, x: Any, stored: dict, prefix: str) -> Any:
    """A linear's input x (…, in) fake-quantized by the format's definition of its activations, per group of the
    last axis (amax = max |x| of the group):
    NVFP4    groups of 16: s = E4M3(g · amax / 6) with the stored static global scale g (input_global_scale);
             x̂ = E2M1(x · g / s) · s / g
    MXFP4    groups of 32: a power-of-two scale 2^(e − 2), e = ⌊log2 amax⌋, one power up where amax ≥ 1.75 · 2^e
             (vLLM's reference MXFP4 rounding, which compressed-tensors follows); x̂ = E2M1(x / 2^(e−2)) · 2^(e−2)
    FP8_BLOCK groups of 128, W4AFP8 one group per token: s = amax / 448; x̂ = E4M3(x / s) · s"""
    import torch

    n = {"NVFP4": 16, "MXFP4": 32, "FP8_BLOCK": 128, "W4AFP8": x.shape[-1]}[scheme]
    grp = x.reshape(*x.shape[:-1], -1, n)
    amax = grp.abs().amax(-1, keepdim=True)
    if scheme == "NVFP4":
        g = stored[prefix + "input_global_scale"].float()
        scale = (g * amax / 6.0).to(torch.float8_e4m3fn).float() / g
        q = _fp4(grp / scale) * scale
    elif scheme == "MXFP4":
        m, e = torch.frexp(amax)  # amax = m · 2^e, m in [0.5, 1)
        scale = torch.pow(2.0, (e - 1 + (m >= 0.875).int() - 2).float())
        q = _fp4(grp / scale) * scale
    else:
        scale = amax / 448.0
        q = (grp / scale).to(torch.float8_e4m3fn).float() * scale
    return q.reshape(x.shape)


def _weight_reference(scheme: str, stored: dict, prefix: str) -> Any:
    """A linear's weight from its stored tensors: FP4 as _fp4_reference; FP8 block and W4AFP8 as the stored
    E4M3 or int values times their scale (one per 128 × 128 block, or per group of the input axis)."""
    if scheme in ("NVFP4", "MXFP4"):
        return _fp4_reference(stored, prefix, scheme)
    q, s = stored[prefix + "weight"].float(), stored[prefix + "weight_scale"].float()
    if scheme == "FP8_BLOCK":
        s = s.repeat_interleave(128, 0)[: q.shape[0]].repeat_interleave(128, 1)[:, : q.shape[1]]
    else:
        s = s.repeat_interleave(q.shape[1] // s.shape[1], 1)
    return q * s


def _quantized_input(scheme: str, stored: dict, prefix: str) -> Any:
    """A forward pre-hook replacing a linear's input by _act_reference's."""
    return lambda _module, args: (_act_reference(scheme, args[0], stored, prefix),)


@pytest.mark.parametrize("scheme", ["NVFP4", "MXFP4", "FP8_BLOCK", "W4AFP8"])
def test_scored_quantized_activation_forms_equal_a_reference_fake_quantization(tmp_path, tiny_model, capsys, scheme):
    """A form that quantizes activations is scored with them quantized: the scorer's logits (loaded as a gate
    loads it, float32 on the CPU) equal the source model's with the reference weights in place and every
    quantized linear's input fake-quantized by _act_reference. NVFP4's weights are the scorer's own (equal to the
    reference to bf16 rounding, test above: compressed-tensors dequantizes them in bf16)."""
    import torch

    stored, scored, reference = _scored_and_source(tmp_path, tiny_model, capsys, scheme)
    linears = sorted(k.removesuffix("weight_scale") for k in stored if k.endswith("weight_scale"))
    assert len(linears) == (12 if scheme == "FP8_BLOCK" else 14)  # FP8 block keeps down_proj (192 inputs)
    hooks = []
    with torch.no_grad():
        for prefix in linears:
            want = _weight_reference(scheme, stored, prefix)
            if scheme == "NVFP4":
                got = scored.get_parameter(prefix + "weight").float()
                torch.testing.assert_close(got, want, rtol=2**-8, atol=0, msg=prefix)
                want = got
            reference.get_parameter(prefix + "weight").copy_(want)
            linear = reference.get_submodule(prefix.rstrip("."))
            hooks.append(linear.register_forward_pre_hook(_quantized_input(scheme, stored, prefix)))
        ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4] * 4])
        torch.testing.assert_close(scored(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        for h in hooks:
            h.remove()
        # without the activation rounding the logits move: the check above is not the weights' alone
        assert (scored(input_ids=ids).logits - reference(input_ids=ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("scheme", ["NVFP4A16", "MXFP4A16"])
def test_gptq_rounds_the_weight_only_fp4_forms(tmp_path, tiny_model, capsys, scheme):
    """GPTQ on an FP4 format stores the same layout (same bits) as round-to-nearest, with other values: on the
    calibration activations X of layer 0's q, k and v (X = RMSNorm(embed(ids)), which no quantization upstream
    changes), its output error ‖X Ŵᵀ − X Wᵀ‖² is below RTN's, the objective GPTQ minimizes (Frantar et al. 2023)."""
    import torch
    from safetensors.torch import load_file

    from quantize.checkpoint.loader import LastModel, load_model
    from quantize.convert.calibration import build_calibration
    from quantize.convert.recipe import Calibration

    meta, weights = {}, {}
    for method in ("rtn", "gptq"):
        fields = dict(method=method, scheme=scheme, calibration=CAL if method == "gptq" else None)
        meta[method] = run_ok(write_recipe(tmp_path, tiny_model, method, **fields), capsys)
        weights[method], _ = LastModel().get(tmp_path / "out" / method, dtype="float32", on="cpu")
    assert meta["gptq"]["bits"] == meta["rtn"]["bits"]
    a, b = (load_file(str(tmp_path / "out" / m / "model.safetensors")) for m in ("rtn", "gptq"))
    assert set(a) == set(b) and not torch.equal(a[k := next(k for k in a if k.endswith("weight_packed"))], b[k])
    source, tok = load_model(tiny_model, dtype=torch.float32)
    ids = build_calibration(tok, Calibration(**CAL)).input_ids
    layer = source.model.layers[0]
    with torch.no_grad():
        x = layer.input_layernorm(source.model.embed_tokens(ids)).reshape(-1, 128)  # (N·T, hidden)
        for proj in ("q_proj", "k_proj", "v_proj"):
            name = f"model.layers.0.self_attn.{proj}.weight"
            w = source.get_parameter(name)
            err = {m: ((x @ (weights[m].get_parameter(name).float() - w).T) ** 2).sum().item() for m in weights}
            assert err["gptq"] < err["rtn"], (proj, err)
