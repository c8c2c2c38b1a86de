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


# a child process loads a GGUF with llama.cpp (abort included): the model's load, as scoring starts it
LOAD = "import sys, llama_cpp as l; l.llama_model_load_from_file(sys.argv[1].encode(), l.llama_model_default_params())"


def test_llama_cpps_layer_limits_are_the_ones_restated(tmp_path):
    """checkpoint/ggufs.py restates llama.cpp's LLAMA_MAX_LAYERS (no binding exposes it), its rule that a per-layer
    array holds one entry per block, and its rule that the multi-token-prediction blocks are no more than the blocks
    (check_layers). Fails loudly when the installed llama.cpp moves any: a model of LLAMA_MAX_LAYERS blocks gets past
    its hyperparameters (to the missing vocabulary), one more aborts the process on the limit, a head_count_kv array
    of another length is refused as such, and nextn_predict_layers past block_count aborts the process (as many as
    the blocks gets past them)."""
    import os
    import subprocess
    import sys

    from gguf import GGUFWriter

    from quantize.checkpoint import ggufs

    def load(blocks: int, kv_heads: int | list[int] = 1, nextn: int = 0) -> subprocess.CompletedProcess:
        path = tmp_path / f"m{blocks}-{nextn}.gguf"
        w = GGUFWriter(str(path), "llama")
        w.add_block_count(blocks)
        w.add_embedding_length(64)
        w.add_feed_forward_length(128)
        w.add_head_count(4)
        w.add_head_count_kv(kv_heads)
        w.add_context_length(256)
        w.add_layer_norm_rms_eps(1e-5)
        if nextn:
            w.add_nextn_predict_layers(nextn)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # ggml's abort prints its assertion, no debugger's backtrace
        return subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, env=env)

    most, more = load(ggufs.LLAMA_MAX_LAYERS), load(ggufs.LLAMA_MAX_LAYERS + 1)
    assert most.returncode == 0 and "error loading model vocabulary" in most.stderr, most.stderr[-2000:]
    assert more.returncode != 0 and "LLAMA_MAX_LAYERS" in more.stderr, more.stderr[-2000:]
    short = load(2, [1])
    assert "head_count_kv has wrong array length; expected 2, got 1" in short.stderr, short.stderr[-2000:]
    as_many, past = load(2, nextn=2), load(2, nextn=3)
    assert as_many.returncode == 0 and "error loading model vocabulary" in as_many.stderr, as_many.stderr[-2000:]
    assert past.returncode != 0, past.stderr[-2000:]
    assert "GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all) failed" in past.stderr, past.stderr[-2000:]


def test_a_recurrent_or_hybrid_memory_is_one_llama_cpp_cannot_rewind(smollm2, tmp_path, monkeypatch):
    """`memory_rewinds` is llama.cpp's own answer (llama_model_is_recurrent / llama_model_is_hybrid): True for the
    default model's attention-only KV cache, False for a Mamba; without either function, a warning and False
    (every row decoded from an empty memory, right for any model)."""
    from types import SimpleNamespace

    from gguf_models import tiny_mamba_gguf
    from llama_cpp import Llama

    mamba = tiny_mamba_gguf(tmp_path / "mamba.gguf", smollm2)
    seen = {}
    for name, path in (("attention", smollm2), ("mamba", mamba)):
        llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        seen[name] = compat.memory_rewinds(llm.model)
        llm.close()
    assert seen == {"attention": True, "mamba": False}
    monkeypatch.setattr(compat, "_low_level", lambda: SimpleNamespace(llama_model_is_recurrent=lambda _m: False))
    with pytest.warns(RuntimeWarning, match="llama_model_is_hybrid"):
        assert compat.memory_rewinds(None) is False
    assert "llama_cpp.llama_model_is_hybrid is missing" in compat.problems()
