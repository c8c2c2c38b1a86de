"""quantize/compat/llama_cpp.py: the echo patch's lines are in the installed llama-cpp-python exactly once, and a
version or a line that moved is found and refused (never half-patched)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make gguf-env`")

from llama_cpp import llama as module

from quantize.compat import llama_cpp as compat


def test_the_echo_patch_holds_on_the_pinned_version():
    """Fails loudly when an upgrade moves a patched line: read quantize/compat/llama_cpp.py against the new
    `Llama._create_completion`, check whether the echo is still off by one, then widen CHECKED or drop the patch."""
    assert compat.problems() == []


def test_a_moved_line_and_another_version_are_refused_unpatched(monkeypatch):
    own = module.Llama._create_completion
    monkeypatch.setattr(compat, "PATCHES", [*compat.PATCHES, ("a line 0.3.36 does not hold", "x")])
    with pytest.raises(RuntimeError, match="0 copies of the patched line 'a line 0.3.36"):
        compat.patch_echo()
    monkeypatch.setattr(compat, "PATCHES", compat.PATCHES[:-1])
    monkeypatch.setattr(compat, "version", lambda _name: "0.3.40")
    with pytest.raises(RuntimeError, match="outside the checked range"):
        compat.patch_echo()
    assert module.Llama._create_completion is own


def test_the_patch_replaces_the_method_in_this_process(monkeypatch):
    monkeypatch.setattr(module.Llama, "_create_completion", module.Llama._create_completion)  # restored after
    before = module.Llama._create_completion
    compat.patch_echo()
    after = module.Llama._create_completion
    assert after is not before and after.__code__.co_filename.startswith("<patched ")
    assert "_eog_token" in after.__code__.co_varnames


def test_the_ggml_tensor_layout_reads_what_ggml_made():
    """Fails loudly when an upgrade moves a field of struct ggml_tensor: read ggml.h of the new version against
    compat.GGMLTensor, then widen CHECKED."""
    assert compat.tensor_problems() == []


def test_a_moved_field_is_found(monkeypatch):
    """The layout with `op` read one int early (as if a field before it had gone): the check names what it misread."""
    import ctypes

    fields = [(n, t) for n, t in compat.GGMLTensor._fields_ if n != "op_params"]
    fields.insert([n for n, _ in fields].index("op"), ("op_params", ctypes.c_int32 * 16))
    moved = type("Moved", (ctypes.Structure,), {"_fields_": fields})
    monkeypatch.setattr(compat, "GGMLTensor", moved)
    found = compat.tensor_problems()
    assert any(p.startswith("struct ggml_tensor read through GGMLTensor: op is 0") for p in found), found


def test_the_converter_is_unpacked_of_the_installed_version():
    """Fails loudly when llama-cpp-python moves without its converter: `make gguf-env` unpacks the one of its
    source distribution (convert/hf_to_gguf.py runs it)."""
    assert compat.converter_problems() == []
