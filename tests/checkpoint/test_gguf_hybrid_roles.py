"""A hybrid model's GGUF, as llama.cpp's own converter writes it from the safetensors checkpoint, is accounted as that
checkpoint is (issue #57 on the GGUF side): the same parameters in each part of the model (its Mamba, short
convolution, attention, MLP, experts, norms) and in each role (a recurrent mixer's `state`, a convolution's `conv`,
norms, biases), where the old code put every SSM_* and SHORTCONV_* tensor in part `other`, the state-space
parameters in role `other` and the convolution kernels in `linear_kept`. And the short convolution's state of an
LFM2 GGUF is the one llama.cpp allocates (its load log's `R (f32)`), not transformers' conv cache.

Each checkpoint is the family's model from transformers' own config class with random weights (tests/families.py)
and SmolLM2's tokenizer files, written as an F16 GGUF by the converter (convert/hf_to_gguf.py); skipped without
llama-cpp-python, its converter (`make gguf-env`) or the default model's GGUF (its vocabulary)."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

import families
import pytest

from quantize import api
from quantize.checkpoint import accounting, ggufs
from quantize.checkpoint.headers import TensorInfo
from quantize.compat import llama_cpp as compat
from quantize.convert import hf_to_gguf
from quantize.cost import bounds

SMOLLM2_VOCAB = 49152
HYBRIDS = ["lfm2", "falcon_h1", "nemotron_h", "granitemoehybrid"]


@pytest.fixture(scope="module")
def converter():
    pytest.importorskip("llama_cpp")
    if found := compat.converter_problems():
        pytest.skip(f"llama.cpp's converter is not usable here ({'; '.join(found)}): `make gguf-env`")


def converted(family: str, folder: Path, vocabulary: Path, **config) -> tuple[Path, Path]:
    """(the safetensors checkpoint, its F16 GGUF written by llama.cpp's converter)."""
    from gguf_models import smollm2_tokenizer_files

    src = families.save_random(families.config(family, vocab_size=SMOLLM2_VOCAB, **config), folder / "hf")
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            f.unlink()
    smollm2_tokenizer_files(vocabulary, src)
    hf_to_gguf.write(src, folder / "model.gguf", folder)
    return src, folder / "model.gguf"


@pytest.fixture(scope="module")
def pairs(converter, smollm2, tmp_path_factory):
    return {f: converted(f, tmp_path_factory.mktemp(f), smollm2) for f in HYBRIDS}


def safetensors_roles(src: Path) -> Counter[str]:
    """Parameters by role of a safetensors checkpoint, tensor by tensor (accounting.role_of)."""
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), "np") as f:
        shapes = {n: list(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118 (safe_open has no iteration)
    out: Counter[str] = Counter()
    for n, s in shapes.items():
        role = accounting.role_of(n, TensorInfo(n, "BF16", s, 0, "x"), set(shapes))
        out[role] += math.prod(s)
    return out


def gguf_roles(path: Path) -> Counter[str]:
    """Parameters by role of a GGUF, tensor by tensor (ggufs.role_of); an F16 GGUF's linear weights are
    `linear_kept`, as a bf16 checkpoint's are."""
    h = ggufs.read_header(path)
    patterns, stored = ggufs.name_patterns(h.architecture), {t.name for t in h.tensors}
    out: Counter[str] = Counter()
    for t in h.tensors:
        out[ggufs.role_of(t, patterns, stored).role] += t.elements
    return out


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_hybrid_gguf_is_accounted_by_part_and_role_as_its_safetensors_source(pairs, family):
    """`quantize inspect` of the GGUF gives each part of the model the parameters `quantize inspect` of the
    safetensors checkpoint it was converted from gives it (Mamba in falcon-h1, granite-hybrid and nemotron-h, the
    short convolution in LFM2: part `other` before), and the same parameters each role (state: A_log, D, dt_bias;
    conv: the conv1d kernels; before: `other` and `linear_kept`, and dt_bias a `bias`)."""
    src, gguf_path = pairs[family]
    st, gg = accounting.bits_report(src), accounting.bits_report(gguf_path)
    parts = {p: r["parameters"] for p, r in st.bytes_by_part.items() if r["parameters"]}
    assert {p: r["parameters"] for p, r in gg.bytes_by_part.items() if r["parameters"]} == parts
    assert "other" not in parts and ("mamba" in parts or "short_conv" in parts)
    roles = safetensors_roles(src)
    assert gguf_roles(gguf_path) == roles
    assert roles["conv"] and (family == "lfm2" or roles["state"])


def test_gpt_oss_attention_sinks_in_a_gguf_are_scalars_as_in_its_safetensors_source(converter, smollm2, tmp_path):
    """gpt-oss's attention sinks (one logit a head, `self_attn.sinks`), which llama.cpp's converter writes as
    `blk.N.attn_sinks.weight`, are role `scalar` in the GGUF as in the checkpoint it came from, and every role and part
    holds the same parameters on both sides; the old code asked the accounting's rules for `self_attn.sinks.weight`,
    a name no rule knows, and called them `other`."""
    src, path = converted("gpt_oss", tmp_path, smollm2)
    roles = safetensors_roles(src)
    assert roles["scalar"] and gguf_roles(path) == roles
    st, gg = accounting.bits_report(src), accounting.bits_report(path)
    assert {p: r["parameters"] for p, r in gg.bytes_by_part.items() if r["parameters"]} == {
        p: r["parameters"] for p, r in st.bytes_by_part.items() if r["parameters"]
    }


RECURRENT = re.compile(
    r"llama_memory_recurrent: size = +([0-9.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+) seqs.*R \(f32\): +"
    r"([0-9.]+) MiB, S \(f32\): +([0-9.]+) MiB"
)
KV = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB \( *(\d+) cells, +(\d+) layers")


def test_an_lfm2_ggufs_short_convolution_state_is_the_one_llama_cpp_allocates(converter, smollm2, tmp_path):
    """The short convolution's state `quantize cost` prices for an LFM2 GGUF is the recurrent state llama.cpp
    allocates for it, from its load log: 2 convolution layers of hidden 128 × (L_cache 257 − 1) values at F32 (R:
    0.25 MiB, a size its log prints exactly; no S), and the KV cache of its 2 attention layers. The old code priced
    transformers' conv cache, hidden × L_cache values at 2 bytes (0.13 MiB)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from quantize.quiet import llama_log

    _, path = converted("lfm2", tmp_path, smollm2, conv_L_cache=257)
    context = 2048
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
    with llama_log() as log:
        llama_cpp.Llama(str(path), n_ctx=context, n_threads=1, verbose=True).close()
        said = log.read_text()
    ((_, cells, _, seqs, r, s),) = RECURRENT.findall(said)
    assert (int(cells), int(seqs)) == (1, 1)  # one sequence's state
    state = sum(layer.state_bytes for layer in c.kv_bytes_per_layer)
    assert state == round(float(r) * 2**20) == 2 * 128 * 256 * 4 and float(s) == 0
    assert c.kv_layout["state_layers"] == 2 and "F32" in c.kv_layout["state_dtype"]
    ((kv_mib, kv_cells, _),) = KV.findall(said)
    assert int(kv_cells) == context and round(float(kv_mib) * 2**20) == c.kv_bytes_per_sequence - state


def test_a_short_convolution_state_of_no_whole_length_is_refused(tmp_path, capsys):
    """`quantize cost` of an LFM2 header whose shortconv.l_cache is 0 (no whole length of at least 1) is refused,
    exit 2 naming the key, not priced as a state of no bytes, as the old code priced it."""
    import numpy as np
    from gguf import GGUFWriter

    from quantize.cli import main

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "lfm2")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv([0, 2])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32("lfm2.shortconv.l_cache", 0)
    w.add_tensor("token_embd.weight", np.zeros((256, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["cost", "--checkpoint", str(path), "--context", "2048"]) == 2
    err = capsys.readouterr().err
    assert "lfm2.shortconv.l_cache is 0" in err and "Traceback" not in err
