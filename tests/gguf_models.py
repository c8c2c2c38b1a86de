"""Tiny GGUFs that llama.cpp loads and runs, written with the gguf package (no download, no converter): a Mixtral-
style mixture of experts in llama.cpp's `llama` architecture (2 layers, hidden 64, 4 routed experts of which 2 are
chosen, their weights fused 3-D as `ffn_{gate,up,down}_exps`), seeded F16 weights, and the default model's own
vocabulary (tokens, merges and special ids copied from its GGUF, so llama.cpp tokenizes text as it does for
SmolLM2); and the same model with a vocabulary llama.cpp aborts on. Used by tests/convert/test_gguf_recipes.py,
tests/evaluate/test_llamacpp.py and benchmarks/imatrix_reference.py. And, for a Hugging Face checkpoint that
llama.cpp's converter writes (tests/convert/test_hf_to_gguf.py, benchmarks/hf_to_gguf_roundtrip.py), SmolLM2's
tokenizer files rebuilt from that GGUF's vocabulary as SmolLM2's own tokenizer.json has it: byte-level BPE, digits
split one by one. And GGUFs that llama.cpp loads, of multi-token-prediction blocks or heads given per layer
(loadable_gguf: the KV cache it allocates for them, tests/checkpoint/test_gguf.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def tiny_moe_gguf(
    path: Path,
    vocabulary: Path,
    layers: int = 2,
    hidden: int = 64,
    ff: int = 128,
    experts: int = 4,
    seed: int = 0,
    split: int = 0,
    embedding: str = "F16",
    output: str | None = None,
    **forged: int,
) -> Path:
    """A loadable MoE GGUF at `path` with `vocabulary`'s tokenizer (a GGUF's: the default model's). `split`: at
    most that many tensors a file, as the gguf package's writer splits a GGUF (PATH-00001-of-0000N.gguf and on,
    beside `path`; the first part's path is returned). `embedding`: token_embd's ggml type; `output`: an output head of
    its own (`output.weight`) of that type, else the embedding is the head; a block type is quantized by the gguf
    package (gguf.quants.quantize: Q8_0, Q4_0, ...). `forged` (kv_heads, used, k_heads): another KV head count
    (the tensors shaped for it), experts used per token, or attn_k shaped for that many KV heads against the
    header: headers llama.cpp stops on."""
    tokenizer, vocab = _copied_vocabulary(vocabulary)
    return _write(path, tokenizer, vocab, layers, hidden, ff, experts, seed, split, embedding, output, **forged)


def _copied_vocabulary(vocabulary: Path) -> tuple[Callable[[Any], None], int]:
    """What writes `vocabulary`'s tokenizer (a GGUF's: tokens, merges, special ids) into a GGUFWriter, and its size."""
    from gguf import GGUFReader

    fields = GGUFReader(vocabulary).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()

    def tokenizer(w: Any) -> None:
        w.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
        w.add_tokenizer_pre(fields["tokenizer.ggml.pre"].contents())
        w.add_token_list(tokens)
        w.add_token_types(fields["tokenizer.ggml.token_type"].contents())
        w.add_token_merges(fields["tokenizer.ggml.merges"].contents())
        w.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"].contents())
        w.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"].contents())
        w.add_add_bos_token(False)

    return tokenizer, len(tokens)


def tiny_mamba_gguf(path: Path, vocabulary: Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A loadable Mamba (selective state-space) GGUF at `path` with `vocabulary`'s tokenizer, as llama.cpp's
    converter writes one (`mamba`: its tensors named by the gguf package's map for the architecture; the inner size
    twice the hidden, as llama.cpp requires; A stored as -exp(A_log), the convolution kernel 2-D): the projections
    F16, the state-space parameters (`ssm_a`, `ssm_d`), the convolution and the biases F32, seeded. Its time-step
    rank is 32 so that every projection's rows hold whole 32-blocks (Q8_0 writes them all)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    inner, state, conv, rank = 2 * hidden, 16, 4, 32
    tokenizer, vocab = _copied_vocabulary(vocabulary)
    w = GGUFWriter(str(path), "mamba")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(layers)
    w.add_ssm_conv_kernel(conv)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(state)
    w.add_ssm_time_step_rank(rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_dt_b_c_rms(False)
    w.add_file_type(1)  # MOSTLY_F16
    tokenizer(w)
    rng = np.random.default_rng(seed)

    def f16(name: str, *shape: int, scale: float = 0.1) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float16)
        w.add_tensor(name, data, raw_dtype=GGMLQuantizationType.F16)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, data.astype(np.float32), raw_dtype=GGMLQuantizationType.F32)

    f16("token_embd.weight", vocab, hidden, scale=1.0)
    f32("output_norm.weight", np.ones(hidden))
    for i in range(layers):
        b = f"blk.{i}."
        f32(b + "attn_norm.weight", np.ones(hidden))
        f16(b + "ssm_in.weight", 2 * inner, hidden)
        f32(b + "ssm_conv1d.weight", rng.standard_normal((inner, conv)) * 0.1)
        f32(b + "ssm_conv1d.bias", rng.standard_normal(inner) * 0.1)
        f16(b + "ssm_x.weight", rank + 2 * state, inner)
        f16(b + "ssm_dt.weight", inner, rank)
        f32(b + "ssm_dt.bias", np.log(np.expm1(np.full(inner, 0.01))))
        f32(b + "ssm_a", -np.tile(np.arange(1, state + 1, dtype=np.float64), (inner, 1)))
        f32(b + "ssm_d", np.ones(inner))
        f16(b + "ssm_out.weight", hidden, inner)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def smollm2_tokenizer_files(vocabulary: Path, folder: Path) -> Path:
    """SmolLM2's tokenizer (tokenizer.json, its config and chat template) written into `folder`, rebuilt from the
    tokens, merges, special tokens and chat template of `vocabulary` (the default model's GGUF): byte-level BPE
    behind a digit splitter, as the Hub's SmolLM2 tokenizer.json is, which llama.cpp's converter recognizes (the
    hash of its tokenization of a fixed text) as its `smollm` pre-tokenizer."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fields = GGUFReader(vocabulary).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ")) for m in fields["tokenizer.ggml.merges"].contents()]
    kinds = fields["tokenizer.ggml.token_type"].contents()
    t = Tokenizer(models.BPE({tok: i for i, tok in enumerate(tokens)}, merges, byte_fallback=False))
    t.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, k in enumerate(kinds) if k == 3])
    special = {k: tokens[fields[f"tokenizer.ggml.{k}_token_id"].contents()] for k in ("bos", "eos", "unknown")}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=t,
        bos_token=special["bos"],
        eos_token=special["eos"],
        unk_token=special["unknown"],
        pad_token=special["eos"],
    )
    fast.chat_template = fields["tokenizer.chat_template"].contents()
    fast.save_pretrained(folder)
    return folder


def byteless_vocabulary_gguf(path: Path) -> Path:
    """A tiny MoE GGUF whose vocabulary llama.cpp loads and cannot use: SentencePiece-style (`llama`) with no
    <0xNN> byte tokens, so the tokenizer's byte fallback for a character it has no piece for throws
    std::out_of_range out of llama_vocab::byte_to_token, and the process aborts."""
    tokens = ["<unk>", "<s>", "</s>", "\u2581a", "\u2581b", "a", "b"]

    def tokenizer(w: Any) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0])
        w.add_token_types([2, 3, 3, 1, 1, 1, 1])  # unknown, control, control, normal...
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)

    return _write(path, tokenizer, len(tokens), 1, 64, 128, 4, 0)


def _write(
    path: Path,
    tokenizer: Callable[[Any], None],
    vocab: int,
    layers: int,
    hidden: int,
    ff: int,
    experts: int,
    seed: int,
    split: int = 0,
    embedding: str = "F16",
    output: str | None = None,
    kv_heads: int = 2,
    used: int = 2,
    k_heads: int | None = None,
) -> Path:
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.gguf_writer import SHARD_NAME_FORMAT

    heads = 4
    head = hidden // heads
    w = GGUFWriter(str(path), "llama", split_max_tensors=split)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    w.add_file_type(1)  # MOSTLY_F16
    tokenizer(w)
    rng = np.random.default_rng(seed)

    def f16(name: str, shape: tuple[int, ...], scale: float = 0.1) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float16)
        w.add_tensor(name, data, raw_dtype=GGMLQuantizationType.F16)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, data.astype(np.float32), raw_dtype=GGMLQuantizationType.F32)

    def typed(name: str, shape: tuple[int, ...], ggml_type: str) -> None:
        from gguf.quants import quantize

        qtype = GGMLQuantizationType[ggml_type]
        w.add_tensor(name, quantize(rng.standard_normal(shape).astype(np.float32), qtype), raw_dtype=qtype)

    typed("token_embd.weight", (vocab, hidden), embedding)
    if output is not None:
        typed("output.weight", (vocab, hidden), output)
    f32("output_norm.weight", np.ones(hidden))
    for i in range(layers):
        f32(f"blk.{i}.attn_norm.weight", np.ones(hidden))
        f32(f"blk.{i}.ffn_norm.weight", np.ones(hidden))
        f16(f"blk.{i}.attn_q.weight", (hidden, hidden))
        f16(f"blk.{i}.attn_k.weight", (head * (k_heads or kv_heads), hidden))
        f16(f"blk.{i}.attn_v.weight", (head * kv_heads, hidden))
        f16(f"blk.{i}.attn_output.weight", (hidden, hidden))
        f32(f"blk.{i}.ffn_gate_inp.weight", rng.standard_normal((experts, hidden)))
        f16(f"blk.{i}.ffn_gate_exps.weight", (experts, ff, hidden))
        f16(f"blk.{i}.ffn_up_exps.weight", (experts, ff, hidden))
        f16(f"blk.{i}.ffn_down_exps.weight", (experts, hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split and (parts := len(w.tensors)) > 1:
        return path.with_name(SHARD_NAME_FORMAT.format(path.stem, 1, parts))
    return path


# the sentencepiece-style vocabulary of byteless_vocabulary_gguf: enough to load a model (no text is tokenized)
_PIECES = ["<unk>", "<s>", "</s>", "\u2581a", "\u2581b", "a", "b"]


def loadable_gguf(
    path: Path,
    arch: str,
    mtp: int = 0,
    stored: bool = True,
    layers: int = 2,
    heads: int | list[int] = 4,
    kv_heads: int | list[int] | None = 2,
    **meta: int | list[int],
) -> Path:
    """A GGUF llama.cpp loads of `layers` decoder blocks and then `mtp` multi-token-prediction blocks, the last
    `{arch}.nextn_predict_layers` of `{arch}.block_count` (F32, hidden 64, `heads` query and `kv_heads` KV heads of 16:
    numbers, or per-layer arrays written as such, `kv_heads` None writing no head_count_kv): `glm4moe` as llama.cpp's
    converter writes GLM-4.5 (a dense first block, then MoE blocks of 4 experts, 2 used, and a shared expert; each
    MTP block a decoder block and its nextn.* head), `llama` (dense blocks, every layer's attention as wide as layer
    0's: llama.cpp's `llama` takes no other), or `deci` as llama.cpp's converter writes a Nemotron-NAS model
    (DeciLM): each layer's attention as wide as its own heads, a layer of no KV heads only an output projection
    (llama.cpp's linear attention), one of no heads no attention. `stored` False writes the MTP blocks' count but
    none of their tensors (a trunk whose head was left out). `meta`: more `{arch}.KEY` numbers or arrays, written
    as given (headers llama.cpp refuses)."""
    from gguf import GGUFWriter

    hidden, ff, experts, head = 64, 32, 4, 16
    blocks = layers + mtp
    q = heads if isinstance(heads, list) else [heads] * blocks
    kv = kv_heads if isinstance(kv_heads, list) else q if kv_heads is None else [kv_heads] * blocks
    w = GGUFWriter(str(path), arch)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_block_count(blocks)
    w.add_feed_forward_length(ff)
    for key, value in {"attention.head_count": heads, "attention.head_count_kv": kv_heads, **meta}.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif value is not None:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head)
    if arch == "glm4moe":
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
        w.add_expert_shared_count(1)
        w.add_expert_feed_forward_length(ff)
        w.add_leading_dense_block_count(1)
    if mtp:
        w.add_nextn_predict_layers(mtp)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(_PIECES)
    w.add_token_scores([0.0] * len(_PIECES))
    w.add_token_types([2, 3, 3, 1, 1, 1, 1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(0)

    def f32(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    f32("token_embd.weight", len(_PIECES), hidden)
    f32("output_norm.weight", hidden)
    f32("output.weight", len(_PIECES), hidden)
    for i in range(layers + (mtp if stored else 0)):
        b = f"blk.{i}."
        _block(f32, b, arch, *((q[i], kv[i]) if arch == "deci" else (q[0], kv[0])), dense=i == 0)
        if i >= layers:
            f32(b + "nextn.eh_proj.weight", hidden, 2 * hidden)
            for n in ("enorm", "hnorm", "shared_head_norm"):
                f32(b + f"nextn.{n}.weight", hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _block(f32: Callable[..., None], b: str, arch: str, n_q: int, n_kv: int, dense: bool) -> None:
    """loadable_gguf's decoder block `b` (hidden 64, heads of 16): attention of `n_q` query and `n_kv` KV heads (no KV
    head: an output projection alone; neither: none), then a dense MLP (32) or, for glm4moe but its `dense` first
    block, GLM-4.5's routed experts (4, of 32) with a shared one."""
    hidden, ff, experts, head = 64, 32, 4, 16
    moe = arch == "glm4moe" and not dense
    if n_kv:
        f32(b + "attn_norm.weight", hidden)
        f32(b + "attn_q.weight", n_q * head, hidden)
        f32(b + "attn_k.weight", n_kv * head, hidden)
        f32(b + "attn_v.weight", n_kv * head, hidden)
        f32(b + "attn_output.weight", hidden, n_q * head)
    elif n_q:
        f32(b + "attn_norm.weight", hidden)
        f32(b + "attn_output.weight", hidden, hidden)
    f32(b + ("post_attention_norm.weight" if arch == "glm4moe" else "ffn_norm.weight"), hidden)
    if not moe:
        f32(b + "ffn_gate.weight", ff, hidden)
        f32(b + "ffn_up.weight", ff, hidden)
        f32(b + "ffn_down.weight", hidden, ff)
        return
    f32(b + "ffn_gate_inp.weight", experts, hidden)
    f32(b + "exp_probs_b.bias", experts)
    for n in ("gate", "up"):
        f32(b + f"ffn_{n}_exps.weight", experts, ff, hidden)
        f32(b + f"ffn_{n}_shexp.weight", ff, hidden)
    f32(b + "ffn_down_exps.weight", experts, hidden, ff)
    f32(b + "ffn_down_shexp.weight", hidden, ff)
