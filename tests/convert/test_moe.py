"""Mixture-of-experts conversions on tiny seeded models of each family (tests/moe_models.py, no download):
the experts planned and quantized through llm-compressor's own per-expert conversion, routers kept at 16 bits
with the reason, the calibration tokens each expert saw recorded, anything the targets cover that stays at
16 bits said in quantize.json and the summary, and our own output failing our reload check an exit 3."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from moe_models import MOE, make_tiny_moe
from safetensors import safe_open

from quantize import records
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.loader import meta_model
from quantize.cli import main
from quantize.convert.plan import ROUTER_REASON, plan_layers
from quantize.convert.recipe import parse_recipe
from quantize.records import RunRecord

ROOT = Path(__file__).resolve().parents[2]
CAL = {"source": "builtin:jargon", "samples": 2, "seq_len": 32, "seed": 0}
RECIPES = {
    "fp8": dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None),
    "gptq": dict(method="gptq", scheme="W4A16", group_size=128, indivisible="smaller-group", calibration=CAL),
}
# the families whose per-expert layout transformers 5 reloads (its conversion mapping merges per-expert tensors:
# `mlp.experts.N.gate_proj`, Mixtral's `experts.N.w1`)
RELOADED = ("qwen3_moe", "olmoe", "deepseek_v3", "mixtral")
ROUTER_OR_IGNORED = {ROUTER_REASON, "in the recipe's ignore list"}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = make_tiny_moe(tmp_path_factory.mktemp(family) / family, family)
        return built[family]

    return get


def recipe_file(tmp_path: Path, model: Path, name: str, **fields) -> Path:
    data = {"name": name, "model": str(model), "output": str(tmp_path / "out" / name), "targets": ["Linear"]}
    data |= {"ignore": ["lm_head"], **fields}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def experts_of(family: str) -> int:
    cfg = MOE[family]
    return cfg.get("num_experts") or cfg.get("num_local_experts") or cfg["n_routed_experts"]


@pytest.mark.parametrize("family", RELOADED)
def test_the_plan_lists_every_expert_as_a_linear_and_keeps_the_routers(moe_dir, family):
    """llm-compressor's conversion (on the meta model) turns each fused expert tensor into per-expert Linear
    layers the plan quantizes; every router is kept at 16 bits with the reason. On the old code the plan held
    the attention layers only (the fused experts are no Linear) and no router reason."""
    recipe = parse_recipe({"name": "p", "model": str(moe_dir(family)), **RECIPES["fp8"]})
    plan = plan_layers(meta_model(moe_dir(family), False), recipe, linearize_experts=True)  # llm-compressor's
    planned = [n for names in plan.groups.values() for n in names]
    moe_layers = 1 if family == "deepseek_v3" else 2  # DeepSeek-V3's first layer is dense (first_k_dense_replace)
    for i in range(moe_layers):
        layer = 1 if family == "deepseek_v3" else i
        experts = [n for n in planned if f"layers.{layer}." in n and ".experts." in n]
        assert len(experts) == 3 * experts_of(family), experts  # gate, up and down of every expert
    routers = [n for n, why in plan.kept.items() if why == ROUTER_REASON]
    assert len(routers) == moe_layers and not set(routers) & set(planned)
    assert plan.unconverted == {}  # llm-compressor converts every one of these families' fused experts
    assert plan.record().kept_16bit == plan.kept


def test_a_text_only_llama_4_is_planned_per_expert(moe_dir):
    """A text-only Llama 4 (llama4_text): llm-compressor 0.14's Llama 4 expert conversion reads the multimodal
    config's text_config, so the plan refused it (exit 2) and no recipe ran; it is now handed the text config
    (compat.llmcompressor.text_only_llama4), every expert's gate, up and down are planned, the routers kept."""
    recipe = parse_recipe({"name": "p", "model": str(moe_dir("llama4_text")), **RECIPES["fp8"]})
    plan = plan_layers(meta_model(moe_dir("llama4_text"), False), recipe, linearize_experts=True)
    planned = [n for names in plan.groups.values() for n in names]
    for layer in range(2):
        experts = [n for n in planned if f"layers.{layer}.feed_forward.experts." in n]
        assert len(experts) == 3 * experts_of("llama4_text"), experts
    assert sorted(n for n, why in plan.kept.items() if why == ROUTER_REASON) == [
        f"model.layers.{i}.feed_forward.router" for i in range(2)
    ]
    assert plan.unconverted == {}


@pytest.mark.parametrize("method", list(RECIPES))
def test_a_text_only_llama_4_converts_and_transformers_reads_it_as_we_do(tmp_path, moe_dir, capsys, method):
    """Llama 4's experts quantized (transformers' quantizer reads a compressed-tensors Llama 4 one expert at a time:
    compat.transformers.quantized_per_expert), stored per expert, and read by transformers' own loader to the same
    logits, bit for bit, as quantize's per-expert loader reads them; finite."""
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import load_model

    recipe = recipe_file(tmp_path, moe_dir("llama4_text"), f"l4-{method}", **RECIPES[method])
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / "out" / f"l4-{method}"
    assert bits_report(out).bytes_by_part["routed_experts"]["bits_per_weight"] < (9 if method == "fp8" else 5)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert "model.layers.0.feed_forward.experts.3.down_proj.weight_scale" in names
    assert not [n for n in names if n.endswith("experts.gate_up_proj")]
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    theirs, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours, _ = load_model(out, False, dtype=torch.float32)
    with torch.no_grad():
        a, b = ours(input_ids=ids).logits, theirs(input_ids=ids).logits
    assert torch.isfinite(a).all() and torch.equal(a, b)
    routing = records.read(RunRecord, out / "quantize.json").layer_plan.routing
    if method == "gptq":  # every expert runs on its own copy of the tokens, zero where the router did not choose it
        assert [r.module for r in routing] == [f"model.layers.{i}.feed_forward.experts" for i in range(2)]
        for r in routing:
            assert r.tokens == CAL["samples"] * CAL["seq_len"] and r.top_k == 1  # num_experts_per_tok
            assert sum(r.routed_tokens) == r.tokens and len(r.routed_tokens) == experts_of("llama4_text")
    else:
        assert routing == []


def test_llama_4_with_a_nope_layer_takes_an_fp8_kv_cache(tmp_path, capsys):
    """Llama 4's NoPE layers (no_rope_layers 0) read the cache's length for temperature tuning; compressed-tensors'
    quantized KV cache, standing in for the cache during calibration, had no answer there (exit 3,
    AttributeError 'get_seq_length'). FP8 weights and KV now convert, with the KV scales stored for both layers."""
    from families import save_random
    from moe_models import MOE_COMMON
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("llama4_text", **{**MOE_COMMON, **MOE["llama4_text"], "no_rope_layers": [1, 0]})
    source = save_random(cfg, tmp_path / "l4-nope")
    fields = RECIPES["fp8"] | {"calibration": CAL, "kv_cache": {"scheme": "FP8"}}
    recipe = recipe_file(tmp_path, source, "l4-kv", **fields)
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    with safe_open(str(tmp_path / "out" / "l4-kv" / "model.safetensors"), "pt") as f:
        assert {f"model.layers.{i}.self_attn.k_scale" for i in range(2)} <= set(f.keys())


def test_llama_4_experts_left_at_16_bits_stay_per_expert(tmp_path, moe_dir, capsys):
    """With Llama 4's experts in `ignore` they are written per expert at 16 bits, the layout transformers reads for
    a compressed-tensors Llama 4 (fused, as llm-compressor's repack would write them, transformers reported every
    expert missing: exit 3 at our reload check)."""
    ignore = ["lm_head", "re:.*\\.experts\\..*"]
    recipe = recipe_file(tmp_path, moe_dir("llama4_text"), "l4-ign", **RECIPES["fp8"] | {"ignore": ignore})
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    with safe_open(str(tmp_path / "out" / "l4-ign" / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.1.feed_forward.experts.0.up_proj.weight").get_dtype() == "BF16"


@pytest.mark.parametrize("family", RELOADED)
@pytest.mark.parametrize("method", list(RECIPES))
def test_an_moe_converts_with_its_experts_quantized_and_reloads(tmp_path, moe_dir, capsys, family, method):
    """Exit 0; the checkpoint reloads with plain transformers and gives finite logits; the routed experts are at
    quantized bits (the old code left them at 16 bits under FP8 and refused its own output under GPTQ)."""
    import torch
    from transformers import AutoModelForCausalLM

    recipe = recipe_file(tmp_path, moe_dir(family), f"{family}-{method}", **RECIPES[method])
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / "out" / f"{family}-{method}"
    meta = records.read(RunRecord, out / "quantize.json")
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # a missing key is filled at random
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits).all()
    experts = bits_report(out).bytes_by_part["routed_experts"]
    assert experts["bits_per_weight"] < (9 if method == "fp8" else 5)
    # every quantized expert is matched by a target under the name the checkpoint stores it by, which is how vLLM
    # names its modules (Mixtral's targets said `.mlp.`, transformers' name, for `.block_sparse_moe.` tensors)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    targets = [t for g in qc["config_groups"].values() for t in g["targets"]]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        stored = {k.rsplit(".", 1)[0] for k in f.keys() if ".experts." in k}  # noqa: SIM118 (a safe_open has no __iter__)
    assert stored and all(any(_matches(t, m) for t in targets) for m in stored), sorted(stored)[:3]
    # the routers and the ignored lm_head, nothing else the targets cover, stay at 16 bits, said in quantize.json by
    # the names the file stores them under (Mixtral's `block_sparse_moe.gate`: before, transformers' `mlp.gate`)
    left = {g.why: g for g in meta.layer_plan.left_16bit}
    assert set(left) == ROUTER_OR_IGNORED
    part = "block_sparse_moe" if family == "mixtral" else "mlp"
    routers = [f"model.layers.{i}.{part}.gate.weight" for i in range(2) if not (family == "deepseek_v3" and i == 0)]
    # with DeepSeek-V3's routing-correction bias on its router (before: left out), a router's too
    corrections = ["model.layers.1.mlp.gate.e_score_correction_bias"] if family == "deepseek_v3" else []
    assert left[ROUTER_REASON].tensors == routers + corrections
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {t for g in left.values() for t in g.tensors} <= set(f.keys())
        held = sum(f.get_tensor(t).nbytes for t in corrections)
    assert left[ROUTER_REASON].bytes == 2 * 4 * 64 * len(routers) + held
    if method == "gptq":  # calibration: every expert of every MoE layer saw tokens, counted from the router
        assert meta.layer_plan.routing
        for r in meta.layer_plan.routing:
            assert len(r.routed_tokens) == experts_of(family) and r.all_experts_calibrated
            assert sum(r.routed_tokens) == r.tokens * r.top_k and r.tokens == CAL["samples"] * CAL["seq_len"]
    else:
        assert meta.layer_plan.routing == []  # data-free: no calibration tokens to count


def test_fused_only_experts_are_refused_quantized_and_kept_fused_when_ignored(tmp_path, moe_dir, capsys):
    """gpt-oss: transformers reads its experts only as fused tensors, with no quantized form, and llm-compressor
    writes quantized experts per expert, which vLLM 0.34.0 does not read either (docs/vllm-loading.md Q8), so
    quantizing them is refused before loading (exit 2, giving both engines' reasons, vLLM's file and function
    too, and saying what to do); with them in `ignore` the rest is
    quantized, the experts are written back fused at 16 bits (llm-compressor's repack_moe), the checkpoint
    reloads, and the experts' bytes are listed as left at 16 bits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = moe_dir("gpt_oss")
    assert main(["run", str(recipe_file(tmp_path, model, "oss", **RECIPES["fp8"])), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "gpt_oss: llm-compressor would write" in err and "only as fused" in err and "to `ignore`" in err
    assert "vLLM 0.34.0 does not read its quantized experts" in err and "gpt_oss.py, GptOssModel" in err
    assert not (tmp_path / "out" / "oss").exists()
    ignore = ["lm_head", "re:.*\\.experts\\..*"]
    recipe = recipe_file(tmp_path, model, "oss-kept", **{**RECIPES["fp8"], "ignore": ignore})
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / "out" / "oss-kept"
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    logits = model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits
    assert torch.isfinite(logits).all()
    meta = records.read(RunRecord, out / "quantize.json")
    [fused] = [g for g in meta.layer_plan.left_16bit if "only fused" in g.why]
    # the fused experts' biases with them (before: left out, their bytes unsaid)
    projections = [f"{p}{b}" for p in ("gate_up_proj", "down_proj") for b in ("", "_bias")]
    assert sorted(fused.tensors) == sorted(f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in projections)
    assert fused.bytes == bits_report(out).bytes_by_part["routed_experts"]["bytes"]


@pytest.mark.parametrize(
    "fields",
    [
        dict(method="rtn", scheme="NVFP4A16", calibration=None),
        dict(method="rtn", scheme="W4A16", group_size=64, symmetric=False, calibration=None),
    ],
)
def test_experts_in_a_layout_transformers_cannot_reload_convert_and_reload_through_our_loader(
    tmp_path, moe_dir, capsys, fields
):
    """transformers 5 reloads quantized experts only as FP8 per-channel/tensor or packed symmetric int weights; every
    other expert scheme (NVFP4A16; asymmetric int, with a zero point per expert) was refused at the plan. quantize
    reads them through its own per-expert loader now: the run passes its reload check (exit 0), and a loaded expert
    holds what compressed-tensors' own decompression gives of its stored tensors (zero points included)."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from safetensors import safe_open

    from quantize.checkpoint.loader import load_model

    recipe = recipe_file(tmp_path, moe_dir("qwen3_moe"), "experts", **fields)
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / "out" / "experts"
    model, _ = load_model(out)
    name = "model.layers.1.mlp.experts.3.down_proj"
    expert = model.get_submodule(name)
    scheme = expert.quantization_scheme
    assert scheme.weights.symmetric is fields.get("symmetric", True)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        state = {k[len(name) + 1 :]: f.get_tensor(k) for k in f.keys() if k.startswith(f"{name}.")}  # noqa: SIM118
    assert ("weight_zero_point" in state) is not scheme.weights.symmetric
    assert scheme.weights.symmetric or state["weight_zero_point"].any()
    dense = BaseCompressor.get_value_from_registry(scheme.format).decompress(state, scheme)["weight"]
    assert torch.equal(expert.weight, dense)


def _skipping(monkeypatch, planted: str) -> None:
    """The llm-compressor backend with `planted` dropped from its modifier's targets (a backend that skips a layer
    the plan quantizes)."""
    import quantize.convert.backends.llmcompressor as backend

    compile_modifiers = backend.compile_modifiers

    def skipping(recipe, plan):
        mods = compile_modifiers(recipe, plan)
        for group in mods[0].config_groups.values():  # targets name each planned module, plainly or as a regex
            group.targets = [t for t in group.targets if t not in (planted, f"re:^{re.escape(planted)}$")]
        return mods

    monkeypatch.setattr(backend, "compile_modifiers", skipping)


def test_a_planned_layer_left_at_16_bits_is_said(tmp_path, tiny_model, capsys, monkeypatch):
    """A layer the plan quantizes but the backend skips (planted) is listed in quantize.json's left_16bit (which
    tensors, how many bytes, why) and in the run's summary."""
    planted = "model.layers.0.mlp.down_proj"
    _skipping(monkeypatch, planted)
    recipe = recipe_file(tmp_path, tiny_model, "planted", **RECIPES["fp8"])
    assert main(["run", str(recipe)]) == 0
    said = capsys.readouterr().out
    out = tmp_path / "out" / "planted"
    meta = json.loads((out / "quantize.json").read_text())
    [skipped] = [g for g in meta["layer_plan"]["left_16bit"] if g["why"].startswith("planned for quantization")]
    assert skipped["tensors"] == [f"{planted}.weight"]
    with safe_open(out / "model.safetensors", "pt") as f:
        stored = f.get_slice(f"{planted}.weight")
        assert stored.get_dtype() in ("BF16", "F16") and f"{planted}.weight_scale" not in set(f.keys())
        assert skipped["bytes"] == 2 * stored.get_shape()[0] * stored.get_shape()[1]
    assert "left at 16 bits: 1 tensor(s)" in said and planted in said and "planned for quantization" in said


def test_an_expert_stored_unlike_its_config_is_refused(tmp_path, moe_dir, capsys):
    """An FP8 checkpoint with one expert stored at 16 bits and no scale: `quantize eval` is exit 2 from the headers,
    naming it, before anything loads. (transformers stacks a layer's experts and read such layouts misaligned, one
    expert uninitialized, at times NaN; vLLM reads every expert with expert 0's scheme.)"""
    import shutil

    from safetensors.torch import load_file, save_file

    planted = "model.layers.1.mlp.experts.2.down_proj"
    recipe = recipe_file(tmp_path, moe_dir("qwen3_moe"), "fp8", **RECIPES["fp8"])
    assert main(["run", str(recipe), "--quiet"]) == 0
    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "out" / "fp8", mixed)
    tensors = load_file(mixed / "model.safetensors")
    scale = tensors.pop(f"{planted}.weight_scale")
    tensors[f"{planted}.weight"] = (tensors[f"{planted}.weight"].float() * scale.float()).bfloat16()
    save_file(tensors, mixed / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(mixed), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{planted}.weight_scale is missing" in err and "do not match config.json or each other" in err, err


def test_our_own_output_that_does_not_reload_is_exit_3(tmp_path, tiny_model, capsys, monkeypatch):
    """A checkpoint this run wrote that the reload check refuses (planted: a stored tensor renamed after the
    save) is quantize's failure, exit 3 naming the reason, never the user's exit 2; nothing is kept."""
    from safetensors.torch import load_file, save_file

    from quantize.convert.backends.llmcompressor import LLMCompressorBackend

    save = LLMCompressorBackend.save

    def renaming(self, model, folder):
        save(self, model, folder)
        f = folder / "model.safetensors"
        tensors = load_file(f)
        tensors["model.layers.0.mlp.up_proj.renamed"] = tensors.pop("model.layers.0.mlp.up_proj.weight_scale")
        save_file(tensors, f, metadata={"format": "pt"})

    monkeypatch.setattr(LLMCompressorBackend, "save", renaming)
    recipe = recipe_file(tmp_path, tiny_model, "unreloadable", **RECIPES["fp8"])
    assert main(["run", str(recipe), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "does not reload" in err and "quantize's failure" in err and "up_proj" in err
    assert not (tmp_path / "out" / "unreloadable").exists()


def _matches(target: str, module: str) -> bool:
    """compressed-tensors' (and vLLM's) rule: an exact module name, or a `re:` pattern matched from the start."""
    return re.match(target[3:], module) is not None if target.startswith("re:") else target == module


# --- refusals before anything converts: the streamed path, and experts that do not match config.json -------------


def test_an_moe_on_the_streamed_path_is_refused_before_anything_loads(tmp_path, moe_dir, capsys, monkeypatch):
    """A clean Qwen3-MoE with `streaming: on`: exit 2 naming the field, why (the streamed path does not convert
    experts) and what to use (the in-memory path), before the source is read; with `streaming: auto` and too
    little memory for the in-memory path the refusal says streaming is not possible and why. Before: the whole
    model streamed, then exit 3 ("experts.gate_up_proj is missing") from the streamed structure check."""
    from quantize.convert.backends.llmcompressor import LLMCompressorBackend

    def called(*_a, **_k):
        raise AssertionError("the source was loaded or converted")

    monkeypatch.setattr(LLMCompressorBackend, "load", called)
    monkeypatch.setattr(LLMCompressorBackend, "stream", called)
    model = moe_dir("qwen3_moe")
    assert main(["run", str(recipe_file(tmp_path, model, "on", streaming="on", **RECIPES["fp8"])), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "streaming: on, but this model cannot stream: it is a mixture-of-experts model" in err
    assert "num_local_experts: 4 routed experts" in err and "Set `streaming: off`" in err and "in-memory path" in err
    assert not (tmp_path / "out" / "on").exists()
    recipe = recipe_file(tmp_path, model, "auto", streaming="auto", **RECIPES["fp8"])
    assert main(["run", str(recipe), "--quiet", "--max-memory", "100MiB"]) == 2
    err = capsys.readouterr().err
    assert "in-memory path" in err and "streaming is not possible (it is a mixture-of-experts model" in err


def _expert_missing(t):
    del t["model.layers.1.mlp.experts.3.up_proj.weight"]


def _expert_extra(t):
    t |= {
        f"model.layers.1.mlp.experts.4.{p}.weight": t[f"model.layers.1.mlp.experts.0.{p}.weight"].clone() for p in PROJ
    }


def _expert_misshapen(t):
    t["model.layers.1.mlp.experts.2.down_proj.weight"] = t["model.layers.1.mlp.experts.2.down_proj.weight"][:, :32]


PROJ = ("gate_proj", "up_proj", "down_proj")
EXPERT_EDITS = {
    "missing": (_expert_missing, "model.layers.1.mlp.experts.3.up_proj.weight is missing"),
    "extra": (_expert_extra, "model.layers.1.mlp.experts.4 is an expert past the last"),
    "misshapen": (_expert_misshapen, "model.layers.1.mlp.experts.2.down_proj.weight has shape [64, 32]"),
}


@pytest.mark.parametrize("case", list(EXPERT_EDITS))
def test_experts_that_do_not_match_config_json_are_exit_2_before_torch_in_run_and_eval(tmp_path, moe_dir, case):
    """An expert's tensor missing, an expert past config.json's count, an expert of another shape than its fellows:
    `quantize run` (either path) and `quantize eval` stop with exit 2 naming the tensor from the safetensors
    headers, before torch is imported (about 0.4 s here). Before: exit 3 after 8-11 s, when transformers' loader
    failed to merge the experts (run in memory, eval) or the streamed output did not match the model."""
    import shutil

    from safetensors.torch import load_file, save_file

    edit, named = EXPERT_EDITS[case]
    src = tmp_path / case
    shutil.copytree(moe_dir("qwen3_moe"), src)
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, src / "model.safetensors", metadata={"format": "pt"})
    code = "import sys; from quantize.cli import main; rc = main(sys.argv[1:]); print('torch' in sys.modules, rc)"
    for argv in (
        ["run", str(recipe_file(tmp_path, src, case, streaming="off", **RECIPES["fp8"])), "--quiet"],
        ["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(src), "--quiet"],
    ):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT)
        assert done.stdout.split() == ["False", "2"], (argv[0], done.stderr[-2000:])
        assert named in done.stderr and "do not match config.json" in done.stderr, done.stderr
    assert not (tmp_path / "out" / case).exists()


@pytest.mark.parametrize("family", list(MOE))
def test_every_families_experts_match_their_config_json(moe_dir, family):
    """The expert check reads each family's count and width from config.json (EXPERT_WIDTH_KEYS: Qwen3-MoE's and
    DeepSeek-V3's moe_intermediate_size beside a dense MLP of another width, intermediate_size for the others) and
    finds nothing on a clean checkpoint of every family, per-expert or fused; the width it reads is the one
    transformers' own model gives its experts (the meta model's fused expert tensors)."""
    from quantize.checkpoint.architecture import _width, expert_problems, text_config
    from quantize.checkpoint.files import read_config, safetensors_files
    from quantize.checkpoint.headers import all_tensors

    src = moe_dir(family)
    cfg = read_config(src)
    tensors, _ = all_tensors(safetensors_files(src))
    assert expert_problems(cfg, {n: (t.shape, t.dtype) for n, t in tensors.items()}) == []
    key, width = _width(text_config(cfg))
    fused = [p for n, p in meta_model(src, False).named_parameters() if n.endswith("experts.down_proj")]
    assert fused and all(width in p.shape[1:] and cfg["hidden_size"] in p.shape[1:] for p in fused), (key, width)


def test_an_moe_whose_output_could_only_get_the_streamed_checks_is_refused_before_loading(tmp_path):
    """The streamed checks compare an output with transformers' fused experts and refuse every MoE conversion's
    per-expert layout: an MoE whose full reload check does not fit the budget (8 layers of 16 experts, headers
    only, GPTQ with its weights offloaded) is refused by the plan, naming the reload's need, instead of converting
    and then failing with exit 3; with the memory for the reload it is planned, reload included."""
    import importlib.util

    from quantize.convert import memory
    from quantize.errors import UsageError

    spec = importlib.util.spec_from_file_location("scale", ROOT / "benchmarks" / "scale.py")
    scale = importlib.util.module_from_spec(spec)
    sys.modules["scale"] = scale  # dataclasses look their module up
    spec.loader.exec_module(scale)
    src = tmp_path / "moe"
    src.mkdir()
    hidden, width, experts = 1024, 512, 16
    tensors = [("model.embed_tokens.weight", [4096, hidden]), ("lm_head.weight", [4096, hidden])]
    for i in range(8):
        p = f"model.layers.{i}."
        tensors += [(p + f"self_attn.{n}_proj.weight", [hidden, hidden]) for n in "qkvo"]
        tensors += [(p + "mlp.gate.weight", [experts, hidden])]
        for e in range(experts):
            tensors += [(p + f"mlp.experts.{e}.{n}_proj.weight", [width, hidden]) for n in ("gate", "up")]
            tensors += [(p + f"mlp.experts.{e}.down_proj.weight", [hidden, width])]
    scale.write_shard(src / "model.safetensors", tensors, sparse=True)
    cfg = dict(model_type="qwen3_moe", hidden_size=hidden, moe_intermediate_size=width, num_experts=experts)
    cfg |= dict(num_experts_per_tok=2, num_hidden_layers=8, num_attention_heads=8, vocab_size=4096, dtype="bfloat16")
    (src / "config.json").write_text(json.dumps(cfg))
    gptq = dict(method="gptq", scheme="W4A16", group_size=128, offload="on")
    gptq["calibration"] = {"source": "builtin:jargon", "samples": 8, "seq_len": 128}
    recipe = parse_recipe({"model": str(src), **gptq})
    free = memory.plan(recipe, src)
    reload = free.phases["full reload check"]
    assert free.path == "offloaded" and free.full_reload and reload > free.phases["conversion"]
    with pytest.raises(UsageError, match=r"full reload check of its output would need about .* do not check experts"):
        memory.plan(recipe, src, max_memory=(free.phases["conversion"] + reload) // 2)
    assert memory.plan(recipe, src, max_memory=reload).full_reload
