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


def load_log(path: Path, context: int) -> str:
    """What llama.cpp prints while it loads the GGUF at `context` tokens for one sequence (its memory sizes)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from quantize.quiet import llama_log

    with llama_log() as log:
        llama_cpp.Llama(str(path), n_ctx=context, n_threads=1, verbose=True).close()
        return log.read_text()


def test_an_lfm2_ggufs_short_convolution_state_is_the_one_llama_cpp_allocates(converter, smollm2, tmp_path):
    """The short convolution's state `quantize cost` prices for an LFM2 GGUF is the recurrent state llama.cpp
    allocates for it, from its load log: 2 convolution layers of hidden 128 × (L_cache 257 − 1) values at F32 (R:
    0.25 MiB, a size its log prints exactly; no S), and the KV cache of its 2 attention layers. The old code priced
    transformers' conv cache, hidden × L_cache values at 2 bytes (0.13 MiB)."""
    _, path = converted("lfm2", tmp_path, smollm2, conv_L_cache=257)
    context = 2048
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
    said = load_log(path, context)
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
    code, err = cost_of_header(tmp_path, capsys, "lfm2", 128, {"lfm2.shortconv.l_cache": 0})
    assert code == 2 and "lfm2.shortconv.l_cache is 0" in err and "Traceback" not in err


def cost_of_header(tmp_path: Path, capsys, arch: str, ff: int | list[int], keys: dict[str, int]) -> tuple[int, str]:
    """`quantize cost --checkpoint` (2k context) of a two-block header of `arch` (64 wide, 2 heads, KV heads [0, 2],
    feed-forward length `ff`) with the integer `keys` added (a 64-bit one where it needs 64 bits): exit code and
    stderr."""
    import numpy as np
    from gguf import GGUFWriter

    from quantize.cli import main

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(ff)
    w.add_head_count(2)
    w.add_head_count_kv([0, 2])
    w.add_layer_norm_rms_eps(1e-5)
    for key, value in keys.items():
        (w.add_uint64 if value >= 2**32 else w.add_uint32)(key, value)
    w.add_tensor("token_embd.weight", np.zeros((256, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code = main(["cost", "--checkpoint", str(path), "--context", "2048"])
    return code, capsys.readouterr().err


# Mamba2 hybrids whose converter GGUFs llama.cpp loads, at shapes whose state its load log prints exactly (R and S
# each a multiple of 0.25 MiB): Falcon-H1 (a KV cache and a Mamba2 state in every layer) and Nemotron-H with no MLP
# layer (its Mamba layers keep a state, its attention layer KV, its MoE layer neither)
LOADED_MAMBA2 = {
    "falcon_h1": dict(mamba_d_head=64, mamba_d_ssm=256, mamba_d_state=64, mamba_n_groups=2, mamba_d_conv=33),
    "nemotron_h": dict(
        layers_block_type=["linear_attention", "full_attention", "moe", "linear_attention"],
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=1,
        conv_kernel=65,
    ),
}


@pytest.fixture(scope="module")
def loaded_mamba2(converter, smollm2, tmp_path_factory):
    return {f: converted(f, tmp_path_factory.mktemp(f), smollm2, **kw)[1] for f, kw in LOADED_MAMBA2.items()}


@pytest.mark.parametrize("context", [2048, 32768])
@pytest.mark.parametrize("family", list(LOADED_MAMBA2))
def test_a_mamba2_hybrid_ggufs_kv_and_state_are_the_ones_llama_cpp_allocates(loaded_mamba2, family, context):
    """`quantize cost` of a Falcon-H1 or Nemotron-H GGUF prices the KV cache and the Mamba2 state llama.cpp
    allocates for one sequence at that context (its load log: the KV cache's size and cells, the recurrent
    memory's R (f32) and S (f32)), with no note (llama.cpp loads it). The old code refused both (exit 2)."""
    path = loaded_mamba2[family]
    c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
    said = load_log(path, context)
    ((_, cells, _, seqs, r, s),) = RECURRENT.findall(said)
    assert (int(cells), int(seqs)) == (1, 1)  # one sequence's state
    state_layers = [layer for layer in c.kv_bytes_per_layer if layer.state_bytes]
    rs = ggufs.mamba_layers(ggufs.read_header(path)).state
    assert len(state_layers) * rs.r * ggufs.RECURRENT_STATE_BYTES == round(float(r) * 2**20) > 0
    assert len(state_layers) * rs.s * ggufs.RECURRENT_STATE_BYTES == round(float(s) * 2**20) > 0
    state = sum(layer.state_bytes for layer in c.kv_bytes_per_layer)
    assert state == round((float(r) + float(s)) * 2**20) == c.state_bytes_per_sequence
    ((kv_mib, kv_cells, kv_layers),) = KV.findall(said)
    assert int(kv_cells) == context and round(float(kv_mib) * 2**20) == c.kv_bytes_per_sequence - state
    assert int(kv_layers) == sum(1 for layer in c.kv_bytes_per_layer if layer.kv_bytes)
    assert "F32" in c.kv_layout["state_dtype"] and "note" not in c.kv_layout


def _state_by_hand(path: Path) -> int:
    """One Mamba2 layer's state in bytes, counted by hand from the GGUF's metadata as llama.cpp's n_embd_r and
    n_embd_s size it: (conv_kernel − 1) × (inner_size + 2 × group_count × state_size) + state_size × inner_size,
    4 bytes (F32) each."""
    import gguf

    h = ggufs.read_header(path)
    names = ("CONV_KERNEL", "INNER_SIZE", "STATE_SIZE", "GROUP_COUNT")
    m = {n: h.metadata[getattr(gguf.Keys.SSM, n).format(arch=h.architecture)] for n in names}
    return 4 * (
        (m["CONV_KERNEL"] - 1) * (m["INNER_SIZE"] + 2 * m["GROUP_COUNT"] * m["STATE_SIZE"])
        + m["STATE_SIZE"] * m["INNER_SIZE"]
    )


@pytest.mark.parametrize("family", ["granitemoehybrid", "nemotron_h"])
def test_a_mamba2_hybrid_gguf_llama_cpp_does_not_load_is_priced_by_its_rule_with_a_note(pairs, family):
    """The converter's GGUFs of the tiny Granite 4 and Nemotron-H (with an MLP layer) models do not load in
    llama.cpp 0.3.36 (its converter writes their layer kinds as head counts and feed-forward lengths that llama.cpp's
    own rule then reads otherwise: it wants a Mamba layer's ssm_in where an attention or MLP block is stored). Their
    cost is llama.cpp's rule read from the header, counted by hand here: a Mamba2 state in each block of no KV head
    (Nemotron-H: and no feed-forward length), KV where the rule keeps it, at 2k and 32k, and the cost's note says
    llama.cpp does not load the GGUF, naming the block. The old code refused both (exit 2)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import gguf

    path = pairs[family][1]
    with pytest.raises(ValueError):
        llama_cpp.Llama(str(path), n_ctx=2048, n_threads=1, verbose=False)
    h = ggufs.read_header(path)
    key = gguf.Keys.Attention
    arch = h.architecture
    kv_heads = h.metadata[key.HEAD_COUNT_KV.format(arch=arch)]
    ff = h.metadata[gguf.Keys.LLM.FEED_FORWARD_LENGTH.format(arch=arch)]
    ff = ff if isinstance(ff, list) else [ff] * len(kv_heads)
    nemotron = family == "nemotron_h"
    mamba = [n == 0 and (f == 0 or not nemotron) for n, f in zip(kv_heads, ff, strict=True)]
    attention = [not m and (f == 0 or not nemotron) for m, f in zip(mamba, ff, strict=True)]
    head = h.metadata[gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)] // h.metadata[key.HEAD_COUNT.format(arch=arch)]
    width = sum(h.metadata.get(k.format(arch=arch), head) for k in (key.KEY_LENGTH, key.VALUE_LENGTH))
    for context in (2048, 32768):
        c = api.decode_cost(path, workload=bounds.Workload(context_tokens=context))
        by_hand = [
            (_state_by_hand(path) if m else 0) + (2 * n * width * context if a else 0)
            for m, a, n in zip(mamba, attention, kv_heads, strict=True)
        ]
        assert [layer.bytes for layer in c.kv_bytes_per_layer] == by_hand and any(mamba)
        assert c.kv_bytes_per_sequence == sum(by_hand)
        note = c.kv_layout["note"]
        first = next(
            i for i, m in enumerate(mamba) if m and f"blk.{i}.ssm_in.weight" not in {t.name for t in h.tensors}
        )
        assert "does not load this GGUF" in note and f"blk.{first}.ssm_in.weight" in note


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("nemotron_h.ssm.conv_kernel", 0, "nemotron_h.ssm.conv_kernel is 0"),
        # a 64-bit size llama.cpp's type check refuses: priced at 4e22 bytes before (r1)
        ("nemotron_h.ssm.state_size", 2**64 - 1, f"nemotron_h.ssm.state_size is {2**64 - 1}"),
        ("nemotron_h.ssm.state_size", 2**32, f"nemotron_h.ssm.state_size is {2**32}"),
        # every block a multi-token-prediction block: priced as if none were before (r1)
        ("nemotron_h.nextn_predict_layers", 2, "no layer would decode"),
        # llama.cpp's load_arch_hparams requires it though no size reads it: priced, exit 0, before (r1)
        ("nemotron_h.ssm.time_step_rank", None, "nemotron_h.ssm.time_step_rank is absent"),
    ],
)
def test_a_mamba2_header_llama_cpp_would_not_size_a_state_by_is_refused(tmp_path, capsys, key, value, said):
    """`quantize cost` of a Nemotron-H header whose SSM size is 0 or not a 32-bit count (llama.cpp reads each as a
    uint32 and requires it), that lacks ssm.time_step_rank (required), or whose multi-token-prediction blocks are
    all its blocks is refused, exit 2 naming the key and value, not priced."""
    sizes = {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "group_count": 1, "time_step_rank": 4}
    keys = {f"nemotron_h.ssm.{name}": v for name, v in sizes.items()} | {key: value}
    code, err = cost_of_header(tmp_path, capsys, "nemotron_h", [0, 0], {k: v for k, v in keys.items() if v is not None})
    assert code == 2 and said in err and "Traceback" not in err
