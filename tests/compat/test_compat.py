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


def test_an_oneshot_that_no_longer_linearizes_experts_first_is_found(monkeypatch):
    """The mapping check lays fused experts out as oneshot does before its modifiers resolve their mappings
    (convert/backends/mappings.py); a library that stops doing so, or builds the layout otherwise, is named."""
    from llmcompressor.modeling.moe import linearize

    from quantize.compat import llmcompressor as compat

    monkeypatch.setattr(compat.inspect, "getsource", lambda _obj: "")
    found = compat.problems()
    assert any("no longer linearizes fused experts" in p for p in found)
    assert any("no longer builds its layout as cls(config)" in p for p in found)
    monkeypatch.delattr(linearize, "get_non_linearized_moes")
    assert any("has no get_non_linearized_moes" in p for p in compat.problems())
