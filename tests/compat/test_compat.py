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


def test_an_oneshot_that_no_longer_linearizes_experts_first_is_found(monkeypatch):
    """The mapping check lays fused experts out as oneshot does before its modifiers resolve their mappings
    (convert/backends/mappings.py); a library that stops doing so, or builds the layout otherwise, is named."""
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
