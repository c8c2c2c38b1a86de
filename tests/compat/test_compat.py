"""quantize/compat: every guarded assumption about another library's internals holds on the pinned versions, and a
broken one is found (not silently worked around)."""

from __future__ import annotations

import pytest

pytest.importorskip("compressed_tensors")

from compressed_tensors.quantization.lifecycle import forward_helpers

from quantize.checkpoint import qdq
from quantize.compat import compressed_tensors as ct


def test_compressed_tensors_assumptions_hold_on_the_pinned_version():
    """Fails loudly when an upgrade moves, renames or re-signs the function qdq replaces: read
    quantize/compat/compressed_tensors.py, check the new version, then widen CHECKED."""
    assert ct.problems() == []


def test_a_changed_signature_and_another_version_are_found(monkeypatch):
    def other(tensor, args, lo, hi):  # a parameter renamed upstream
        return tensor

    monkeypatch.setattr(forward_helpers, "round_to_quantized_type_args", other)
    assert any("takes" in p for p in ct.problems())
    monkeypatch.setattr(ct, "version", lambda _name: "0.21.0")
    assert any("outside the checked range" in p for p in ct.problems())


def test_a_broken_assumption_keeps_the_librarys_function_and_says_so(monkeypatch):
    monkeypatch.setattr(qdq, "_unusable", lambda: ("compressed-tensors 9.9 is outside the checked range",))
    own = forward_helpers.round_to_quantized_type_args
    with pytest.warns(UserWarning, match="outside the checked range"), qdq.installed():
        assert forward_helpers.round_to_quantized_type_args is own


def test_replaced_restores_what_was_there():
    own = forward_helpers.round_to_quantized_type_args
    with ct.replaced(len):
        assert forward_helpers.round_to_quantized_type_args is len
    assert forward_helpers.round_to_quantized_type_args is own


def test_a_preset_whose_group_changed_upstream_is_found(monkeypatch):
    monkeypatch.setitem(ct.PRESET_WEIGHT_GROUP, "MXFP4", 64)
    assert any("preset MXFP4 groups 32 weights per scale in the library, 64 here" in p for p in ct.problems())


def test_recipe_validation_reads_the_groups_without_importing_torch():
    import subprocess
    import sys

    code = (
        "import sys; from quantize.convert.recipe import FORMATS, Scheme; "
        "print(FORMATS[Scheme.FP8_BLOCK].group, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["128", "False"]


def test_lm_eval_assumptions_hold_on_the_pinned_version():
    """Fails loudly when an lm-eval upgrade moves or re-signs a private name this project uses: read
    quantize/compat/lm_eval.py, check each use against the new version, then widen CHECKED."""
    from quantize.compat import lm_eval as compat

    assert compat.problems() == []


def test_a_changed_lm_eval_method_is_found(monkeypatch):
    from lm_eval.api.model import TemplateLM

    from quantize.compat import lm_eval as compat

    monkeypatch.setattr(TemplateLM, "_encode_pair", lambda self, ctx, cont, extra: None)
    monkeypatch.setattr(compat, "version", lambda _name: "0.5.0")
    found = compat.problems()
    assert any("_encode_pair takes ('ctx', 'cont', 'extra')" in p for p in found)
    assert any("lm-eval 0.5.0 is outside the checked range" in p for p in found)


def test_no_module_outside_compat_names_a_private_member_of_a_library():
    """SLF001 exceptions (a `noqa` for reaching into another object's privates) live in quantize/compat only."""
    from conftest import ROOT

    outside = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in (ROOT / "quantize").rglob("*.py")
        if "compat" not in p.parts
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "noqa: SLF001" in line
    ]
    assert outside == []


def test_llmcompressor_assumptions_hold_on_the_pinned_version():
    """Fails loudly when an upgrade changes how model_free_ptq writes its shards: read
    quantize/compat/llmcompressor.py, check it against the new version, then widen CHECKED."""
    from quantize.compat import llmcompressor as compat

    assert compat.problems() == []


def test_a_model_free_module_without_its_own_save_file_is_found(monkeypatch):
    import llmcompressor.entrypoints.model_free as model_free

    from quantize.compat import llmcompressor as compat

    monkeypatch.delattr(model_free, "save_file")
    assert any("no longer writes its shards through its own save_file" in p for p in compat.problems())


def test_a_model_free_profiler_that_no_longer_raises_is_found(monkeypatch):
    import llmcompressor.entrypoints.model_free as model_free

    from quantize.compat import llmcompressor as compat

    monkeypatch.setattr(model_free, "TensorProfiler", lambda: None)  # no catch_exception to turn off
    assert any("TensorProfiler(catch_exception)" in p for p in compat.problems())


def test_fx_wraps_dropped_removes_what_the_block_registered_and_keeps_the_rest():
    import torch.fx
    import torch.fx._symbolic_trace as symbolic_trace

    from quantize.compat.llmcompressor import fx_wraps_dropped

    table = symbolic_trace._wrapped_fns_to_patch
    before = dict(table)
    namespace: dict = {"torch": torch}
    with fx_wraps_dropped():
        exec("torch.fx.wrap('len')", namespace)  # as llm-compressor's rewritten forwards register their wraps
        assert (id(namespace), "len") in table
    assert (id(namespace), "len") not in table
    assert table == before


def test_a_wrap_table_of_another_shape_is_found_and_left_alone(monkeypatch):
    import torch.fx._symbolic_trace as symbolic_trace

    from quantize.compat import llmcompressor as compat

    monkeypatch.setattr(symbolic_trace, "_wrapped_fns_to_patch", [("len", {})])
    assert any("_wrapped_fns_to_patch is no longer a dict" in p for p in compat.problems())
    with pytest.warns(UserWarning, match="wrap table is left as it is"), compat.fx_wraps_dropped():
        pass
    assert symbolic_trace._wrapped_fns_to_patch == [("len", {})]


def test_a_torch_outside_the_checked_range_is_found(monkeypatch):
    import torch

    from quantize.compat import llmcompressor as compat

    monkeypatch.setattr(torch, "__version__", "2.20.0")
    assert any("torch 2.20.0 is outside the checked range" in p for p in compat.problems())


def test_global_scales_shared_adds_the_pairs_vllm_merges_and_puts_the_list_back():
    from llmcompressor.observers import helpers

    from quantize.compat.llmcompressor import MERGED_BY_VLLM, global_scales_shared

    before = list(helpers.FUSED_LAYER_NAMES)
    with global_scales_shared():
        assert all(pair in helpers.FUSED_LAYER_NAMES for pair in MERGED_BY_VLLM)
        assert helpers.FUSED_LAYER_NAMES[: len(before)] == before
    assert before == helpers.FUSED_LAYER_NAMES


def test_a_fused_layer_list_of_another_shape_is_found_and_left_alone(monkeypatch):
    from llmcompressor.observers import helpers

    from quantize.compat import llmcompressor as compat

    monkeypatch.setattr(helpers, "FUSED_LAYER_NAMES", {"q_proj": ["k_proj"]})
    assert any("FUSED_LAYER_NAMES is no longer a list" in p for p in compat.problems())
    with pytest.warns(UserWarning, match="FUSED_LAYER_NAMES is left as it is"), compat.global_scales_shared():
        assert helpers.FUSED_LAYER_NAMES == {"q_proj": ["k_proj"]}


def test_a_preset_whose_global_scale_changed_upstream_is_found(monkeypatch):
    monkeypatch.setattr(ct, "PRESET_GLOBAL_SCALE", frozenset({"NVFP4"}))
    assert any("preset NVFP4A16 takes a global scale in the library" in p for p in ct.problems())


def test_every_module_calibrated_puts_the_callbacks_back_and_a_re_signed_one_is_found(monkeypatch):
    from llmcompressor.modifiers.quantization import QuantizationModifier

    from quantize.compat import llmcompressor as compat

    own = QuantizationModifier.on_sequential_epoch_end, QuantizationModifier.on_calibration_end
    with compat.every_module_calibrated():
        assert QuantizationModifier.on_sequential_epoch_end is not own[0]
    assert (QuantizationModifier.on_sequential_epoch_end, QuantizationModifier.on_calibration_end) == own
    monkeypatch.setattr(QuantizationModifier, "on_sequential_epoch_end", lambda self, state, modules: None)
    assert any("on_sequential_epoch_end is gone or no longer takes" in p for p in compat.problems())
    with pytest.warns(UserWarning, match="callbacks are left as they are"), compat.every_module_calibrated():
        assert QuantizationModifier.on_calibration_end is own[1]


def test_torch_assumptions_hold_and_a_view_is_followed_to_its_base(monkeypatch):
    import torch

    from quantize.compat import torch as compat

    assert compat.problems() == []
    x = torch.zeros(2, 3, device="meta")
    assert compat.view_base(x.view(3, 2).view(6)) is x and compat.view_base(x) is x
    monkeypatch.setattr(torch, "__version__", "2.20.0")
    assert any("torch 2.20.0 is outside the checked range" in p for p in compat.problems())


def test_transformers_assumptions_hold_on_the_pinned_version():
    """Fails loudly when an upgrade changes how from_pretrained loads a state dict (the source check's dry load):
    read quantize/compat/transformers.py, check it against the new version, then widen CHECKED."""
    from quantize.compat import transformers as compat

    assert compat.problems() == []


def test_a_changed_loader_is_found(monkeypatch):
    import transformers.core_model_loading as loading
    from transformers import PreTrainedModel

    from quantize.compat import transformers as compat

    monkeypatch.delattr(PreTrainedModel, "_adjust_missing_and_unexpected_keys")
    monkeypatch.setattr(loading, "convert_and_load_state_dict_in_model", lambda state_dict, model, config: None)
    found = compat.problems()
    assert any("_adjust_missing_and_unexpected_keys" in p for p in found)
    assert any("convert_and_load_state_dict_in_model takes" in p for p in found)


def test_a_changed_special_float_decoder_is_found(monkeypatch):
    """completed_config decodes save_pretrained's `{"__float__": "Infinity"}` with the private
    PreTrainedConfig._decode_special_floats before the class reads the file (Nemotron-H's time_step_limit): a decoder
    gone or other is found."""
    from transformers import PreTrainedConfig

    from quantize.compat import transformers as compat

    monkeypatch.setattr(PreTrainedConfig, "_decode_special_floats", classmethod(lambda cls, obj: obj))
    assert any("_decode_special_floats" in p for p in compat.problems())
    monkeypatch.delattr(PreTrainedConfig, "_decode_special_floats")
    assert any("gives 'absent'" in p for p in compat.problems())


def test_the_copied_attribute_maps_are_the_config_classes_own(monkeypatch):
    """The light readers' copy of transformers' attribute maps equals the classes' on every family of CONFIG_MAPPING
    (those absent from it map none of the names read: the MTP layers' num_mtp_layers of DeepSeek-V3, GLM-4.5 and
    Step-3.5 among them); a map changed upstream, or a family's entry dropped from the copy, is found."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from quantize.compat import transformers as compat
    from quantize.compat import transformers_config_names as copy

    assert compat.config_name_problems(sorted(CONFIG_MAPPING.keys())) == []
    monkeypatch.setattr(CONFIG_MAPPING["qwen3_moe"], "attribute_map", {"num_experts": "experts_total"})
    monkeypatch.setattr(copy, "ATTRIBUTE_MAPS", {k: v for k, v in copy.ATTRIBUTE_MAPS.items() if k != "ernie4_5_moe"})
    found = compat.config_name_problems(["ernie4_5_moe", "mixtral", "qwen3_moe"])
    assert [p.split(" maps ")[0] for p in found] == ["ernie4_5_moe's config class", "qwen3_moe's config class"]
    assert "{'num_experts': 'experts_total'}" in found[1]


def test_the_copied_sliding_switches_are_the_config_classes_own(monkeypatch):
    """SLIDING_SWITCH equals what transformers' config classes hold; a family dropped from the copy is found."""
    from quantize.compat import transformers as compat
    from quantize.compat import transformers_config_names as copy

    assert compat.sliding_switch_problems() == []
    monkeypatch.setattr(copy, "SLIDING_SWITCH", {k: v for k, v in copy.SLIDING_SWITCH.items() if k != "qwen3"})
    assert [p.split(":")[0] for p in compat.sliding_switch_problems()] == ["qwen3's config class"]


@pytest.mark.parametrize("model_type", ["qwen2_moe", "smollm3"])
def test_a_class_sliding_other_layers_than_qwen2s_rule_is_found(model_type, monkeypatch):
    """Qwen2-MoE's class, switched on, slides layers 0, 2, 4, ... below max_window_layers and SmolLM3's its layers
    without RoPE: a copy reading them by Qwen2's rule (slide from max_window_layers on), as the old one did for
    Qwen2-MoE (its max_window_layers default 28), or as sliding every layer, is found."""
    from quantize.compat import transformers as compat
    from quantize.compat import transformers_config_names as copy

    assert compat.library_switches()[model_type] == copy.OWN_LAYER_TYPES
    for read_as in (28, None):
        monkeypatch.setattr(copy, "SLIDING_SWITCH", {**copy.SLIDING_SWITCH, model_type: read_as})
        assert [p.split(":")[0] for p in compat.sliding_switch_problems()] == [f"{model_type}'s config class"]


def test_the_copied_mtp_prefixes_are_the_models_own(monkeypatch):
    """MTP_UNEXPECTED equals the MTP patterns of transformers' models' `_keys_to_ignore_on_load_unexpected`
    (Qwen3-Next's `^mtp.*` among them); a family dropped from the copy, or a pattern changed upstream, is found."""
    from transformers import Qwen3NextForCausalLM

    from quantize.compat import transformers as compat
    from quantize.compat import transformers_config_names as copy

    assert compat.mtp_pattern_problems() == []
    assert copy.MTP_UNEXPECTED["qwen3_next"] == ("^mtp.*",)
    monkeypatch.setattr(copy, "MTP_UNEXPECTED", {k: v for k, v in copy.MTP_UNEXPECTED.items() if k != "nemotron_h"})
    monkeypatch.setattr(Qwen3NextForCausalLM, "_keys_to_ignore_on_load_unexpected", [r"^model\.mtp\."])
    found = compat.mtp_pattern_problems()
    assert [p.split("'s model")[0] for p in found] == ["nemotron_h", "qwen3_next"]


def test_target_matching_agrees_with_compressed_tensors():
    """The torch-free copy the accounting uses picks, on every case, the target compressed-tensors' own
    `match_targets` puts first (exact names, then `re:` patterns in sorted order), and matches a name as its
    `match_name` does."""
    from compressed_tensors.utils.match import match_name

    from quantize.compat import compressed_tensors_targets as targets_copy

    for name, targets in targets_copy.TARGET_CASES:
        assert targets_copy.first_target(name, targets) == ct.library_first_target(name, targets)
        assert [targets_copy.match_name(name, t) for t in targets] == [match_name(name, t) for t in targets]
    assert targets_copy.first_target("model.layers.1.mlp.down_proj", targets_copy.TARGET_CASES[1][1]) == (
        "re:.*down_proj"
    )


def test_a_changed_target_precedence_upstream_is_found(monkeypatch):
    import compressed_tensors.utils.match as match

    own = match.match_targets
    monkeypatch.setattr(match, "match_targets", lambda name, module, targets: own(name, module, targets)[::-1])
    assert any("applies target" in p for p in ct.problems())


def test_our_request_tokenization_is_lm_evals_own(tiny_model):
    """encode_request restates TemplateLM.loglikelihood's empty-context rule: its tokens for every kind of
    request (empty context, a context ending in spaces, a plain one) are the ones lm-eval's own public path hands
    to `_loglikelihood_tokens`. Fails loudly when an lm-eval upgrade changes that rule."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from quantize.checkpoint.loader import LastModel
    from quantize.compat import lm_eval as compat

    model, tok = LastModel().get(tiny_model, dtype="float32", on="cpu")
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1)
    args = [("", " the data"), ("", "<eos> model"), ("the model  ", "data set"), ("the model", " data set")]
    seen = []
    lm._loglikelihood_tokens = lambda reqs, **kw: seen.extend(reqs) or [(0.0, False)] * len(reqs)
    lm.loglikelihood([Instance("loglikelihood", {}, a, 0) for a in args], disable_tqdm=True)
    assert [compat.encode_request(lm, *a) for a in args] == [(ctx, cont) for _, ctx, cont in seen]
    assert seen[1][1] == [tok.eos_token_id] != seen[0][1] or lm.prefix_token_id == tok.eos_token_id


def test_a_linearize_module_without_its_own_offload_module_is_found(monkeypatch):
    """linearized_on_meta makes llm-compressor's offload step a no-op by patching `offload_module` in the modules
    that call it; an upgrade that moves the call elsewhere would make the patch a silent no-op and the meta
    linearization fail: problems() names it."""
    import llmcompressor.modeling.moe.linear_experts as linear_experts

    from quantize.compat import llmcompressor as compat

    monkeypatch.delattr(linear_experts, "offload_module")
    assert any("linear_experts no longer calls offload_module" in p for p in compat.problems())


def test_linearized_on_meta_gives_the_per_expert_layers_oneshot_quantizes(tmp_path):
    """On a meta-device Mixtral (fused experts), llm-compressor's own conversion gives gate/up/down Linear layers
    per expert, with no weights read and nothing offloaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from quantize.compat.llmcompressor import linearized_on_meta

    cfg = AutoConfig.for_model(
        "mixtral", vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=3, num_experts_per_tok=1,
    )  # fmt: skip
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert linearized_on_meta(model) == ["model.layers.0.mlp.experts"]
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".experts." in n}
    projs = ("gate_proj", "up_proj", "down_proj")
    assert linears == {f"model.layers.0.mlp.experts.{e}.{p}" for e in range(3) for p in projs}
    assert all(p.is_meta for p in model.parameters())
    assert linearized_on_meta(model) == []  # nothing fused is left


def test_a_text_only_llama_4_is_linearized_to_what_its_fused_experts_compute(tmp_path):
    """llm-compressor 0.14's Llama 4 expert conversion reads config.text_config (the multimodal config); under
    text_only_llama4 a text-only model's experts become per-expert Linear layers holding the fused tensors' slices
    and computing what the fused ones did, and the library's method is put back after the block. Without the block
    the conversion stops on the text config, as it did."""
    import torch
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from llmcompressor.modeling.moe.llama4 import Llama4LinearExperts
    from transformers import AutoConfig, AutoModelForCausalLM

    from quantize.compat.llmcompressor import linearize

    cfg = AutoConfig.for_model(
        "llama4_text", vocab_size=64, hidden_size=32, intermediate_size=16, intermediate_size_mlp=48,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=3,
        num_experts_per_tok=1, interleave_moe_layer_step=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(AttributeError, match="text_config"):
        linearize_moe(AutoModelForCausalLM.from_config(cfg))
    method = Llama4LinearExperts.__dict__["from_experts_module"]
    experts = model.model.layers[0].feed_forward.experts
    gate_up, down = experts.gate_up_proj.detach().clone(), experts.down_proj.detach().clone()  # (E, H, 2I), (E, I, H)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        fused = model(input_ids=ids).logits
        linearize(model)
        linear = model.model.layers[0].feed_forward.experts
        assert isinstance(linear, Llama4LinearExperts)
        assert torch.equal(linear[2].gate_proj.weight, gate_up[2, :, :16].T)
        assert torch.equal(linear[2].up_proj.weight, gate_up[2, :, 16:].T)
        assert torch.equal(linear[2].down_proj.weight, down[2].T)
        assert torch.allclose(model(input_ids=ids).logits, fused, atol=1e-6)
    assert Llama4LinearExperts.__dict__["from_experts_module"] is method


def test_transformers_reads_a_compressed_tensors_llama_4_per_expert_and_a_changed_table_is_found(monkeypatch):
    """quantized_per_expert reads transformers' own table of the experts its quantizer swaps for per-expert layers:
    Llama 4 yes, gpt-oss (fused only) and a dense family no; a table other than the one read is named."""
    from transformers.quantizers import base

    from quantize.compat import transformers as compat

    assert compat.quantized_per_expert("llama4_text") and compat.quantized_per_expert("llama4")
    assert not compat.quantized_per_expert("gpt_oss") and not compat.quantized_per_expert("llama")
    monkeypatch.setattr(base, "MODULES_TO_PATCH_FOR_QUANTIZATION", {})
    assert any("patches [] for compressed-tensors" in p for p in compat.problems())


def test_a_quantized_kv_cache_answers_its_length_inside_the_block_only(monkeypatch):
    """compressed-tensors' QuantizedKVCache, standing in for a model's cache during calibration, raised on
    `get_seq_length` where it wraps no cache (Llama 4's NoPE layers read it: exit 3 with FP8 KV); in the block it
    answers 0 there (what transformers counts with no cache) and the wrapped cache's length where there is one;
    after the block the class is as it was. A class that stops delegating is named."""
    import torch
    from compressed_tensors.modeling.kvcache import QuantizedKVCache
    from transformers import DynamicCache

    from quantize.compat import compressed_tensors as compat

    kv = QuantizedKVCache(config=None, attn_module=torch.nn.Linear(1, 1))
    with pytest.raises(AttributeError, match="get_seq_length"):
        kv.get_seq_length(0)
    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 0)
    with compat.seq_length_without_a_cache():
        assert kv.get_seq_length(0) == 0
        kv.add_past_key_values(cache)
        assert kv.get_seq_length(0) == 5
        kv.add_past_key_values(None)
    assert "get_seq_length" not in vars(QuantizedKVCache)
    monkeypatch.delattr(QuantizedKVCache, "__getattr__")
    assert any("no longer delegates" in p for p in compat.problems())


def test_an_oneshot_that_no_longer_linearizes_experts_first_is_found(monkeypatch):
    """The mapping check lays fused experts out as oneshot does before its modifiers resolve their mappings
    (convert/backends/llmcompressor/mappings.py); a library that stops doing so, or builds the layout otherwise, is
    named."""
    from llmcompressor.modeling.moe import linearize

    from quantize.compat import llmcompressor as compat

    monkeypatch.setattr(compat.inspect, "getsource", lambda _obj: "")
    assert any("no longer linearizes fused experts" in p for p in compat.problems())
    monkeypatch.undo()
    monkeypatch.delattr(linearize, "get_non_linearized_moes")
    assert any("has no get_non_linearized_moes" in p for p in compat.problems())


def test_restore_rope_puts_back_what_gptqmodel_adds_to_gemma3s_rope_parameters(tmp_path):
    """GPTQModel's RoPE initializer (quantize/compat/gptqmodel.py) adds top-level keys to Gemma 3's per-layer-type
    rope_parameters, which save_pretrained's validation refuses; restore_rope puts transformers' own reading of
    the source back (and changes nothing the second time). Needs no GPTQModel: the change is made here by hand."""
    from families import config
    from transformers import AutoConfig

    from quantize.compat.gptqmodel import restore_rope

    config("gemma3_text").save_pretrained(tmp_path / "src")
    cfg = AutoConfig.from_pretrained(tmp_path / "src")
    own = {k: dict(v) for k, v in cfg.rope_parameters.items()}
    cfg.rope_parameters |= {"rope_type": "default", "rope_theta": {"global": 1e6, "local": 1e4}}  # as GPTQModel's
    with pytest.raises(AttributeError):
        cfg.save_pretrained(tmp_path / "broken")
    assert restore_rope(cfg, tmp_path / "src") and cfg.rope_parameters == own
    assert not restore_rope(cfg, tmp_path / "src")
    cfg.save_pretrained(tmp_path / "out")
    assert AutoConfig.from_pretrained(tmp_path / "out").rope_parameters == own


# --- another library's internals outside quantize/compat/ ---------------------------------------------------------
# What counts, in a module outside quantize/compat/ (a library: any top-level module but quantize and the standard
# library's):
#   - a private name: an import whose module path or imported name has a part starting with `_` (not a dunder), an
#     attribute starting with `_` read from a name an import bound, or `getattr`/`hasattr`/`setattr` of such a name;
#   - an internal module: an import from one of INTERNAL or below it (a library's own machinery, not its API);
#   - a patch: an attribute of an imported name assigned or deleted (`IntermediatesCache.pin_memory = ...`),
#     `setattr`/`delattr` on one, or unittest.mock's `patch` (which exists to replace names in other modules).
# `self._x` of a subclass and a private name reached through a call's result are not seen (no types are inferred).
INTERNAL = (
    "transformers.conversion_mapping",  # from_pretrained's per-family renamings and merges
    "transformers.core_model_loading",  # from_pretrained's state-dict loading and its transforms
    "llmcompressor.pipelines.cache",  # the calibration pipelines' activation cache
    "transformers.quantizers.base",  # the fused-experts classes a quantizer swaps for per-expert layers
    "transformers.quantizers.quantizer_compressed_tensors",  # which stored expert tensors its converters read
    "transformers.integrations.compressed_tensors",  # DecompressExperts: how it dequantizes per-expert tensors
    "compressed_tensors.quantization.lifecycle",  # fake quantization's and initialization's implementation
)


def _library(module: str) -> bool:
    import sys

    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top not in ("quantize", "__future__")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bound(tree) -> dict[str, str]:
    """Local name -> the module or name an absolute import bound it to (function-level imports included)."""
    import ast

    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {
                a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in node.names
            }
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    return bound


def _root(node, bound: dict[str, str]) -> str | None:
    """What the name an expression starts from was imported as, where it is a library's (`torch.nn.Linear` after
    `import torch`: torch); None for anything else."""
    import ast

    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    target = bound.get(node.id) if isinstance(node, ast.Name) else None
    return target if target is not None and _library(target) else None


def _imported(node) -> list[str]:
    """Every dotted path an import names (the module, and module.name for each name a `from` import takes)."""
    import ast

    if isinstance(node, ast.Import):
        return [a.name for a in node.names if _library(a.name)]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level and _library(node.module):
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def internal_uses(source: str) -> list[str]:
    """Each use of another library's private name or internal module, or patch of one, in `source`: `LINE: what`."""
    import ast

    tree = ast.parse(source)
    bound = _bound(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for path in _imported(node):  # one finding an import, its module's first
            if any(_private(p) for p in path.split(".")):
                found.append(f"{line}: imports the private name {path}")
                break
            if any(path == m or path.startswith(m + ".") for m in INTERNAL):
                found.append(f"{line}: imports from the internal module {path}")
                break
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node.value, bound):
            found.append(f"{line}: reads the private {ast.unparse(node)}")
        targets = list(node.targets) if isinstance(node, ast.Assign | ast.Delete) else []
        targets += [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        found += [
            f"{line}: patches {ast.unparse(t)}"
            for t in targets
            if isinstance(t, ast.Attribute) and _root(t.value, bound)
        ]
        if isinstance(node, ast.Call) and (call := _call(node, bound)):
            found.append(f"{line}: {call}")
    return found


def _call(node, bound: dict[str, str]) -> str | None:
    """A call that patches a library's name or reaches a private one by its string."""
    import ast

    name = ast.unparse(node.func)
    if name in ("setattr", "delattr") and node.args and _root(node.args[0], bound):
        return f"patches {ast.unparse(node.args[0])} through {name}"
    text = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
    if name in ("getattr", "hasattr") and _root(node.args[0], bound) and isinstance(text, str) and _private(text):
        return f"reads the private {ast.unparse(node.args[0])}.{text} through {name}"
    first, *rest = name.split(".")
    if f"{bound.get(first, first)}.{'.'.join(rest)}".startswith("unittest.mock.patch"):
        return f"patches through {name}"
    return None


def test_no_module_outside_compat_uses_a_librarys_internals():
    """quantize/compat/ is the one place another library's private names, internal modules and patches live, each
    guarded by the versions it was read on; everywhere else calls compat's functions."""
    from conftest import ROOT

    found = [
        f"{p.relative_to(ROOT)}:{use}"
        for p in sorted((ROOT / "quantize").rglob("*.py"))
        if "compat" not in p.relative_to(ROOT).parts
        for use in internal_uses(p.read_text(encoding="utf-8"))
    ]
    assert found == []


@pytest.mark.parametrize(
    "planted,what",
    [
        (  # what convert/runtime.py did before compat/llmcompressor.py's `unpinned`
            "def f():\n    from llmcompressor.pipelines.cache import IntermediatesCache\n\n"
            "    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None\n",
            "internal module llmcompressor.pipelines.cache",
        ),
        ("from llmcompressor.pipelines.cache import IntermediatesCache\nIntermediatesCache.x = 1\n", "patches"),
        ("from transformers.conversion_mapping import get_checkpoint_conversion_mapping\n", "internal module"),
        ("import transformers.core_model_loading as loading\n", "internal module transformers.core_model_loading"),
        ("from compressed_tensors.quantization.lifecycle.forward import fake_quantize\n", "internal module"),
        ("from transformers.utils import _private_helper\n", "private name transformers.utils._private_helper"),
        ("from lm_eval._internal import x\n", "private name lm_eval._internal"),
        ("from lm_eval.api.model import TemplateLM\nTemplateLM._encode_pair(lm, 'a', 'b')\n", "private TemplateLM"),
        ("import torch\ntorch.nn.Module._apply\n", "private torch.nn.Module._apply"),
        ("import torch\nsetattr(torch.nn, 'Linear', None)\n", "patches torch.nn through setattr"),
        ("import transformers\ngetattr(transformers, '_hidden')\n", "private transformers._hidden"),
        ("from unittest import mock\nwith mock.patch.object(a, 'b', 1):\n    pass\n", "patches through mock"),
        ("from unittest.mock import patch\nwith patch('transformers.x'):\n    pass\n", "patches through patch"),
        ("import transformers\ndel transformers.AutoConfig\n", "patches transformers.AutoConfig"),
    ],
)
def test_each_kind_of_internal_use_is_caught(planted, what):
    found = internal_uses(planted)
    assert any(what in f for f in found), found


def test_public_uses_and_our_own_privates_are_not_caught():
    source = (
        "from transformers import AutoConfig\nimport torch\nfrom quantize.checkpoint import qdq\n\n"
        "class A:\n    def f(self):\n        self._own = AutoConfig.from_pretrained('x')\n"
        "        qdq._unusable()\n        torch.__version__\n        return getattr(self, '_own')\n"
    )
    assert internal_uses(source) == []


def test_every_internal_module_listed_is_one_compat_reads():
    """INTERNAL names what compat/ guards: a module listed that no compat module imports is a stale entry."""
    import ast

    from conftest import ROOT

    read = {
        path
        for p in (ROOT / "quantize" / "compat").glob("*.py")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        for path in _imported(node)
    }
    assert [m for m in INTERNAL if not any(r == m or r.startswith(m + ".") for r in read)] == []


def test_one_reading_of_versions_against_a_checked_range():
    from quantize.compat import outside, release

    assert release("0.14.0.1", 2) == (0, 14) and release("5.17.0.dev0+cu128", 2) == (5, 17)
    assert release("1.0rc1", 3) == (1, 0, 0) and release("0.4.13", 3) == (0, 4, 13) and release("7", 2) == (7, 0)
    assert outside("lm-eval", "0.4.13", ((0, 4, 13), (0, 4, 14))) is None
    assert outside("lm-eval", "0.4.14", ((0, 4, 13), (0, 4, 14))) == (
        "lm-eval 0.4.14 is outside the checked range (0, 4, 13)-(0, 4, 14) (exclusive)"
    )
    assert outside("x", "0.18.9", ((0, 19), (0, 20))) and outside("x", "0.19.12", ((0, 19), (0, 20))) is None


def test_unpinned_skips_pinning_for_the_block_and_puts_the_method_back():
    from llmcompressor.pipelines.cache import IntermediatesCache

    from quantize.compat.llmcompressor import unpinned

    own = IntermediatesCache.pin_memory
    with unpinned():
        assert IntermediatesCache.pin_memory is not own
        assert IntermediatesCache.pin_memory(object(), 0) is None  # pins nothing, reads nothing
    assert IntermediatesCache.pin_memory is own
    with pytest.raises(KeyError), unpinned():
        raise KeyError("the block failed")
    assert IntermediatesCache.pin_memory is own


def test_a_re_signed_pin_memory_is_found_and_left_to_the_library(monkeypatch):
    """An upgrade that renames pin_memory's parameters: problems() names it, and `unpinned` warns and leaves the
    library's method in place rather than put a no-op of the old signature there."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    from quantize.compat import llmcompressor as compat

    def pin_memory(self, batch, names=None, blocking=False):  # re-signed upstream
        return None

    monkeypatch.setattr(IntermediatesCache, "pin_memory", pin_memory)
    assert any("IntermediatesCache.pin_memory takes" in p for p in compat.problems())
    with pytest.warns(UserWarning, match="pin_memory is left as it is"), compat.unpinned():
        assert IntermediatesCache.pin_memory is pin_memory
    monkeypatch.setattr(compat, "version", lambda _name: "0.15.0")
    assert any("llmcompressor 0.15.0 is outside the checked range" in p for p in compat.problems())


def test_a_changed_checkpoint_conversion_mapping_is_found(monkeypatch):
    """plan.py reads a family's conversions (the names a per-expert checkpoint reloads under) through
    compat.transformers.conversions; a library that converts Mixtral otherwise is named."""
    import transformers.conversion_mapping as mapping

    from quantize.compat import transformers as compat

    assert compat.conversions("mixtral") == list(compat.MIXTRAL_READ) and compat.conversions("llama") == []
    own = mapping.get_checkpoint_conversion_mapping
    monkeypatch.setattr(mapping, "get_checkpoint_conversion_mapping", lambda model_type: own(model_type)[1:])
    assert any("converts Mixtral's checkpoint tensors with" in p for p in compat.problems())
    monkeypatch.setattr(mapping, "get_checkpoint_conversion_mapping", lambda model_type, revision=None: [])
    assert any("get_checkpoint_conversion_mapping(model_type) is gone or re-signed" in p for p in compat.problems())


def test_fake_quantize_is_the_librarys_and_a_re_signed_one_is_found(monkeypatch):
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle import forward

    w = torch.tensor([[0.1, -0.52, 0.3, 0.9]])
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="channel")
    scale, zp = torch.tensor([[0.1]]), torch.zeros(1, 1, dtype=torch.int8)
    assert torch.equal(ct.fake_quantize(w, scale, zp, args), forward.fake_quantize(w, scale, zp, args))
    assert torch.allclose(ct.fake_quantize(w, scale, zp, args), torch.tensor([[0.1, -0.5, 0.3, 0.7]]))
    monkeypatch.setattr(forward, "fake_quantize", lambda x, scale, zero_point: x)
    assert any("fake_quantize takes ('x', 'scale', 'zero_point')" in p for p in ct.problems())


def test_lm_evals_templates_render_sandboxed_with_its_own_filters():
    """compat.lm_eval.sandbox_templates replaces lm_eval.utils.env (a private name: problems() checks that
    apply_template still renders with it): an unsafe attribute is refused, lm-eval's filters still work."""
    import jinja2
    from lm_eval.utils import apply_template

    from quantize.compat import lm_eval as compat

    compat.sandbox_templates()
    with pytest.raises(jinja2.exceptions.SecurityError):
        apply_template("{{ cycler.__init__.__globals__ }}", {})
    assert apply_template("{{ q | regex_replace('a+', 'b') }} {{ n + 1 }}\n", {"q": "caat", "n": 1}) == "cbt 2\n"


def test_packing_agrees_with_compressed_tensors_and_a_changed_copy_is_found(monkeypatch):
    """The torch-free packing rule the accounting holds num_bits to (compat/compressed_tensors_packing.py) is the
    library's: the same words for every row of PACK_CASES, the same num_bits packed into int32 words and uint8
    bytes; a copy that packs 16 bits into int32 words or rounds rows down, as the library does not, is found."""
    from quantize.compat import compressed_tensors_packing as packing

    assert ct.packing_problems() == []
    assert ct.library_packed_width("I32", 100, 3) == packing.packed_width(100, 3, "I32") == 10  # dense: 300 bits
    monkeypatch.setitem(packing.CONTAINERS, "I32", (32, tuple(range(1, 17)), "pack_to_int32", "int32 words"))
    assert any("does not pack num_bits 16 into I32" in p for p in ct.packing_problems())
    monkeypatch.undo()
    monkeypatch.setattr(ct, "packed_width", lambda cols, bits, container: cols * bits // 32 if bits else 0)
    assert any("a row of 100 3-bit values into 10 I32 words; packed_width says 9" in p for p in ct.problems())


def test_lm_evals_git_describe_says_nothing_on_stderr_and_records_the_same_hash(tmp_path, monkeypatch, capfd):
    """lm-eval's results' git_hash runs `git describe --always` in the working folder: outside a git repository
    every scoring run printed git's "fatal: not a git repository" (a review's repro). Under compat's quiet_git the
    call prints nothing and returns what lm-eval's own call returns, in a repository (this checkout, where it is
    one) and outside one."""
    import shutil
    import subprocess

    import lm_eval.loggers.utils

    from quantize.compat import lm_eval as compat

    from conftest import ROOT

    if shutil.which("git") is None:
        pytest.skip("git is not installed: lm-eval's call fails quietly without it")
    for where in (tmp_path, ROOT):
        monkeypatch.chdir(where)
        plain = lm_eval.loggers.utils.get_git_commit_hash()
        loud = capfd.readouterr().err
        with compat.quiet_git():
            quiet = lm_eval.loggers.utils.get_git_commit_hash()
        assert quiet == plain and capfd.readouterr().err == ""
        if where == tmp_path:
            assert "not a git repository" in loud  # what it silences
    assert lm_eval.loggers.utils.subprocess is subprocess  # put back


def test_a_changed_git_hash_call_is_found(monkeypatch):
    import lm_eval.evaluator

    from quantize.compat import lm_eval as compat

    monkeypatch.setattr(lm_eval.evaluator, "get_git_commit_hash", lambda: "x")
    assert any("get_git_commit_hash" in p for p in compat.problems())
