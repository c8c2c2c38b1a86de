"""The shipped recipes on the late-2026 families (tests/families.py: HYBRID, and ERNIE 4.5's MoE in MOE), issue #57:
each converts, or is refused before anything loads for a reason of the format, the algorithm or a library's version
(exit 2), never quantize's own exit 3; and what the written checkpoint stores at 16 bits is what quantize.json's
`layer_plan.left_16bit` says, tensor by tensor, read from the file's headers."""

from __future__ import annotations

import math
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from families import HYBRID, build

from quantize import records
from quantize.checkpoint.accounting import METADATA_ROLES, bits_report, role_of
from quantize.checkpoint.files import safetensors_files
from quantize.checkpoint.headers import all_tensors
from quantize.cli import main
from quantize.convert.plan import NOT_LINEAR, ROUTER_REASON
from quantize.convert.render import run_text
from quantize.records import RunRecord

from conftest import ROOT


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """family -> its tiny checkpoint, built once per module on first use."""
    root = tmp_path_factory.mktemp("late")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build(family, root / family)
        return built[family]

    return get


DROP = object()  # a `run` change that removes the field


def run(tmp_path: Path, source: Path, recipe: str, capsys, **changes) -> tuple[int, str, Path]:
    """`quantize run` of the shipped recipe pointed at `source` (with `changes` to its fields, DROP removing one): exit
    code, stderr, output folder."""
    data = yaml.safe_load((ROOT / "recipes" / f"{recipe}.yaml").read_text())
    out = tmp_path / recipe
    path = tmp_path / f"{recipe}.yaml"
    data = {k: v for k, v in (data | changes).items() if v is not DROP}
    path.write_text(yaml.safe_dump(data | {"model": str(source), "output": str(out)}))
    code = main(["run", str(path), "--quiet"])
    return code, capsys.readouterr().err, out


def stored_at_16(out: Path) -> dict[str, str]:
    """Every 16- or 32-bit float tensor the checkpoint stores, by the name the file stores it under, with its
    accounting role."""
    found, _ = all_tensors(safetensors_files(out))
    names = set(found)
    return {name: role_of(name, t, names) for name, t in found.items() if t.dtype in ("BF16", "F16", "F32")}


def exempt_at_16(out: Path) -> set[str]:
    """The 16- or 32-bit tensors left_16bit need not list, as docs/moe.md says: norms, the input and output
    embeddings, the quantized layers' metadata (scales, a KV cache's scales), and the bias of a layer stored
    quantized (its weight beside a scale), by their accounting role."""
    found, _ = all_tensors(safetensors_files(out))
    exempt_roles = ("norm", "embedding", "lm_head", *METADATA_ROLES)
    return {
        n
        for n, role in stored_at_16(out).items()
        if role in exempt_roles or (role == "bias" and f"{n.rpartition('.')[0]}.weight_scale" in found)
    }


def unmatched_quantized(out: Path) -> list[str]:
    """The modules the checkpoint stores quantized (a weight_scale beside them) that no config-group target of its
    config.json names by their stored name, as compressed-tensors matches a name (compat's copy of its rule)."""
    from quantize.checkpoint.files import read_config
    from quantize.compat.compressed_tensors_targets import first_target

    groups = read_config(out)["quantization_config"]["config_groups"].values()
    targets = [t for g in groups for t in g["targets"]]
    found, _ = all_tensors(safetensors_files(out))
    quantized = {n.removesuffix(".weight_scale") for n in found if n.endswith(".weight_scale")}
    return sorted(m for m in quantized if first_target(m, targets) is None)


def loads_in_transformers(out: Path) -> None:
    """transformers' own loader reads the checkpoint with no key missing (a missing one it fills at random) and none
    unexpected (one it drops): what docs/moe.md and docs/families.md say of every output of these families."""
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (
        sorted(info["missing_keys"])[:3],
        sorted(info["unexpected_keys"])[:3],
    )


# transformers reads Granite 4's routed experts only fused (its mapping renames block_sparse_moe.input_linear to
# experts.gate_up_proj and merges nothing): quantized, they are written per expert, which vLLM and quantize's own
# loader read and transformers' does not; in `ignore`, they are written back fused
GRANITE_KEPT = {"ignore": ["lm_head", "re:.*\\.experts\\..*"]}


def left(meta: RunRecord) -> dict[str, str]:
    """left_16bit as tensor -> why."""
    return {t: g.why for g in meta.layer_plan.left_16bit for t in g.tensors}


# the families whose fp8-e4m3 conversion takes over a few seconds here run in the slow suite; MiniMax-M2 stores its
# router as block_sparse_moe.gate (transformers renames it mlp.gate on load: left_16bit said the latter), GLM-4-MoE
# as mlp.gate
SLOW_LEFT = {"qwen3_next", "kimi_linear", "deepseek_v32", "qwen3_5_text"}
CONVERTED = [*HYBRID, "minimax_m2", "glm4_moe"]


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_LEFT else f for f in CONVERTED]
)
def test_left_at_16_bits_is_what_the_file_stores(tmp_path, source, capsys, family):
    """FP8 dynamic on each hybrid family: every recurrent-state parameter, convolution kernel and per-layer
    embedding the file stores at 16 bits is listed in left_16bit with its reason (before: none was, and the
    summary said nothing of them), every router too (Granite 4's `block_sparse_moe.router`, no Linear, was neither
    quantized nor listed), and everything listed is stored at 16 bits. transformers' own loader reads the output
    with no key missing or unexpected, but Granite 4's, whose experts are written per expert (below)."""
    code, err, out = run(tmp_path, source(family), "fp8-e4m3", capsys)
    assert code == 0, err
    if family != "granitemoehybrid":  # Granite 4's quantized experts: read by our loader (the test below)
        loads_in_transformers(out)
    meta = records.read(RunRecord, out / "quantize.json")
    listed, stored = left(meta), stored_at_16(out)
    assert set(listed) <= set(stored)  # nothing is listed that the file does not store at 16 bits
    # everything else the file stores at 16 bits is listed (before: Falcon-H1's mamba.conv1d.bias, GLM-4-MoE's
    # mlp.gate.e_score_correction_bias and MiniMax-M2's block_sparse_moe.e_score_correction_bias were not); of the
    # exempt ones only a per-layer embedding (the plan's) and an output layer the recipe ignores are
    exempt = exempt_at_16(out)
    assert set(listed) == (set(stored) - exempt) | {n for n in listed if stored[n] in ("embedding", "lm_head")}
    for name in listed:
        module = name.rpartition(".")[0]
        if name.endswith(".bias") and f"{module}.weight" in listed:  # a kept layer's bias: the layer's reason
            assert listed[name] == listed[f"{module}.weight"], name
        if name.endswith("e_score_correction_bias"):  # a routing-correction bias: a router's
            assert listed[name] == ROUTER_REASON, name
    assert not [n for n, why in listed.items() if why.startswith("no rule")]  # each has a reason of the plan's
    for name, role in stored.items():
        if role in ("state", "conv"):
            assert listed.get(name) == NOT_LINEAR[role], name
    per_layer = [n for n in stored if stored[n] == "embedding" and "per_layer" in n]
    assert all(listed.get(n) == NOT_LINEAR["embedding"] for n in per_layer), per_layer
    assert (family == "gemma4_text") == bool(per_layer)
    routers = [n for n in stored if re.search(r"\.(gate|router)\.weight$", n) and "shared_expert_gate" not in n]
    assert all(listed.get(n) == ROUTER_REASON for n in routers), routers
    if family == "granitemoehybrid":  # its router, a weight of its own (no Linear), was neither quantized nor said
        kept = meta.layer_plan.kept_16bit
        assert all(kept.get(f"model.layers.{i}.block_sparse_moe.router") == ROUTER_REASON for i in range(4))
        # listed as the file stores it (the model's block_sparse_moe.router.weight, renamed by transformers on load)
        assert all(listed.get(f"model.layers.{i}.block_sparse_moe.router.layer.weight") for i in range(4))
    # the summary's "kept at 16 bits" counts them (before: "0 kept at 16 bits" beside unlisted 16-bit weights): each
    # reason listed but the ignore list's is a kept entry's (a kept layer's bias is listed, not counted apart)
    kept = meta.layer_plan.kept_16bit
    assert set(listed.values()) - {"in the recipe's ignore list"} <= set(kept.values())


def test_kimi_linear_converts_and_reads_back_its_merged_convolutions(tmp_path, source, capsys):
    """Kimi-Linear stores each KDA layer's convolution as q_conv1d, k_conv1d and v_conv1d, which transformers
    concatenates into the model's conv1d on load; quantize's per-expert loader now does the same (before: every
    recipe was exit 3, "the checkpoint this run wrote does not reload", the three stored as unexpected and conv1d
    missing). The kernels read back are the source's."""
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import load_model

    code, err, out = run(tmp_path, source("kimi_linear"), "fp8-e4m3", capsys)
    assert code == 0, err
    # every quantized module is named by a config group under the name the file stores it by (vLLM's and inspect's
    # reading; transformers' self_attn.forget_gate.f_a_proj is stored self_attn.f_a_proj)
    assert not unmatched_quantized(out)
    ours, _ = load_model(out, False)
    theirs = AutoModelForCausalLM.from_pretrained(str(source("kimi_linear")))
    for i in (0, 2):  # the KDA layers (families.MIXED)
        key = f"model.layers.{i}.self_attn.conv1d.weight"
        assert torch.equal(ours.state_dict()[key], theirs.state_dict()[key].to(ours.state_dict()[key].dtype))


@pytest.mark.slow  # GPTQ through llm-compressor's sequential pipeline: about a minute here
def test_gemma_4_gptq_quantizes_its_per_layer_projection(tmp_path, source, capsys):
    """Gemma 4's model-level per_layer_model_projection runs inside code llm-compressor 0.14's tracer leaves
    untraced: GPTQ gathered its Hessian but never observed its weight, and stopped with "No statistics available"
    (exit 3). Its weight is now observed before GPTQ compresses it: the layer is quantized like the others."""
    code, err, out = run(tmp_path, source("gemma4_text"), "gptq-w4a16-g128", capsys)
    assert code == 0, err
    found, _ = all_tensors(safetensors_files(out))
    assert "model.per_layer_model_projection.weight_packed" in found
    assert "model.per_layer_model_projection.weight" not in found
    meta = records.read(RunRecord, out / "quantize.json")
    assert [c.finite for c in meta.finite_checks] == [True]


@pytest.mark.parametrize(
    "family,why",
    [
        ("gemma4_text", "from one head_dim"),  # per-layer head sizes: compressed-tensors' get_head_dim raises
        ("deepseek_v32", "not `update_indexer`"),  # the indexer's keys: QuantizedKVCache has no update_indexer
    ],
)
def test_a_kv_cache_the_library_cannot_hold_is_refused_before_loading(tmp_path, source, capsys, family, why):
    """FP8 KV on Gemma 4 and DeepSeek-V3.2 stopped inside calibration (exit 3); compressed-tensors' KV cache cannot
    hold either model's cache, so the recipe is refused before the model loads (exit 2), naming the library's
    version and what to do."""
    code, err, out = run(tmp_path, source(family), "fp8-kv", capsys)
    assert code == 2, err
    assert why in err and f"compressed-tensors {version('compressed-tensors')}" in err
    assert "Nothing was loaded" in err and "Drop `kv_cache:`" in err
    assert not out.exists()


def test_ernie_4_5_experts_are_quantized_and_nothing_else_is_left_unsaid(tmp_path, source, capsys):
    """ERNIE 4.5's config spells its expert count moe_num_experts and k moe_k: its routed experts are quantized
    (they were left at BF16, 69% of the bytes, with "0 kept at 16 bits" said), only its router and lm_head stay at
    16 bits, and both are said."""
    code, err, out = run(tmp_path, source("ernie4_5_moe"), "fp8-e4m3", capsys)
    assert code == 0, err
    loads_in_transformers(out)
    experts = bits_report(out).bytes_by_part["routed_experts"]
    assert 8 * experts["bytes"] / experts["parameters"] < 8.2
    meta = records.read(RunRecord, out / "quantize.json")
    assert set(left(meta).values()) == {ROUTER_REASON, "in the recipe's ignore list"}
    assert not [n for n in stored_at_16(out) if ".experts." in n and n.endswith("weight")]


def test_config_fields_are_read_as_the_config_class_names_them(monkeypatch):
    """The plan reads a family's config through its transformers class (its attribute_map and properties): with
    the light readers' copy of the attribute maps emptied, ERNIE's and Nemotron-H's experts, k and layer count are
    still found (config.to_dict alone finds none)."""
    import families

    from quantize.checkpoint import architecture
    from quantize.compat import transformers_config_names
    from quantize.convert.plan import config_fields

    monkeypatch.setattr(transformers_config_names, "ATTRIBUTE_MAPS", {})
    ernie = families.config("ernie4_5_moe")
    assert architecture.moe_spec(ernie.to_dict()) is None
    spec = architecture.moe_spec(config_fields(ernie))
    assert (spec.experts, spec.top_k, spec.layers) == (4, 2, (1,))
    nemotron = config_fields(families.config("nemotron_h"))
    assert "num_hidden_layers" not in families.config("nemotron_h").to_dict()
    assert nemotron["num_hidden_layers"] == 4 and nemotron["layer_types"][3] == "moe"
    assert architecture.moe_spec(nemotron).layers == (3,)


def test_the_light_readers_spell_config_fields_as_the_config_classes_do():
    """config.json as transformers 5.17 saves ERNIE 4.5, Kimi-Linear and Nemotron-H (their stored names: moe_k,
    num_experts_per_token, layers_block_type, n_routed_experts) is read without transformers, from the copied
    attribute maps: the same experts, k and layer count as the config classes give; a family the copy does not
    know reads the common names only."""
    import families

    from quantize.checkpoint import architecture
    from quantize.convert.plan import config_fields

    for family in ("ernie4_5_moe", "kimi_linear", "nemotron_h", "granitemoehybrid", "deepseek_v3", "qwen3_moe"):
        cfg = families.config(family)
        saved, read = cfg.to_dict(), config_fields(cfg)
        assert architecture.layer_count(saved) == architecture.layer_count(read), family
        if (spec := architecture.moe_spec(read)) is not None:
            light = architecture.moe_spec(saved)
            assert light is not None and (light.experts, light.top_k, light.layers) == (
                spec.experts,
                spec.top_k,
                spec.layers,
            ), family
    foreign = {**families.config("ernie4_5_moe").to_dict(), "model_type": "not_a_transformers_family"}
    assert architecture.moe_spec(foreign) is None  # moe_num_experts is ERNIE's name, not a common one


def test_fused_experts_are_planned_whatever_the_config_calls_them(source, monkeypatch):
    """A model with fused 3-D experts has them planned (linearized, quantized) even where the architecture module
    reads no expert count from its config: the silent case of ERNIE before, every expert left at 16 bits unlisted."""
    from quantize.checkpoint.loader import meta_model
    from quantize.convert import plan as plan_module
    from quantize.convert.recipe import load_recipe

    monkeypatch.setattr(plan_module, "moe_spec", lambda cfg: None)
    recipe, _ = load_recipe(ROOT / "recipes" / "fp8-e4m3.yaml")
    plan = plan_module.plan_layers(meta_model(source("ernie4_5_moe"), False), recipe, True)
    assert plan.experts == ["model.layers.1.mlp.experts"]
    planned = {n for names in plan.groups.values() for n in names}
    assert {f"model.layers.1.mlp.experts.{e}.down_proj" for e in range(4)} <= planned


def test_qwen3_5_nvfp4_shares_a_global_scale_across_the_projections_vllm_merges(tmp_path, source, capsys):
    """vLLM merges Qwen3.5's in_proj_qkv with in_proj_z and in_proj_b with in_proj_a, and takes the larger of the
    two NVFP4 global scales for the merged layer (docs/vllm-loading.md Q6): each pair is written with one global
    scale (before: two, 0.95 and 0.87 apart on this model). Streaming it, which would write two, is refused."""
    from safetensors import safe_open

    code, err, out = run(tmp_path, source("qwen3_5_text"), "nvfp4a16", capsys)
    assert code == 0, err
    scales = {}
    for f in safetensors_files(out):
        with safe_open(str(f), "pt") as st:
            names = [k for k in st.keys() if k.endswith("weight_global_scale")]  # noqa: SIM118 (safe_open: no dict)
            scales |= {k: st.get_tensor(k).float().item() for k in names}
    for layer in (0, 2):  # the linear-attention layers (families.MIXED)
        at = f"model.layers.{layer}.linear_attn"
        assert scales[f"{at}.in_proj_qkv.weight_global_scale"] == scales[f"{at}.in_proj_z.weight_global_scale"]
        assert scales[f"{at}.in_proj_b.weight_global_scale"] == scales[f"{at}.in_proj_a.weight_global_scale"]
    q = "model.layers.1.self_attn"
    assert scales[f"{q}.q_proj.weight_global_scale"] == scales[f"{q}.k_proj.weight_global_scale"]  # as before
    data = yaml.safe_load((ROOT / "recipes" / "nvfp4a16.yaml").read_text())
    streamed = tmp_path / "streamed.yaml"
    model = str(source("qwen3_5_text"))
    streamed.write_text(yaml.safe_dump(data | {"model": model, "output": str(tmp_path / "s"), "streaming": "on"}))
    assert main(["run", str(streamed), "--quiet"]) == 2
    assert "in_proj_qkv and in_proj_z a global scale each when streamed" in capsys.readouterr().err


def test_gemma_4_static_scales_are_calibrated_for_its_per_layer_projection(tmp_path, source, capsys):
    """llm-compressor 0.14's QuantizationModifier turns observations into scales only for the modules its traced
    subgraphs call; Gemma 4's model-level per_layer_model_projection runs in code its tracer leaves untraced. FP8
    static wrote it a weight scale of 3.7e-40 and an input scale of 1.3e-21 (finite, and the layer silently
    nothing: KL 6.9e-3 on the smoke suite against 8.2e-4 for FP8 dynamic), NVFP4 global scales of 2.4e-38 (exit 3,
    NaN logits at the reload check). Its scales now come from what the observers saw."""
    from safetensors import safe_open

    code, err, out = run(tmp_path, source("gemma4_text"), "fp8-e4m3-static", capsys)
    assert code == 0, err
    with safe_open(str(out / "model.safetensors"), "pt") as st:
        at = "model.per_layer_model_projection"
        got = {k: st.get_tensor(f"{at}.{k}").float().item() for k in ("input_scale", "weight_scale")}
        weight = st.get_tensor(f"{at}.weight").float()
    assert got["input_scale"] > 1e-6 and got["weight_scale"] > 1e-6, got
    assert weight.abs().max() <= 448 and (weight.abs() < 448).float().mean() > 0.5  # not saturated wholesale
    code, err, _ = run(tmp_path, source("gemma4_text"), "nvfp4", capsys)
    assert code == 0, err


def test_an_override_on_a_renamed_family_is_read_back_by_inspect(tmp_path, source, capsys):
    """Nemotron-H stores its decoder as `backbone.*`, which transformers renames `model.*` on load; the config groups
    named the modules by the model's names only, so with an override's second bit width `quantize inspect` could
    not tell which group a stored tensor was in: "cannot unpack ... bit widths [4, 8]", parameters unknown, part
    mamba at 499.885 bits a weight. The targets now match both names: inspect counts each packed weight as the
    source's shape, at its group's width."""
    src = source("nemotron_h")
    overrides = [{"targets": [r"re:.*mixer\.(in|out)_proj$"], "scheme": "W8A16"}]
    rtn = dict(method="rtn", calibration=None, act_order=DROP, dampening_frac=DROP)  # data-free: seconds, not a minute
    code, err, out = run(tmp_path, src, "gptq-w4a16-g128", capsys, overrides=overrides, **rtn)
    assert code == 0, err
    report = bits_report(out)
    assert not [n for n in report.notes if "cannot unpack" in n], report.notes
    assert not unmatched_quantized(out)
    # the count from the headers: each packed weight holds its source weight's parameters
    stored, _ = all_tensors(safetensors_files(src))
    packed = [n.removesuffix("_packed") for n in all_tensors(safetensors_files(out))[0] if n.endswith(".weight_packed")]
    expected = sum(math.prod(stored[n].shape) for n in packed)
    assert report.quantized_linear_parameters == expected
    assert report.parameters == sum(math.prod(t.shape) for t in stored.values())
    widths = {m.module: m.format.split()[0] for m in report.modules if m.format.startswith("int")}
    assert widths["backbone.layers.0.mixer.in_proj"] == "int8" and widths["backbone.layers.1.mixer.q_proj"] == "int4"
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.bits.quantized_linear_parameters == expected  # the run's summary figure, too


def test_a_quantized_output_layer_is_counted_and_its_untie_said(tmp_path, source, capsys):
    """Gemma 4 ties its output layer to the embeddings; with `ignore: []` the conversion quantizes lm_head, which
    llm-compressor unties (config.json: tie_word_embeddings false). inspect counted the head as an unquantized one
    ("lm head 8.000 bits, of which scales 0"), its scale in part `other`, its parameters out of the quantized
    linears'; quantize.json divided by the source's parameters and inspect by the checkpoint's (9.044 against
    8.656); and nothing said the output was untied. Now the head's payload and scales are counted as any quantized
    linear's, both figures agree, and the run says it untied the head."""
    from quantize.checkpoint.accounting import UNTIED  # here: the old code has none, and the other tests run on it

    src = source("gemma4_text")
    code, err, out = run(tmp_path, src, "fp8-e4m3", capsys, ignore=[])
    assert code == 0, err
    found, _ = all_tensors(safetensors_files(out))
    report = bits_report(out)
    head = {n: t for n, t in found.items() if n.startswith("lm_head.")}
    assert set(head) == {"lm_head.weight", "lm_head.weight_scale"}
    part = report.bytes_by_part["lm_head"]
    assert part["bytes"] == sum(t.nbytes for t in head.values())
    assert part["parameters"] == math.prod(head["lm_head.weight"].shape)
    assert part["metadata_bytes"] == head["lm_head.weight_scale"].nbytes
    assert "other" not in report.bytes_by_part or report.bytes_by_part["other"]["metadata_bytes"] == 0
    fp8 = [n for n, t in found.items() if t.dtype == "F8_E4M3" and n.endswith(".weight")]
    assert "lm_head.weight" in fp8
    assert report.quantized_linear_parameters == sum(math.prod(found[n].shape) for n in fp8)
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.bits.bits_per_weight == report.bits_per_weight
    assert meta.bits.source_parameters == report.parameters
    assert meta.bits.quantized_linear_parameters == report.quantized_linear_parameters
    assert any(n.startswith(UNTIED) for n in meta.bits.notes), meta.bits.notes
    assert UNTIED in run_text("fp8-e4m3", out, meta)  # the run's summary says it


def _in_memory_logits(monkeypatch) -> dict:
    """Logits of the quantized model in memory on IDS, taken as the backend saves it (before save_pretrained
    compresses it): {"logits": ...} once a run has saved."""
    import torch

    from quantize.convert.backends.llmcompressor import LLMCompressorBackend

    got: dict = {}
    save = LLMCompressorBackend.save

    def saving(self, model, folder):
        with torch.no_grad():
            got["logits"] = model(input_ids=torch.tensor(IDS, device=model.device)).logits.float()
        return save(self, model, folder)

    monkeypatch.setattr(LLMCompressorBackend, "save", saving)
    return got


IDS = [[1, 5, 9, 2, 17, 33, 4, 8, 40, 3]]


@pytest.mark.parametrize(
    "recipe", ["fp8-e4m3", "nvfp4a16", pytest.param("gptq-w4a16-g128", marks=pytest.mark.slow)]
)  # GPTQ: calibration through the sequential pipeline, about a minute here
def test_granite_4_experts_are_quantized_and_read_by_our_loader(tmp_path, source, capsys, monkeypatch, recipe):
    """transformers reads Granite 4's experts only fused (its mapping renames the stored block_sparse_moe.input_linear
    and merges nothing), so every recipe quantizing them was refused, exit 2, as a layout "this family's loaders do
    not read": false for vLLM, whose GraniteMoeHybridModel maps per-expert `experts.N.gate_proj.*` names onto its
    fused experts (docs/vllm-loading.md Q9). Now the experts are quantized and written per expert, counted in the
    bits, read back by quantize's own loader (the reload check, `eval`) with the in-memory quantized model's logits,
    and the run says which loaders read it: not transformers' (its fused experts missing, at random), vLLM's (file
    and function), ours."""
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import load_model

    in_memory = _in_memory_logits(monkeypatch)
    code, err, out = run(tmp_path, source("granitemoehybrid"), recipe, capsys)
    assert code == 0, err
    found, _ = all_tensors(safetensors_files(out))
    assert not [n for n in found if re.search(r"block_sparse_moe\.(input|output)_linear", n)]
    scales = [n for n in found if re.search(r"\.experts\.\d+\.(gate|up|down)_proj\.weight_scale$", n)]
    assert len(scales) == 4 * 4 * 3  # every expert's gate, up and down of the 4 MoE layers, quantized
    experts = bits_report(out).bytes_by_part["routed_experts"]
    assert 8 * experts["bytes"] / experts["parameters"] < (8.2 if recipe == "fp8-e4m3" else 5)
    meta = records.read(RunRecord, out / "quantize.json")
    [check] = meta.finite_checks
    said = run_text(recipe, out, meta)
    for text in (check.stage, said):  # which loaders read it, in quantize.json and in the run's summary
        assert "quantize's per-expert loader" in text and "initialised at random" in text
        assert "vLLM 0.34.0 reads it," in text and "granitemoehybrid.py, GraniteMoeHybridModel.get_expert_map" in text
    assert "vLLM 0.34.0 reads it," in (out / "README.md").read_text().replace("\\", "")
    # transformers' own loader leaves the fused experts missing (random): no path of ours may read it with that
    _, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert [k for k in info["missing_keys"] if ".experts." in k]
    ours, _ = load_model(out)
    with torch.no_grad():
        logits = ours(input_ids=torch.tensor(IDS)).logits.float()
        source_model = AutoModelForCausalLM.from_pretrained(str(source("granitemoehybrid")), dtype=ours.dtype)
        unquantized = source_model(input_ids=torch.tensor(IDS)).logits.float()
    assert torch.equal(logits, in_memory["logits"])  # what the conversion computed, bit for bit
    assert not torch.equal(logits, unquantized)  # and not the source's


def test_granite_4_nvfp4_experts_say_what_vllm_does_not_read(tmp_path, source, capsys):
    """NVFP4 with FP4 activations stores each expert's input_global_scale, a name vLLM 0.34.0's Granite 4 loader
    does not move onto its experts' parameters (maybe_remap_moe_expert_param_name's list): the conversion runs (our
    loader reads it), and the run says vLLM's load would stop there rather than that vLLM reads it."""
    calibration = {"source": "builtin:jargon", "samples": 2, "seq_len": 32, "seed": 0}  # seconds, not a minute
    code, err, out = run(tmp_path, source("granitemoehybrid"), "nvfp4", capsys, calibration=calibration)
    assert code == 0, err
    meta = records.read(RunRecord, out / "quantize.json")
    said = run_text("nvfp4", out, meta)
    assert "but not their input_global_scale" in said and "KeyError" in said and "vLLM 0.34.0 reads it," not in said


def test_granite_4_experts_in_ignore_are_written_fused(tmp_path, source, capsys):
    """With the experts in `ignore`, Granite 4's are written back fused, as the source stores them, and transformers
    reads the whole checkpoint; the fused tensors are listed as left at 16 bits."""
    import torch
    from safetensors import safe_open

    code, err, out = run(tmp_path, source("granitemoehybrid"), "fp8-e4m3", capsys, **GRANITE_KEPT)
    assert code == 0, err
    loads_in_transformers(out)
    found, _ = all_tensors(safetensors_files(out))
    assert not [n for n in found if ".experts." in n]
    stored_fused = ("input_linear", "output_linear")
    fused = [f"model.layers.{i}.block_sparse_moe.{p}.weight" for i in range(4) for p in stored_fused]
    with (
        safe_open(str(out / "model.safetensors"), "pt") as q,
        safe_open(str(source("granitemoehybrid") / "model.safetensors"), "pt") as s,
    ):
        for name in fused:
            assert torch.equal(q.get_tensor(name), s.get_tensor(name)), name
    meta = records.read(RunRecord, out / "quantize.json")
    assert sorted(n for n, why in left(meta).items() if "only fused" in why) == sorted(fused)
