"""Architecture knowledge as data: what config.json and the tensor names say about a model's attention, KV
cache and experts, for what llm-compressor and compressed-tensors do not describe (the decode cost model and
the accounting by part).

Every fact comes from a config.json field, checked against transformers' own config classes (5.17:
Qwen3MoeConfig, Qwen2MoeConfig, MixtralConfig, OlmoeConfig, DeepseekV3Config, GptOssConfig, Gemma2Config,
Gemma3TextConfig, Llama4TextConfig), never from the class name alone; `model_type` only supplies a family's
default pattern where an older config.json leaves `layer_types` out. The cost (`quantize cost --checkpoint`,
api.decode_cost) reads config.json as transformers' config class completes it (checkpoint/loader.completed_config:
the layer_types, per_layer_config and defaults the class derives, which a published config.json may leave out);
the readers that run without transformers (inspect's accounting, the checks before a model loads, the report's
decode column) read it as written. A shape field is at most MAX_SHAPE, a window at most MAX_WINDOW.

    KV values per token and layer:  MHA/GQA  2 × num_key_value_heads × head_dim
                                    MLA      kv_lora_rank + qk_rope_head_dim   (one latent, shared by all heads)
    tokens a layer holds:           full attention: the context; sliding window w: min(context, w);
                                    chunked attention (Llama 4) of chunk c: min(context, c)
    per-layer heads:                Gemma 4's per_layer_config (its full-attention layers' head_dim, KV heads)
    sparse attention (DeepSeek-V3.2): MLA + index_head_dim (the indexer's own key cache)
    compressed attention (DeepSeek-V4's compressed_sparse_attention, heavily_compressed_attention): one shared K=V
                                    head of head_dim up to sliding_window tokens, plus an entry of head_dim (and of
                                    index_head_dim, CSA's indexer) per compress_rates[type] tokens, and the tokens
                                    awaiting their window (COMPRESSED_LAYERS: DeepseekV4HCACache, DeepseekV4CSACache)
    fixed state per sequence:       linear attention (Gated DeltaNet, Kimi Delta Attention, MiniMax's lightning
                                    attention), Mamba2, short convolution: LINEAR_MIXERS by model_type
                                    (shapes of each family's modeling code, checked against its cache tensors)
    MoE layer i:                    Qwen (mlp_only_layers, decoder_sparse_step): i ∉ mlp_only_layers and
                                        (i + 1) mod decoder_sparse_step = 0
                                    DeepSeek (first_k_dense_replace, moe_layer_freq): i ≥ k and i mod freq = 0
                                    Kimi-Linear, DeepSeek-V3.2: mlp_layer_types[i] = "sparse"; DeepSeek-V4: "moe"
                                        or "hash_moe"
                                    LFM2-MoE (num_dense_layers): i ≥ num_dense_layers
                                    Llama 4: i ∈ moe_layers (else every interleave_moe_layer_step-th layer)
                                    otherwise (Mixtral, OLMoE, gpt-oss): every layer
    multi-token prediction (MTP):   layers num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers − 1
                                    (DeepSeek-V3/V3.2, GLM-4.5/4.6, GLM-4.7-Flash store them as `layers.N` after the
                                    decoder's: DeepSeek-V3's layers.61) are part `mtp`, not decoder layers: no MoE
                                    layer, no KV cache, not read by a plain decode step; transformers' causal LM
                                    does not load them (its classes ignore them as unexpected tensors)
                                    stored under a prefix of their own (Qwen3-Next's and Qwen3.5's `mtp.*`,
                                    Nemotron-H's, MiMo's `model.mtp.*`): every tensor whose name a pattern of the
                                    family's model's `_keys_to_ignore_on_load_unexpected` mentioning mtp matches
                                    (MTP_UNEXPECTED, by model_type) is part `mtp` the same way
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from quantize.compat.transformers_config_names import MTP_UNEXPECTED, OWN_LAYER_TYPES, SLIDING_SWITCH, spellings
from quantize.errors import UsageError

# --- parts of a model, by tensor name -----------------------------------------------------------

PARTS = (
    "attention",
    "linear_attention",
    "mamba",
    "short_conv",
    "indexer",
    "mlp",
    "routed_experts",
    "shared_experts",
    "router",
    "embedding",
    "lm_head",
    "norm",
    "mtp",  # the multi-token-prediction layers stored after the decoder's (mtp_layers): every tensor of them
    "other",
)
# Module name (the tensor name less its last component) -> part, first match wins; embeddings, the output layer
# and norms come from the accounting's tensor roles first. One expert's module: `experts.N.`; fused experts (one
# 3-D tensor of E experts, gpt-oss, Llama 4, transformers 5 in memory): `experts.gate_up_proj` and the like.
PART_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in [
        (r"(^|\.)shared_experts?(\.|$)", "shared_experts"),  # DeepSeek shared_experts, Qwen2-MoE/Llama 4 shared_expert
        (r"(^|\.)experts\.\d+(\.|$)", "routed_experts"),
        (r"(^|\.)experts\.(gate_up_proj|gate_proj|up_proj|down_proj)\w*$", "routed_experts"),
        (r"(^|\.)experts$", "routed_experts"),  # a fused expert tensor stored as `mlp.experts.<name>`
        (r"(^|\.)(mlp|block_sparse_moe)\.gate$", "router"),  # Qwen, DeepSeek, OLMoE, Mixtral
        (r"(^|\.)block_sparse_moe\.(input_linear|output_linear)$", "routed_experts"),  # Granite 4's, as saved
        # gpt-oss, Llama 4, Granite 4 (in memory `router`, saved `router.layer`)
        (r"(^|\.)(mlp|feed_forward|block_sparse_moe)\.router(\.layer)?$", "router"),
        # what the MoE block holds itself (MiniMax-M2's e_score_correction_bias); ERNIE 4.5's router bias's module
        (r"(^|\.)(block_sparse_moe|moe_statics)$", "router"),
        (r"(^|\.)shared_expert_gate$", "router"),  # Qwen2-MoE's gate on its shared expert
        # Gemma 4's per-layer inputs: the projection of the hidden state to every layer's input, and each layer's
        # gate and projection of its own (beside the per-layer embeddings, embed_tokens_per_layer)
        (r"(^|\.)(per_layer_model_projection|per_layer_input_gate|per_layer_projection)$", "embedding"),
        (r"(^|\.)shared_mlp(\.|$)", "shared_experts"),  # Granite 4's always-on MLP beside its experts
        (r"(^|\.)indexer(\.|$)", "indexer"),  # DeepSeek-V3.2's sparse-attention indexer (self_attn.indexer)
        (r"(^|\.)linear_attn(\.|$)", "linear_attention"),  # Qwen3-Next / Qwen3.5 Gated DeltaNet
        (r"(^|\.)mamba(\.|$)", "mamba"),  # Falcon-H1, Granite 4
        (r"(^|\.)layers\.\d+\.conv(\.|$)", "short_conv"),  # LFM2's short convolution block
        # Nemotron-H names every block's module `mixer`: attention (q/k/v/o_proj), MLP (up/down_proj), MoE (gate,
        # experts, shared_experts: above), else Mamba2 (in_proj, conv1d, norm, out_proj; A_log, D, dt_bias)
        (r"(^|\.)mixer\.gate$", "router"),
        (r"(^|\.)mixer\.(q_proj|k_proj|v_proj|o_proj)$", "attention"),
        (r"(^|\.)mixer\.(up_proj|down_proj)$", "mlp"),
        (r"(^|\.)mixer(\.|$)", "mamba"),
        (r"(^|\.)(self_attn|attention|attn)(\.|$)", "attention"),
        (r"(^|\.)(mlp|feed_forward|ffn|block_sparse_moe)(\.|$)", "mlp"),
        # the output layer's module (accounting.LM_HEADS): its tensors other than an unquantized weight (role
        # lm_head) are part lm_head too, a quantized head's payload, scales and activation scales (`ignore: []`)
        (r"(^|\.)(lm_head|embed_out|output)$", "lm_head"),
    ]
]
# Tensor-name suffix -> role (accounting.ROLES), first match wins: the safetensors accounting's (accounting.role_of),
# here so that ggufs names a GGUF tensor's role by the names it is converted from (ggufs._source_role). Covers
# compressed-tensors (weight_packed, weight_scale, weight_zero_point, weight_g_idx, weight_shape), GPTQ and AWQ
# formats (qweight, qzeros, scales, g_idx) and FP8 checkpoints.
ROLE_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in [
        (r"\.(weight_packed|qweight)$", "payload"),
        (r"\.(weight_scale|scales|weight_global_scale|weight_scale_inv)$", "scale"),
        (r"\.(weight_zero_point|qzeros)$", "zero_point"),
        (r"\.(weight_g_idx|g_idx)$", "group_index"),
        (r"\.(k_scale|v_scale|k_zero_point|v_zero_point)$", "kv_scale"),  # a quantized KV cache's scales
        (
            r"\.(weight_shape|input_scale|input_zero_point|input_global_scale|output_scale|output_zero_point)$",
            "quant_meta",
        ),
        (
            r"(^|\.)(embed_tokens|wte|wpe|word_embeddings|embed_positions|tok_embeddings|embeddings|"
            r"embed_tokens_per_layer)\.weight$",
            "embedding",  # `embeddings`: Nemotron-H; `embed_tokens_per_layer`: Gemma 4's per-layer inputs
        ),
        (r"(^|\.)(lm_head|embed_out|output)\.weight$", "lm_head"),
        (r"(norm|ln_\w+|ln\d*)[^.]*\.(weight|bias)$", "norm"),  # a LayerNorm's bias too (DeepSeek-V3.2's indexer)
        (r"\.bias$", "bias"),
        (r"\.experts\.\w+_bias$", "bias"),  # fused experts' biases (gpt-oss)
        # a router's bias on its expert choice: DeepSeek-V3's `gate.`, ERNIE 4.5's `moe_statics.`, MiniMax-M2's on
        # the MoE block itself
        (r"(^|\.)e_score_correction_bias$", "bias"),
        # per-head or per-layer scalars the computation adds or multiplies: gpt-oss's attention sinks (one logit a
        # head), Gemma 4's layer_scalar
        (r"\.(sinks|layer_scalar)$", "scalar"),
        # Granite 4's routed experts as saved: one 3-D tensor of E experts each for the input and output linears
        (r"(^|\.)block_sparse_moe\.(input_linear|output_linear)\.weight$", "linear_kept"),
        # transformers' MXFP4 experts (gpt-oss as published, quant_method mxfp4): FP4 values two a byte in blocks of
        # 32 (`*_blocks`, U8 [..., blocks, 16]) and an E8M0 scale a block (`*_scales`)
        (r"\.experts\.\w+_blocks$", "payload"),
        (r"\.experts\.\w+_scales$", "scale"),
        (r"\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)$", "linear_kept"),  # fused experts, unquantized
        # a recurrent or state-space mixer's own parameters: Mamba2's A_log, D and dt_bias (Nemotron-H, Falcon-H1,
        # Granite 4), Gated DeltaNet's A_log and dt_bias (Qwen3-Next, Qwen3.5), Kimi Delta Attention's forget gate
        (r"\.(A_log|D|dt_bias)$", "state"),
        # a causal convolution's kernel (a 3-D weight): Mamba2's and the linear attentions' conv1d, LFM2's conv
        (r"(^|\.)(conv1d|conv|\w+_conv1d)\.weight$", "conv"),
    ]
]


def rule_role(name: str) -> str | None:
    """The role ROLE_RULES give a tensor's name (the first rule that matches), None where none does."""
    return next((role for pattern, role in ROLE_RULES if pattern.search(name)), None)


TENSOR_ROLE_PARTS = {"embedding": "embedding", "lm_head": "lm_head", "norm": "norm"}
_EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)(?:\.|$)")
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def part_of(module: str, tensor_role: str, linear_layers: frozenset[int] = frozenset(), mtp: Mtp | None = None) -> str:
    """The part of the model a tensor belongs to, from its module name and its accounting role (embedding,
    lm_head and norm roles name their part; a norm inside an attention block is a norm). An attention module of
    a layer in `linear_layers` (config.json's linear-attention layers: linear_attention_layers) is linear
    attention: Kimi-Linear names both kinds `self_attn`. Every tensor of the multi-token-prediction module `mtp`
    (config.json's: mtp_of) is `mtp`, its experts, embedding and output head included: a layer `layers.N` with N >=
    num_hidden_layers where config.json declares MTP layers, or a tensor under the family's MTP prefix (`mtp.*`);
    it is no decoder layer."""
    if mtp is not None and mtp.holds(module + "."):
        return "mtp"
    if tensor_role in TENSOR_ROLE_PARTS:
        return TENSOR_ROLE_PARTS[tensor_role]
    for pattern, part in PART_RULES:
        if pattern.search(module):
            if part == "attention" and linear_layers and layer_index(module + ".") in linear_layers:
                return "linear_attention"
            return part
    return "other"


def linear_attention_layers(cfg: dict[str, Any]) -> frozenset[int]:
    """The layers config.json makes linear attention (layer_types: linear_attention), for part_of; none where
    config.json gives no layer list or one this module cannot read (the accounting by part must not fail)."""
    try:
        kinds = attention_layers(cfg) if cfg and _layer_list(text_config(cfg)) is not None else ()
    except UsageError:
        return frozenset()
    return frozenset(i for i, k in enumerate(kinds) if k.kind == "linear_attention")


def mtp_layers(cfg: dict[str, Any]) -> range:
    """The layers config.json declares as multi-token prediction, stored after the decoder's: num_hidden_layers to
    num_hidden_layers + num_nextn_predict_layers − 1 (MTP_KEYS, as the family's config class spells the field:
    DeepSeek-V3's and GLM-4.5's classes store their `num_mtp_layers` under it; DeepSeek-V3.2's and GLM-4.7-Flash's
    (deepseek_v32, glm4_moe_lite), which have no such field, keep it from config.json as written). Empty where
    config.json declares none or gives no num_hidden_layers; a value that is not a whole number from 0 to MAX_SHAPE
    is a UsageError naming it. Declared layers need not be stored: a checkpoint saved by transformers keeps the
    field and drops the layers."""
    return mtp_declaration(cfg)[1]


def mtp_declaration(cfg: dict[str, Any]) -> tuple[str, range]:
    """The config.json key that declares the multi-token-prediction layers (the first spelling where none does)
    and the layers it declares (mtp_layers)."""
    text = text_config(cfg)
    found = _first_int(text, MTP_KEYS, 0)
    n = _int(text, "num_hidden_layers")
    if found is None:
        return _spelled(text, MTP_KEYS)[0], range(0)
    return found[0], range(0) if n is None else range(n, n + found[1])


def mtp_start(cfg: dict[str, Any]) -> int | None:
    """The first multi-token-prediction layer (Mtp.layers_from), None where config.json declares none or
    declares them in a way mtp_layers refuses (the accounting by part must not fail: the checks before a load
    refuse it, files.config_matches_headers)."""
    try:
        layers = mtp_layers(cfg) if cfg else range(0)
    except UsageError:
        return None
    return layers.start if layers else None


class Mtp(NamedTuple):
    """Where a checkpoint's multi-token-prediction (MTP) module is stored, as config.json tells: decoder layers from
    `layers_from` on (mtp_start: DeepSeek-V3's layers.61), and/or the tensors under a prefix of their own that
    transformers' model of the family (`family`, config.json's model_type) ignores by `patterns` (MTP_UNEXPECTED,
    matched as transformers matches them: re.search on the stored name; Qwen3-Next's `^mtp.*`)."""

    layers_from: int | None = None
    patterns: tuple[re.Pattern[str], ...] = ()
    family: str = ""

    def in_layers(self, name: str) -> bool:
        """Whether tensor `name` is in an MTP layer stored after the decoder's (`layers.N`, N >= layers_from)."""
        return self.layers_from is not None and (i := layer_index(name)) is not None and i >= self.layers_from

    def in_prefix(self, name: str) -> bool:
        """Whether tensor `name` is under the family's MTP prefix (a pattern matches it), not in such a layer."""
        return not self.in_layers(name) and any(p.search(name) for p in self.patterns)

    def holds(self, name: str) -> bool:
        return self.in_layers(name) or self.in_prefix(name)

    def prefix(self, name: str) -> str:
        """The MTP module's part that tensor `name` (one it holds) is in: its layer (`model.layers.61`), or the
        shortest leading part of the name a pattern matches, read with a dot after it (`mtp`, `model.mtp_layers`)."""
        if self.in_layers(name) and (m := LAYER_INDEX.search(name)):
            return name[: m.end() - 1]
        parts = name.split(".")
        heads = (".".join(parts[:k]) for k in range(1, len(parts) + 1))
        return next((h for h in heads if any(p.search(h + ".") for p in self.patterns)), name)


def mtp_of(cfg: dict[str, Any]) -> Mtp:
    """The MTP module config.json describes (Mtp): its layers after the decoder's (mtp_start) and the prefix
    patterns of its family (config.json's model_type, and its text_config's), none of either where it gives none."""
    families = [c.get("model_type") for c in (cfg, text_config(cfg))] if cfg else []
    known = [f for f in dict.fromkeys(families) if isinstance(f, str) and f in MTP_UNEXPECTED]
    patterns = tuple(re.compile(p) for f in known for p in MTP_UNEXPECTED[f])
    return Mtp(mtp_start(cfg), patterns, known[0] if known else "")


def expert_index(module: str) -> int | None:
    """N of a per-expert module `...experts.N...`; None for a fused or non-expert module."""
    m = _EXPERT_INDEX.search(module)
    return int(m.group(1)) if m else None


def layer_index(name: str) -> int | None:
    m = LAYER_INDEX.search(name)
    return int(m.group(1)) if m else None


# --- config.json fields -------------------------------------------------------------------------


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: a multimodal config's `text_config` (Gemma 3, Llama 4), else the config."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


# the largest a config.json shape field (layers, heads, head or latent dimensions, hidden size, experts) or layer
# index may be, and a window or chunk in tokens: far past any model, short of figures that overflow a float or
# loops and lists that never end (num_key_value_heads 10**30 priced 7.9e35 bytes, head_dim 10**400 ended in
# OverflowError and num_hidden_layers 10**12 in MemoryError, exit 3: a review)
MAX_SHAPE = 100_000
MAX_WINDOW = 2**40


def _int(cfg: dict[str, Any], key: str, minimum: int = 1, maximum: int = MAX_SHAPE) -> int | None:
    """An integer field from minimum to maximum, None when absent or null, a UsageError naming it otherwise."""
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
        shown = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"a {len(str(abs(v)))}-digit number"
        raise UsageError(
            f"config.json's {key} is {shown}; it must be a whole number from {minimum} to {maximum:,}. Fix config.json"
        )
    return v


def checked_layer_count(cfg: dict[str, Any]) -> None:
    """num_hidden_layers and the layer list (of the config and of its text_config), at most MAX_SHAPE layers, before
    a config class builds a list per layer from them (loader.completed_config)."""
    for fields in (cfg, text_config(cfg)):
        _int(fields, "num_hidden_layers")
        _layer_list(fields)


def _int_list(cfg: dict[str, Any], key: str) -> list[int] | None:
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise UsageError(f"config.json's {key} is {str(v)[:60]}; it must be a list of layer indices. Fix config.json")
    return v


def _first_int(cfg: dict[str, Any], names: tuple[str, ...], minimum: int = 1) -> tuple[str, int] | None:
    for k in _spelled(cfg, names):
        if (v := _int(cfg, k, minimum)) is not None:
            return k, v
    return None


def _spelled(cfg: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """The config.json keys of fields `names` as the family's transformers config class reads them: each name, the
    attribute its `attribute_map` stores it under and the other names mapped there (ERNIE 4.5's num_experts_per_tok
    is `moe_k`, DeepSeek's num_local_experts `n_routed_experts`: compat/transformers_config_names.py)."""
    model_type = cfg.get("model_type")
    return list(
        dict.fromkeys(k for n in names for k in spellings(model_type if isinstance(model_type, str) else None, n))
    )


# the common names of the fields read (each family's spellings: _spelled): the routed experts per MoE layer, k
# (experts per token), the multi-token-prediction layers after the decoder's, the per-layer type list
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")
TOP_K_KEYS = ("num_experts_per_tok",)
MTP_KEYS = ("num_nextn_predict_layers",)
LAYER_LIST_KEYS = ("layer_types",)
# the mlp_layer_types entries of a routed-expert layer: Kimi-Linear's and DeepSeek-V3.2's "sparse" (beside "dense"),
# DeepSeek-V4's "moe" and "hash_moe" (DEEPSEEK_V4_MLP_LAYER_TYPES: experts picked by a router or by a table of the
# token id, k of them a token either way)
MOE_MLP_LAYER_TYPES = ("sparse", "moe", "hash_moe")
# Nemotron-H's configuration_nemotron_h._pattern_to_list
HYBRID_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
# sliding-window layer pattern of a family whose older config.json has no `layer_types`: layer i slides unless
# (i + 1) is a multiple of it (the default each config class's __post_init__ fills in)
FAMILY_SLIDING_PATTERN = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "gpt_oss": 2}
WINDOWED_LAYER_TYPES = {
    "sliding_attention": "sliding_window",
    "chunked_attention": "attention_chunk_size",
    # DeepSeek-V4's compressed attention keeps a sliding window beside its compressed entries (COMPRESSED_LAYERS)
    "compressed_sparse_attention": "sliding_window",
    "heavily_compressed_attention": "sliding_window",
}
# layer types (transformers' names, configuration_utils and the config classes) that hold the whole context or a
# fixed state: attention over the whole context (DeepSeek-V3.2's sparse attention reads top-k tokens but keeps
# them all), a recurrent/state-space/convolution mixer (its state: LINEAR_MIXERS), and layers with no mixer
UNWINDOWED_LAYER_TYPES = ("full_attention", "deepseek_sparse_attention", "linear_attention", "hybrid", "mlp", "moe")
# older names config.json may carry, as transformers' configuration_utils._LEGACY_LAYER_TYPE_REMAP reads them
LEGACY_LAYER_TYPES = {"conv": "linear_attention", "mamba": "linear_attention", "attention": "full_attention"}
# families whose every layer runs attention and a mixer side by side (FalconH1Config.layers_block_type: "hybrid")
EVERY_LAYER_HYBRID = {"falcon_h1": "hybrid"}


@dataclass(frozen=True)
class AttentionLayer:
    kind: str  # full_attention | sliding_attention | chunked_attention
    window: int | None  # tokens the layer keeps (None: the whole context)


@dataclass(frozen=True)
class KVSpec:
    """What one token stores in each layer's KV cache."""

    attention: str  # "MLA" or "MHA/GQA"
    values_per_token: int  # elements per token and layer
    layers: tuple[AttentionLayer, ...]
    formula: str


@dataclass(frozen=True)
class MoESpec:
    """The routed experts config.json declares."""

    experts: int  # E, routed experts per MoE layer
    top_k: int  # k, experts each token is routed to
    shared_experts: int  # always-on experts per MoE layer (0: none declared)
    layers: tuple[int, ...]  # indices of the MoE layers
    fields: str  # the config.json fields these were read from


def layer_count(cfg: dict[str, Any]) -> int:
    """num_hidden_layers, else the length of the layer list (Nemotron-H's class derives it from
    layers_block_type, and saves no num_hidden_layers)."""
    text = text_config(cfg)
    n = _int(text, "num_hidden_layers")
    if n is None and (listed := _layer_list(text)) is not None:
        return len(listed[1])
    if n is None:
        raise UsageError(
            "config.json lacks num_hidden_layers (and a layer list: layer_types / layers_block_type / "
            "hybrid_override_pattern); fix config.json"
        )
    return n


def _layer_list(text: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The per-layer type list config.json gives, and the field it came from: `layer_types` (most families),
    `layers_block_type` (the attribute Nemotron-H's config class stores layer_types under), or Nemotron-H's
    older `hybrid_override_pattern` string (read as the class reads it: M mamba, * attention, - mlp, E moe)."""
    for key in _spelled(text, LAYER_LIST_KEYS):
        v = text.get(key)
        if v is None:
            continue
        if not isinstance(v, list) or not v or not all(isinstance(t, str) for t in v):
            raise UsageError(f"config.json's {key} must list one layer type per layer; got {str(v)[:80]}")
        return key, _at_most_max_layers(key, v)
    linear = text.get("linear_attn_config")
    if isinstance(linear, dict) and isinstance(n := text.get("num_hidden_layers"), int):
        full, kda = linear.get("full_attn_layers"), linear.get("kda_layers")
        # Kimi-Linear's checkpoint form (KimiLinearConfig.__post_init__): 1-based layer numbers of each kind
        if isinstance(full, list) and isinstance(kda, list) and sorted([*full, *kda]) == list(range(1, n + 1)):
            return "linear_attn_config", ["full_attention" if i + 1 in full else "linear_attention" for i in range(n)]
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        if bad := sorted(set(pattern) - set(HYBRID_PATTERN)):
            raise UsageError(
                f"config.json's hybrid_override_pattern holds {''.join(bad)!r}; each character must be one of "
                f"{''.join(HYBRID_PATTERN)}. Fix config.json"
            )
        return "hybrid_override_pattern", _at_most_max_layers(
            "hybrid_override_pattern", [HYBRID_PATTERN[c] for c in pattern]
        )
    return None


def _at_most_max_layers(key: str, types: list[str]) -> list[str]:
    if len(types) > MAX_SHAPE:
        raise UsageError(
            f"config.json's {key} lists {len(types):,} layers; a model has at most {MAX_SHAPE:,}. Fix config.json"
        )
    return types


def attention_layers(cfg: dict[str, Any]) -> tuple[AttentionLayer, ...]:
    """Each layer's attention kind and window: `layer_types` (a window read only where a layer slides or chunks:
    Qwen2-MoE's class stores sliding_window 0 while its window is switched off, and lists every layer full
    attention), else `sliding_window_pattern` or the family's pattern, else a `sliding_window` every layer uses
    (Mistral), else full attention everywhere. A family whose config class switches the window with
    `use_sliding_window` (SLIDING_SWITCH: Qwen2, Qwen3, their MoE and VL text models, SmolLM3) keeps none unless
    config.json sets it true, and then slides from layer max_window_layers on (the class's default where config.json
    has none) where the class does so (Qwen2's rule), every layer where it has no max_window_layers (Qwen3-MoE). A
    family whose class derives its layer_types by a rule of its own (OWN_LAYER_TYPES: Qwen2-MoE slides layers 0, 2,
    4, ... below max_window_layers, SmolLM3 its layers without RoPE) switched on without layer_types is a
    UsageError: which layers slide is the class's to say. The cost reads config.json as the class completes it
    (loader.completed_config), which lists them; read as written, Qwen2's rule priced other layers than the ones
    transformers' cache slides."""
    text = text_config(cfg)
    n = layer_count(cfg)
    if (listed := _layer_list(text)) is not None:
        key, types = listed
        if len(types) != n:
            raise UsageError(
                f"config.json's {key} lists {len(types)} layer types, num_hidden_layers is {n}; fix config.json"
            )
        return tuple(_typed_layer(text, LEGACY_LAYER_TYPES.get(t, t)) for t in types)
    if (chunked := _chunked_layers(text, n)) is not None:
        return chunked
    if str(text.get("model_type")) in EVERY_LAYER_HYBRID:
        return (AttentionLayer(EVERY_LAYER_HYBRID[str(text.get("model_type"))], None),) * n
    window = _int(text, "sliding_window", maximum=MAX_WINDOW)
    pattern = _int(text, "sliding_window_pattern") or FAMILY_SLIDING_PATTERN.get(str(text.get("model_type")))
    if window is not None and pattern is not None:
        return tuple(_layer(window) if (i + 1) % pattern else _layer(None) for i in range(n))
    switch, family = text.get("use_sliding_window"), str(text.get("model_type"))
    rule = SLIDING_SWITCH.get(family)
    if switch is True and rule == OWN_LAYER_TYPES:
        raise UsageError(
            f"config.json (model_type {family!r}) switches its sliding window on (use_sliding_window true) and lists "
            "no layer_types: which layers slide is its transformers config class's own rule, which this reader of "
            "config.json as written does not restate. `quantize cost` reads config.json as that class completes "
            "it; here, list the layer_types the class derives in config.json"
        )
    if window is None or switch is False or (switch is None and family in SLIDING_SWITCH):
        return (_layer(None),) * n
    first = None
    if switch is True and (family not in SLIDING_SWITCH or rule is not None):
        first = _int(text, "max_window_layers", 0)
        first = rule if first is None and isinstance(rule, int) else first
    return tuple(_layer(window if first is None or i >= first else None) for i in range(n))


def _chunked_layers(text: dict[str, Any], n: int) -> tuple[AttentionLayer, ...] | None:
    """Llama 4's layers where config.json lists no layer_types, as Llama4TextConfig (5.17) derives them: a layer
    whose no_rope_layers entry is 1 (default: all but every no_rope_layer_interval-th, 4) attends in chunks of
    attention_chunk_size tokens, the others over the whole context. Published configs carry no layer_types: every
    layer was priced as full attention (at 32k, 2.3 times the cache transformers keeps). None for other families."""
    if str(text.get("model_type")) not in ("llama4_text", "llama4") or _windowed(text, "attention_chunk_size") is None:
        return None
    every = _int(text, "no_rope_layer_interval") or 4
    rope = text.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(n)]
    if not isinstance(rope, list) or len(rope) != n or any(r not in (0, 1) for r in rope):
        raise UsageError(
            f"config.json's no_rope_layers is {str(rope)[:80]}, not one 0 or 1 per layer ({n}); fix config.json"
        )
    return tuple(_typed_layer(text, "chunked_attention") if r else _layer(None) for r in rope)


def _windowed(text: dict[str, Any], key: str) -> int | None:
    """A window or chunk size in tokens (sliding_window, attention_chunk_size)."""
    return _int(text, key, maximum=MAX_WINDOW)


def _layer(window: int | None) -> AttentionLayer:
    return AttentionLayer("full_attention" if window is None else "sliding_attention", window)


def _typed_layer(text: dict[str, Any], kind: str) -> AttentionLayer:
    if kind in UNWINDOWED_LAYER_TYPES:
        return AttentionLayer(kind, None)
    if kind in WINDOWED_LAYER_TYPES:
        key = WINDOWED_LAYER_TYPES[kind]
        if (w := _windowed(text, key)) is None:
            raise UsageError(f"config.json's layer_types names {kind} layers but {key} is not set; fix config.json")
        return AttentionLayer(kind, w)
    raise UsageError(
        f"config.json's layer_types names {kind!r} layers, whose cache the cost model does not know (it knows "
        f"{', '.join([*UNWINDOWED_LAYER_TYPES, *WINDOWED_LAYER_TYPES])}); pass --layers/--kv-heads/--head-dim "
        "(beside --checkpoint: they replace its KV cache) to price a uniform cache instead"
    )


def kv_spec(cfg: dict[str, Any]) -> KVSpec:
    """The KV cache's layout: MLA when config.json sets kv_lora_rank (DeepSeek V2/V3, Kimi K2), else MHA/GQA."""
    text = text_config(cfg)
    layers = attention_layers(cfg)
    rank = _int(text, "kv_lora_rank")
    if rank is not None:
        rope = _int(text, "qk_rope_head_dim")
        if rope is None:
            raise UsageError("config.json sets kv_lora_rank (MLA) but not qk_rope_head_dim; fix config.json")
        return KVSpec("MLA", rank + rope, layers, f"kv_lora_rank {rank} + qk_rope_head_dim {rope}")
    spec = _gqa(text)
    return KVSpec(spec.attention, spec.values_per_token, layers, spec.formula)


def _gqa(text: dict[str, Any]) -> KVSpec:
    """MHA/GQA: 2 × num_key_value_heads × head_dim values per token (head_dim: hidden_size / heads if unset)."""
    heads = _int(text, "num_attention_heads")
    hidden = _int(text, "hidden_size")
    if heads is None:
        raise UsageError(
            "config.json lacks num_attention_heads needed for the KV layout; pass --layers/--kv-heads/--head-dim"
        )
    kv_heads = _int(text, "num_key_value_heads") or heads
    head_dim = _int(text, "head_dim")
    if head_dim is None:
        if hidden is None:
            raise UsageError(
                "config.json lacks head_dim and hidden_size needed for the KV layout; pass "
                "--layers/--kv-heads/--head-dim"
            )
        head_dim = hidden // heads
    return KVSpec("MHA/GQA", 2 * kv_heads * head_dim, (), f"2 × num_key_value_heads {kv_heads} × head_dim {head_dim}")


# --- the decode cache, layer by layer: KV that grows with the context, state that does not -------------

# Bytes of a recurrent or state-space state: float32; of a convolution state (the layer's last inputs): 2, the
# 16-bit model dtype. That is what transformers 5.17's cache holds for a bf16 model of Qwen3-Next, Kimi-Linear,
# Nemotron-H, Granite 4, Falcon-H1 and LFM2 (checked on their tiny models when this was written). MiniMax's
# lightning-attention state and DeepSeek-V4's pending compressor tokens are kept in the model's dtype: 2 bytes too
# (tests/cost/test_cache_measured.py measures them); Nemotron-H
# names its SSM state's dtype (mamba_ssm_cache_dtype), read where config.json gives it. A serving engine may keep
# other dtypes: these are the figures priced, and the output says them.
STATE_BYTES = 4
CONV_BYTES = 2
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Compressor:
    """A compressed-attention layer's compressor (DeepSeek-V4): one entry of `entry_values` KV values per `rate`
    source tokens; the source tokens past the last closed window wait in a buffer, `pending_values` each (their kv and
    gate projections, in the model's dtype); `overlap_values` more (the last closed window's share of the next
    entry, CSA's overlapping windows, in the model's dtype) once a window has closed. At c tokens: c // rate
    entries, c mod rate tokens pending."""

    rate: int
    entry_values: int
    pending_values: int
    overlap_values: int = 0


@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps per sequence while decoding: KV values per token (up to `window` tokens; None: the
    whole context), a fixed state (recurrent/SSM values, convolution values, and values held in the model's 16-bit
    dtype such as MiniMax's lightning-attention state: constant in context), and a compressor (DeepSeek-V4)."""

    kind: str
    kv_values: int = 0
    window: int | None = None
    state_values: int = 0
    conv_values: int = 0
    formula: str = ""
    dtype_state_values: int = 0  # a fixed state kept in the model's dtype, priced at CONV_BYTES a value
    compressor: Compressor | None = None


@dataclass(frozen=True)
class CacheSpec:
    """The decode cache layer by layer, and the bytes of one state and one convolution value."""

    attention: str  # the KV layout: MHA/GQA, MLA, MLA + indexer, or "none" (no layer holds a KV cache)
    layers: tuple[LayerCache, ...]
    state_bytes: int = STATE_BYTES
    conv_bytes: int = CONV_BYTES
    state_dtype: str = "float32"


def _need(text: dict[str, Any], key: str, why: str, minimum: int = 1) -> int:
    if (v := _int(text, key, minimum)) is None:
        raise UsageError(f"config.json lacks {key}, needed for {why}; fix config.json")
    return v


def _gated_deltanet(text: dict[str, Any]) -> LayerCache:
    """Qwen3-Next / Qwen3.5 Gated DeltaNet (modeling_qwen3_next.Qwen3NextGatedDeltaNet): a recurrent state of
    num_v_heads × head_k_dim × head_v_dim, and the causal convolution's last conv_kernel inputs over
    2 × num_k_heads × head_k_dim + num_v_heads × head_v_dim channels (q, k and v: its conv_dim)."""
    why = "the Gated DeltaNet state"
    hk, hv = _need(text, "linear_num_key_heads", why), _need(text, "linear_num_value_heads", why)
    dk, dv = _need(text, "linear_key_head_dim", why), _need(text, "linear_value_head_dim", why)
    kernel = _need(text, "linear_conv_kernel_dim", why)
    channels = 2 * hk * dk + hv * dv
    return LayerCache(
        "gated_deltanet",
        state_values=hv * dk * dv,
        conv_values=kernel * channels,
        formula=f"state {hv}×{dk}×{dv} (v heads × k dim × v dim); conv {kernel}×{channels}",
    )


def _kimi_delta(text: dict[str, Any]) -> LayerCache:
    """Kimi Delta Attention (modeling_kimi_linear.KimiDeltaAttention): a float32 state of num_heads × head_dim ×
    head_dim, and a convolution over q, k and v (3 × num_heads × head_dim channels) keeping conv_kernel inputs."""
    linear = text.get("linear_attn_config") if isinstance(text.get("linear_attn_config"), dict) else {}
    fields = {**text, **{k: linear[v] for k, v in KIMI_LINEAR_KEYS.items() if v in linear}}
    why = "the Kimi Delta Attention state"
    h, d = _need(fields, "linear_num_heads", why), _need(fields, "linear_head_dim", why)
    kernel = _need(fields, "linear_conv_kernel_dim", why)
    return LayerCache(
        "kimi_delta_attention",
        state_values=h * d * d,
        conv_values=kernel * 3 * h * d,
        formula=f"state {h}×{d}×{d}; conv {kernel}×{3 * h * d}",
    )


# KimiLinearConfig.__post_init__ reads these from the checkpoint's linear_attn_config (its keys on the right)
KIMI_LINEAR_KEYS = {
    "linear_head_dim": "head_dim",
    "linear_num_heads": "num_heads",
    "linear_conv_kernel_dim": "short_conv_kernel_size",
}


def _mamba2(heads: int, head_dim: int, state: int, groups: int, kernel: int, inner: int) -> LayerCache:
    """Mamba2 (the mixers of Nemotron-H, Falcon-H1, Granite 4): an SSM state of num_heads × head_dim ×
    state_size, and the convolution's last conv_kernel inputs over intermediate + 2 × n_groups × state_size
    channels (x, B and C: the mixer's conv_dim)."""
    channels = inner + 2 * groups * state
    return LayerCache(
        "mamba2",
        state_values=heads * head_dim * state,
        conv_values=kernel * channels,
        formula=f"ssm {heads}×{head_dim}×{state}; conv {kernel}×{channels}",
    )


def _mamba2_nemotron(text: dict[str, Any]) -> LayerCache:
    """NemotronHMamba2Mixer: intermediate = mamba_num_heads × mamba_head_dim."""
    why = "the Mamba2 state"
    heads, hd = _need(text, "mamba_num_heads", why), _need(text, "mamba_head_dim", why)
    state, groups = _need(text, "ssm_state_size", why), _need(text, "n_groups", why)
    return _mamba2(heads, hd, state, groups, _need(text, "conv_kernel", why), heads * hd)


def _mamba2_mamba_fields(text: dict[str, Any]) -> LayerCache:
    """GraniteMoeHybridMambaLayer and FalconH1Mixer: intermediate = mamba_d_ssm where set (Falcon-H1), else
    mamba_expand × hidden_size; head_dim = mamba_d_head, or intermediate / mamba_n_heads where "auto"."""
    why = "the Mamba2 state"
    heads, state = _need(text, "mamba_n_heads", why), _need(text, "mamba_d_state", why)
    inner = _int(text, "mamba_d_ssm")
    if inner is None:
        expand, hidden = text.get("mamba_expand"), _need(text, "hidden_size", why)
        # finite first: NaN, inf and 1e308 × hidden_size ended in ValueError or OverflowError, exit 3 (a review)
        ok = not isinstance(expand, bool) and isinstance(expand, int | float) and math.isfinite(expand) and expand > 0
        if not ok or not 1 <= expand * hidden <= MAX_SHAPE:
            raise UsageError(
                f"config.json's mamba_expand is {expand!r}; it must be a finite number above 0 whose product with "
                f"hidden_size ({hidden}), the Mamba intermediate size, is from 1 to {MAX_SHAPE:,}. Fix config.json"
            )
        inner = int(expand * hidden)
    hd = text.get("mamba_d_head")
    hd = inner // heads if hd == "auto" else _need(text, "mamba_d_head", why)
    return _mamba2(heads, hd, state, _need(text, "mamba_n_groups", why), _need(text, "mamba_d_conv", why), inner)


def _short_conv(text: dict[str, Any]) -> LayerCache:
    """LFM2's short convolution (modeling_lfm2.Lfm2ShortConv): its last conv_L_cache inputs of hidden_size."""
    why = "the short convolution's state"
    kernel, hidden = _need(text, "conv_L_cache", why), _need(text, "hidden_size", why)
    return LayerCache("short_conv", conv_values=kernel * hidden, formula=f"conv {kernel}×{hidden}")


def _lightning(text: dict[str, Any]) -> LayerCache:
    """MiniMax's lightning attention (modeling_minimax.MiniMaxLightningAttention): the running K^T V of each head,
    num_attention_heads × head_dim × head_dim (head_dim: hidden_size / num_attention_heads where unset), kept in the
    model's dtype (MiniMaxCache.linear_cache); no convolution."""
    why = "the lightning attention state"
    heads = _need(text, "num_attention_heads", why)
    d = _int(text, "head_dim") or _need(text, "hidden_size", why) // heads
    return LayerCache(
        "lightning_attention",
        dtype_state_values=heads * d * d,
        formula=f"state {heads}×{d}×{d} (num_attention_heads × head_dim², model dtype)",
    )


# model_type -> the mixer its linear_attention (or hybrid) layers run: each one's state, from its modeling code
LINEAR_MIXERS = {
    "qwen3_next": _gated_deltanet,
    "qwen3_5_text": _gated_deltanet,
    "qwen3_5_moe_text": _gated_deltanet,
    "olmo_hybrid": _gated_deltanet,  # OlmoHybridGatedDeltaNet: the same fields and shapes
    "kimi_linear": _kimi_delta,
    "nemotron_h": _mamba2_nemotron,
    "granitemoehybrid": _mamba2_mamba_fields,
    "falcon_h1": _mamba2_mamba_fields,
    "lfm2": _short_conv,
    "lfm2_moe": _short_conv,
    "minimax": _lightning,
}


def _compressed(text: dict[str, Any], kind: str, window: int | None) -> LayerCache:
    """DeepSeek-V4's compressed attention (modeling_deepseek_v4): a sliding window of one shared K=V head of head_dim
    (DeepseekV4HCACache keeps its keys as its values, and DeepseekV4Attention.kv_proj projects to head_dim alone), and
    a compressor of rate m = compress_rates[kind]. Heavily compressed attention (DeepseekV4HCACompressor): an entry of
    head_dim per m tokens, each pending token its kv and gate projections (2 × head_dim). Compressed sparse attention
    (DeepseekV4CSACompressor and its DeepseekV4Indexer, which compresses its own keys at index_head_dim over the same
    windows): an entry of head_dim + index_head_dim per m tokens; both project two overlapping series (Ca, Cb), so a
    pending token is 2 × 2 × (head_dim + index_head_dim) values and the last window's Ca kv and gate, 2 × m ×
    (head_dim + index_head_dim), stay once a window has closed (DeepseekV4CSACache.overlap_kv / overlap_gate)."""
    why = f"the {kind} cache"
    d = _need(text, "head_dim", why)
    rates = text.get("compress_rates")
    rate = rates.get(kind) if isinstance(rates, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= MAX_WINDOW:
        raise UsageError(
            f"config.json's compress_rates gives {kind} layers {str(rate)[:40]}; it must give each compressed layer "
            f"type its tokens per compressed entry, a whole number from 1 to {MAX_WINDOW:,}. Fix config.json"
        )
    if kind == "compressed_sparse_attention":
        index = _need(text, "index_head_dim", why)
        entry, pending, overlap = d + index, 2 * 2 * (d + index), 2 * rate * (d + index)
        parts = f"head_dim {d} + index_head_dim {index}"
    else:
        entry, pending, overlap, parts = d, 2 * d, 0, f"head_dim {d}"
    formula = (
        f"K=V head_dim {d} (window {window}); an entry of {parts} per {rate} tokens; pending tokens {pending} values"
        + (f" each, overlap {overlap}" if overlap else " each")
    )
    return LayerCache(kind, d, window, formula=formula, compressor=Compressor(rate, entry, pending, overlap))


# the layer types of DeepseekV4Config's DEEPSEEK_V4_LAYER_TYPES that compress (its sliding_attention is a window)
COMPRESSED_LAYERS = ("compressed_sparse_attention", "heavily_compressed_attention")


def _attention_values(text: dict[str, Any], layer: int) -> tuple[str, int, str]:
    """The KV layout of attention layer `layer` and the values one token stores in it: MLA (kv_lora_rank set)
    kv_lora_rank + qk_rope_head_dim, plus index_head_dim where an indexer keeps its own keys (DeepSeek-V3.2);
    else 2 × num_key_value_heads × head_dim, each from the layer's per_layer_config entry where it has one
    (Gemma 4's full-attention layers)."""
    if (rank := _int(text, "kv_lora_rank")) is not None:
        rope = _int(text, "qk_rope_head_dim")
        if rope is None:
            raise UsageError("config.json sets kv_lora_rank (MLA) but not qk_rope_head_dim; fix config.json")
        if (index := _int(text, "index_head_dim")) is not None:
            formula = f"kv_lora_rank {rank} + qk_rope_head_dim {rope} + indexer keys index_head_dim {index}"
            return "MLA + indexer", rank + rope + index, formula
        return "MLA", rank + rope, f"kv_lora_rank {rank} + qk_rope_head_dim {rope}"
    per = text.get("per_layer_config")
    own = per.get(str(layer), per.get(layer)) if isinstance(per, dict) else None
    fields = {**text, **own} if isinstance(own, dict) else text
    spec = _gqa(fields)
    return spec.attention, spec.values_per_token, spec.formula


def cache_spec(cfg: dict[str, Any]) -> CacheSpec:
    """The decode cache config.json describes, layer by layer (attention_layers): an attention layer's KV
    (_attention_values) up to its window; a linear-attention, state-space or convolution layer's fixed state
    (LINEAR_MIXERS, by model_type); a Falcon-H1 layer both; a DeepSeek-V4 compressed-attention layer its window and
    its compressor's entries (_compressed); an MLP/MoE-only layer (Nemotron-H) nothing; a Gemma 4 layer past
    num_hidden_layers − num_kv_shared_layers reads an earlier layer's cache and keeps none."""
    text = text_config(cfg)
    kinds = attention_layers(cfg)
    family = str(text.get("model_type"))
    mixer = LINEAR_MIXERS.get(family)
    if mixer is None and (odd := sorted({k.kind for k in kinds if k.kind in ("linear_attention", "hybrid")})):
        raise UsageError(
            f"config.json (model_type {family!r}) names {odd[0]} layers, whose state the cost model does not know "
            f"(it knows the mixers of {', '.join(LINEAR_MIXERS)}); pass --layers/--kv-heads/--head-dim "
            "(beside --checkpoint: they replace its KV cache) to price a uniform cache instead"
        )
    shared = _int(text, "num_kv_shared_layers", 0) or 0
    if shared >= len(kinds):  # every layer reading an earlier layer's cache: no layer would hold one (a review)
        raise UsageError(
            f"config.json's num_kv_shared_layers is {shared}, but the model has {len(kinds)} layers: the layers that "
            "share an earlier layer's KV cache must leave at least one that keeps its own. Fix config.json"
        )
    shared_from = len(kinds) - shared
    layouts, layers = set(), []
    for i, layer in enumerate(kinds):
        state = mixer(text) if layer.kind in ("linear_attention", "hybrid") and mixer is not None else None
        if layer.kind in ("mlp", "moe") or layer.kind == "linear_attention":
            layers.append(state or LayerCache(layer.kind))
            continue
        if i >= shared_from:
            layers.append(LayerCache("shared_kv", formula="reads an earlier layer's KV cache"))
            continue
        if layer.kind in COMPRESSED_LAYERS:
            layouts.add("K=V window + compressed KV")
            layers.append(_compressed(text, layer.kind, layer.window))
            continue
        layout, values, formula = _attention_values(text, i)
        layouts.add(layout)
        kind = "sparse_attention" if layer.kind == "deepseek_sparse_attention" else layer.kind
        if state is not None:  # attention and a Mamba2 mixer side by side
            kind, formula = f"attention+{state.kind}", f"{formula}; {state.formula}"
        layers.append(
            LayerCache(
                kind,
                values,
                layer.window,
                state.state_values if state else 0,
                state.conv_values if state else 0,
                formula,
            )
        )
    ssm = text.get("mamba_ssm_cache_dtype")
    dtype = ssm if isinstance(ssm, str) and ssm in DTYPE_BYTES else "float32"
    return CacheSpec(" and ".join(sorted(layouts)) or "none", tuple(layers), DTYPE_BYTES[dtype], CONV_BYTES, dtype)


def routed_experts(cfg: dict[str, Any]) -> tuple[str, int] | None:
    """The field config.json declares its routed experts per MoE layer in, and their number E; None for a dense
    model (no expert count, or fewer than 2 experts)."""
    found = _first_int(text_config(cfg), EXPERT_COUNT_KEYS, 0)
    return None if found is None or found[1] < 2 else found


def moe_spec(cfg: dict[str, Any]) -> MoESpec | None:
    """The routed experts, or None for a dense model (routed_experts)."""
    text = text_config(cfg)
    found = routed_experts(cfg)
    if found is None:
        return None
    count_key, experts = found
    k_key, top_k = _first_int(text, TOP_K_KEYS) or ("num_experts_per_tok", None)
    if top_k is None or top_k > experts:
        raise UsageError(
            f"config.json declares {experts} routed experts ({count_key}) but {k_key} is "
            f"{text.get(k_key)!r}; it must be a whole number from 1 to {experts}. Fix config.json"
        )
    shared = (
        _int(text, "n_shared_experts", 0)
        or _int(text, "num_shared_experts", 0)
        or _int(text, "moe_num_shared_experts", 0)  # ERNIE 4.5
        or (1 if _int(text, "shared_expert_intermediate_size") else 0)
    )
    n = layer_count(cfg)
    layers, rule = _moe_layers(text, n)
    return MoESpec(experts, top_k, shared, layers, f"{count_key}, {k_key}{rule}")


# --- the routed experts' tensors against config.json --------------------------------------------

# one routed expert's tensor (`...experts.N.REST`, per expert) and a fused one (`...experts.NAME`, E experts stacked
# on its first dimension: gpt-oss, Llama 4, transformers 5 in memory), by name
_PER_EXPERT = re.compile(r"^(.*(?:^|\.)experts)\.(\d+)\.(.+)$")
_FUSED_EXPERTS = re.compile(r"^(.*(?:^|\.)experts)\.([^.]+)$")


def stored_per_expert(names: Iterable[str]) -> bool:
    """Whether tensor names store routed experts one by one (`...experts.N.REST`), not fused."""
    return any(_PER_EXPERT.match(n) for n in names)


# the width of one routed expert's MLP (its gate/up outputs, its down input): config.json's moe_intermediate_size
# where the family has a dense MLP of another width beside its experts (Qwen2/3-MoE, DeepSeek), else
# intermediate_size (Mixtral, OLMoE, gpt-oss, Llama 4 text): read from transformers' config classes (5.17)
EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "intermediate_size")
_LOGICAL_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")  # a header's shape is the weight's own


def _width(text: dict[str, Any]) -> tuple[str, int] | None:
    """The routed experts' MLP width and the field it was read from; None where config.json gives none as a single
    whole number (a per-layer list, for one), and then no expert is checked against it."""
    for k in EXPERT_WIDTH_KEYS:
        v = text.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None


def expert_problems(cfg: dict[str, Any], shapes: dict[str, tuple[list[int], str]]) -> list[str]:
    """What the safetensors headers (`shapes`: tensor name -> (shape, dtype)) hold of the routed experts against
    what config.json declares (its expert count E: routed_experts), without a model. Per expert module
    `...experts`: each of experts 0 to E-1 holds the same tensors with the same shapes as the others (an expert
    missing, an index past E, a tensor one expert lacks or has alone, a shape the others do not share), and every
    unquantized 2-D weight is hidden_size by the expert width (EXPERT_WIDTH_KEYS), either way round; a fused expert
    tensor stacks E experts on its first dimension. [] for a dense model or consistent experts. (Our per-expert
    loader could read an expert quantized unlike its fellows, but the engines cannot: transformers stacks a layer's
    experts under one scheme and vLLM reads every expert with expert 0's, docs/vllm-loading.md Q2; a verdict on
    such a layout would judge what no engine computes.)"""
    text = text_config(cfg)
    if (found_count := routed_experts(cfg)) is None:
        return []
    count_key, count = found_count
    declared = f"config.json declares E = {count} routed experts ({count_key})"
    per: dict[str, dict[int, dict[str, tuple[list[int], str]]]] = {}
    found = []
    for name, (shape, dtype) in sorted(shapes.items()):
        if m := _PER_EXPERT.match(name):
            per.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = (shape, dtype)
        elif (m := _FUSED_EXPERTS.match(name)) and shape[:1] != [count]:
            found.append(f"fused expert tensor {name} has shape {shape}, whose first dimension should be E: {declared}")
    for module, experts in per.items():
        found += _expert_module_problems(module, experts, count, declared, text)
    return found


def _expert_module_problems(
    module: str,
    experts: dict[int, dict[str, tuple[list[int], str]]],
    count: int,
    declared: str,
    text: dict[str, Any],
) -> list[str]:
    """One per-expert module's experts against each other and against config.json (expert_problems)."""
    found = [f"{module}.{i} is missing (no tensor of expert {i}); {declared}" for i in range(count) if i not in experts]
    found += [
        f"{module}.{i} is an expert past the last ({', '.join(sorted(experts[i]))}); {declared}, 0 to {count - 1}"
        for i in sorted(experts)
        if i >= count
    ]
    held = {i: t for i, t in experts.items() if i < count}
    for rest in sorted({r for t in held.values() for r in t}):
        have = [i for i in sorted(held) if rest in held[i]]
        if 2 * len(have) > len(held):
            found += [f"{module}.{i}.{rest} is missing (the other experts hold it)" for i in held if i not in have]
        else:
            found += [f"{module}.{i}.{rest} is a tensor the other experts do not hold" for i in have]
            continue
        shapes = [held[i][rest] for i in have]
        usual = max(shapes, key=shapes.count)
        found += [
            f"{module}.{i}.{rest} has shape {held[i][rest][0]} ({held[i][rest][1]}), the other experts' is "
            f"{usual[0]} ({usual[1]})"
            for i in have
            if held[i][rest] != usual
        ]
        found += _width_problem(f"{module}.{have[0]}.{rest}", usual, text)
    return found


def _width_problem(name: str, tensor: tuple[list[int], str], text: dict[str, Any]) -> list[str]:
    """An unquantized 2-D expert weight whose shape is not hidden_size × the expert width, either way round."""
    shape, dtype = tensor
    width, hidden = _width(text), text.get("hidden_size")
    if width is None or not isinstance(hidden, int) or not name.endswith(".weight") or len(shape) != 2:
        return []
    if dtype not in _LOGICAL_DTYPES or sorted(shape) == sorted([width[1], hidden]):
        return []
    return [
        f"{name} has shape {shape} (as every expert of its module), and config.json's {width[0]} {width[1]} and "
        f"hidden_size {hidden} imply {[width[1], hidden]} or {[hidden, width[1]]}"
    ]


def _moe_layers(text: dict[str, Any], n: int) -> tuple[tuple[int, ...], str]:
    """Which layers route to experts, by the family's fields (module docstring)."""
    types = text.get("mlp_layer_types")
    if isinstance(types, list) and len(types) == n:  # Kimi-Linear, DeepSeek-V3.2, DeepSeek-V4 (MOE_MLP_LAYER_TYPES)
        return tuple(i for i, t in enumerate(types) if t in MOE_MLP_LAYER_TYPES), ", mlp_layer_types"
    if (listed := _layer_list(text)) is not None and "moe" in listed[1]:  # Nemotron-H: a layer is one block
        return tuple(i for i, t in enumerate(listed[1]) if t == "moe"), f", {listed[0]}"
    if (start := _int(text, "moe_layer_start_index", 0)) is not None:  # ERNIE 4.5 (Ernie4_5_MoeDecoderLayer)
        end = text.get("moe_layer_end_index")
        end = n - 1 if not isinstance(end, int) or isinstance(end, bool) or end < 0 else end
        step = _int(text, "moe_layer_interval") or 1
        return tuple(i for i in range(n) if start <= i <= end and (i + 1) % step == 0), ", moe_layer_start_index"
    if (listed := _int_list(text, "moe_layers")) is not None:
        return tuple(i for i in range(n) if i in listed), ", moe_layers"
    if (dense := _int(text, "first_k_dense_replace", 0)) is not None:
        freq = _int(text, "moe_layer_freq") or 1
        return tuple(i for i in range(n) if i >= dense and i % freq == 0), ", first_k_dense_replace"
    if (dense := _int(text, "num_dense_layers", 0)) is not None:  # LFM2-MoE (Lfm2MoeDecoderLayer: i >= it)
        return tuple(range(dense, n)), ", num_dense_layers"
    if "decoder_sparse_step" in text or "mlp_only_layers" in text:
        step = _int(text, "decoder_sparse_step") or 1
        only = set(_int_list(text, "mlp_only_layers") or [])
        return tuple(
            i for i in range(n) if i not in only and (i + 1) % step == 0
        ), ", mlp_only_layers/decoder_sparse_step"
    if (step := _int(text, "interleave_moe_layer_step")) is not None:
        return tuple(range(step - 1, n, step)), ", interleave_moe_layer_step"
    return tuple(range(n)), ""
