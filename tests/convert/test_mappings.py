"""AWQ and SmoothQuant on families whose layers their mappings cannot name: refused before the model loads (exit 2,
naming the family, the method and what to use instead), from llm-compressor's own mapping choice resolved by
compressed-tensors' own matcher on the meta model; accepted where the library's mapping, or its default, fits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from families import DENSE, MOE, config

from quantize.checkpoint.loader import meta_model
from quantize.cli import main
from quantize.compat.llmcompressor import linearized_on_meta
from quantize.convert.backends.llmcompressor.mappings import resolve
from quantize.convert.recipe import Method

from conftest import tokenizer_for

CAL = {"source": "builtin:jargon", "samples": 2, "seq_len": 16, "seed": 0}
AWQ = dict(method="awq", scheme="W4A16", group_size=64, symmetric=False, awq_grid=3, calibration=CAL)
SQ = dict(method="smoothquant", scheme="W8A8", calibration=CAL)


def laid_out(tmp_path: Path, family: str):
    """The family's module tree on the meta device, experts laid out as oneshot lays them out (config.json only)."""
    folder = tmp_path / family
    config(family).save_pretrained(folder)
    model = meta_model(folder, False)
    linearized_on_meta(model)
    return model


def run(tmp_path: Path, model: Path, fields: dict, monkeypatch, capsys) -> tuple[int, str]:
    """`quantize run` on a recipe for `model`, with loading the model made an error: what it returned and said."""
    import quantize.convert.engine  # noqa: F401  # every module that binds load_model at import binds the real one
    from quantize.checkpoint import loader

    def never(*_a, **_k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "load_model", never)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "r", "model": str(model), "output": str(tmp_path / "out"), **fields}))
    code = main(["run", str(recipe), "--quiet"])
    return code, capsys.readouterr().err


def neox(path: Path) -> Path:
    """A tiny GPT-NeoX: no AWQ or SmoothQuant mapping in llm-compressor, and its layers (input_layernorm,
    query_key_value, dense_h_to_4h) are not the Llama names of the library's default."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "gpt_neox", hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
        vocab_size=256, bos_token_id=1, eos_token_id=1,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    tokenizer_for(256).save_pretrained(path)
    return path


@pytest.mark.parametrize(("fields", "method"), [(AWQ, "AWQ"), (SQ, "SmoothQuant")])
def test_a_family_the_default_mapping_does_not_fit_is_refused_before_loading(
    tmp_path, monkeypatch, capsys, fields, method
):
    code, err = run(tmp_path, neox(tmp_path / "neox"), fields, monkeypatch, capsys)
    assert code == 2, err
    assert f"llm-compressor has no {method} mapping for GPTNeoXForCausalLM" in err
    assert "its default (Llama's layer names) does not fit" in err and "does not resolve" in err
    assert "Nothing was loaded" in err and "method: gptq" in err and "`mappings:`" in err
    assert not (tmp_path / "out").exists()


def test_a_registered_mapping_that_does_not_fit_deepseek_v3_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    """llm-compressor's own AWQ mapping for DeepSeek-V3 names the router (mlp.gate) beside the MLP's projections;
    with a dense first layer (first_k_dense_replace) that layer has none, and the sets collapse across layers:
    the library would stop mid-run ("AWQ needs to match a single smoothlayer"), here refused before the load.
    Symmetric, so the plan's expert-format rule (asymmetric experts do not reload in transformers) does not refuse
    it first."""
    from families import build

    code, err = run(tmp_path, build("deepseek_v3", tmp_path / "dsv3"), {**AWQ, "symmetric": True}, monkeypatch, capsys)
    assert code == 2, err
    assert "llm-compressor's AWQ mapping for DeepseekV3ForCausalLM does not fit this model" in err
    assert "model.layers.0.post_attention_layernorm, model.layers.1.post_attention_layernorm" in err
    assert "model_type deepseek_v3" in err and "method: gptq" in err


@pytest.mark.parametrize("family", [*DENSE, *MOE])
def test_the_librarys_mappings_resolve_on_every_family_but_deepseek_v3_awq(tmp_path, family):
    """Dense families (registered, or Llama-named), and MoE families with experts laid out as oneshot lays them out
    (Mixtral, OLMoE and gpt-oss through the library's default): one smoothing layer per set, every layer reached,
    and where the meta forward runs, each norm's balance layers read that norm's output. Not DeepSeek-V3's and
    GLM-4-MoE's AWQ, nor
    SmoothQuant on Gemma 2 and 3 (the next test), nor either on Llama 4, whose experts read the norm's output
    scaled by the router's score (before session 34 its text-only experts could not be laid out at all)."""
    model = laid_out(tmp_path, family)
    for method in (Method.awq, Method.smoothquant):
        r = resolve(model, method)
        if family == "llama4_text":
            assert r.problem is not None and "feed_forward.experts.0.gate_proj" in r.problem, r
            assert "reads another tensor, not that norm's" in r.problem
            continue
        if family in ("deepseek_v3", "glm4_moe") and method is Method.awq:  # a dense first layer, the router listed
            assert r.problem is not None and "smoothing layers into one set" in r.problem
            continue
        if family in ("gemma2", "gemma3_text") and method is Method.smoothquant:
            assert r.problem is not None and "reads the output of model.layers.0.pre_feedforward_layernorm" in r.problem
            continue
        assert r.problem is None, (family, method, r)
        assert r.sets >= 2 and r.sets % 2 == 0  # every mapping closes once per decoder layer (2 layers)


def test_the_same_family_converts_with_a_method_that_needs_no_mapping(tmp_path, capsys):
    """The refusal is the method's, not the family's: the GPT-NeoX that AWQ refuses converts by rounding."""
    model = neox(tmp_path / "neox")
    recipe = tmp_path / "g.yaml"
    fields = dict(method="rtn", scheme="W4A16", group_size=64, calibration=None)
    recipe.write_text(yaml.safe_dump({"name": "g", "model": str(model), "output": str(tmp_path / "g"), **fields}))
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_smoothquant_into_a_norm_its_linears_do_not_read_is_refused_before_loading(
    tmp_path, monkeypatch, capsys, family
):
    """llm-compressor 0.14 gives Gemma 2 and 3 its default SmoothQuant mappings: post_attention_layernorm smoothed
    into gate_proj/up_proj, which in these models read pre_feedforward_layernorm's output (post_attention_layernorm
    feeds the residual). Dividing one norm and scaling linears the other feeds changes the model (measured: logits
    moved by up to 1.16 with no quantization at all), so the run is refused before loading, naming the norm the
    linears do read; AWQ's own Gemma mappings (pre_feedforward_layernorm) pass the same trace."""
    from families import build

    code, err = run(tmp_path, build(family, tmp_path / family), SQ, monkeypatch, capsys)
    assert code == 2, err
    assert "llm-compressor's SmoothQuant mapping for" in err and "does not fit this model" in err
    assert "smooths model.layers.0.post_attention_layernorm into model.layers.0.mlp.gate_proj" in err
    assert "reads the output of model.layers.0.pre_feedforward_layernorm" in err
    assert "Nothing was loaded" in err and "`mappings:`" in err
    assert resolve(laid_out(tmp_path / "awq", family), Method.awq).problem is None


def test_a_linear_that_reads_the_smoothed_norm_unbalanced_is_found(tmp_path):
    """A mapping that smooths input_layernorm into q_proj and v_proj while k_proj reads that norm's output too: the
    norm is divided, k_proj's weight never multiplied, and k changes. The trace names k_proj; the library's own
    mapping (all three) passes."""
    from quantize.convert.backends.llmcompressor.mappings import unfed

    model = laid_out(tmp_path, "llama")
    names = {id(m): n for n, m in model.named_modules()}
    attn = model.model.layers[0].self_attn
    norm = model.model.layers[0].input_layernorm
    targets = ("re:.*input_layernorm$", "re:.*q_proj$", "re:.*v_proj$")
    said = unfed(model, [(targets, norm, [attn.q_proj, attn.v_proj])], names)
    assert said is not None and "but model.layers.0.self_attn.k_proj reads that norm's output too" in said
    assert unfed(model, [(targets, norm, [attn.q_proj, attn.k_proj, attn.v_proj])], names) is None
    assert resolve(model, Method.smoothquant).problem is None


def test_smoothquant_whose_mapping_leaves_the_routed_experts_unbalanced_is_refused(tmp_path, monkeypatch, capsys):
    """llm-compressor 0.14's Qwen3.5-MoE SmoothQuant mapping smooths post_attention_layernorm into the shared
    expert alone, while the sparse block passes that norm's output to its routed experts too: it converted with a
    smoke-suite KL of 4.3e-4 (SmoothQuant elsewhere: 3e-7 to 1e-6). Refused before loading now."""
    from families import build

    code, err = run(tmp_path, build("qwen3_5_moe_text", tmp_path / "q35moe"), SQ, monkeypatch, capsys)
    assert code == 2, err
    assert "but model.layers.0.mlp reads that norm's output and passes it to its routed experts" in err
    assert "Nothing was loaded" in err
