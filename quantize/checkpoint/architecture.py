"""Architecture knowledge as data: what config.json and the tensor names say about a model's attention, KV
cache and experts, for what llm-compressor and compressed-tensors do not describe (the decode cost model and
the accounting by part).

Every fact comes from a config.json field, checked against transformers' own config classes (5.17:
Qwen3MoeConfig, Qwen2MoeConfig, MixtralConfig, OlmoeConfig, DeepseekV3Config, GptOssConfig, Gemma2Config,
Gemma3TextConfig, Llama4TextConfig), never from the class name alone; `model_type` only supplies a family's
default pattern where an older config.json leaves `layer_types` out.

    KV values per token and layer:  MHA/GQA  2 × num_key_value_heads × head_dim
                                    MLA      kv_lora_rank + qk_rope_head_dim   (one latent, shared by all heads)
    tokens a layer holds:           full attention: the context; sliding window w: min(context, w);
                                    chunked attention (Llama 4) of chunk c: min(context, c)
    MoE layer i:                    Qwen (mlp_only_layers, decoder_sparse_step): i ∉ mlp_only_layers and
                                        (i + 1) mod decoder_sparse_step = 0
                                    DeepSeek (first_k_dense_replace, moe_layer_freq): i ≥ k and i mod freq = 0
                                    Llama 4: i ∈ moe_layers (else every interleave_moe_layer_step-th layer)
                                    otherwise (Mixtral, OLMoE, gpt-oss): every layer
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from quantize.errors import UsageError

# --- parts of a model, by tensor name -----------------------------------------------------------

PARTS = (
    "attention",
    "mlp",
    "routed_experts",
    "shared_experts",
    "router",
    "embedding",
    "lm_head",
    "norm",
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
        (r"(^|\.)(mlp|feed_forward)\.router$", "router"),  # gpt-oss, Llama 4
        (r"(^|\.)shared_expert_gate$", "router"),  # Qwen2-MoE's gate on its shared expert
        (r"(^|\.)(self_attn|attention|attn)(\.|$)", "attention"),
        (r"(^|\.)(mlp|feed_forward|ffn|block_sparse_moe)(\.|$)", "mlp"),
    ]
]
TENSOR_ROLE_PARTS = {"embedding": "embedding", "lm_head": "lm_head", "norm": "norm"}
_EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)(?:\.|$)")
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def part_of(module: str, tensor_role: str) -> str:
    """The part of the model a tensor belongs to, from its module name and its accounting role (embedding,
    lm_head and norm roles name their part; a norm inside an attention block is a norm)."""
    if tensor_role in TENSOR_ROLE_PARTS:
        return TENSOR_ROLE_PARTS[tensor_role]
    for pattern, part in PART_RULES:
        if pattern.search(module):
            return part
    return "other"


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


def _int(cfg: dict[str, Any], key: str, minimum: int = 1) -> int | None:
    """An integer field >= minimum, None when absent or null, a UsageError naming it otherwise."""
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UsageError(f"config.json's {key} is {v!r}; it must be a whole number >= {minimum}. Fix config.json")
    return v


def _int_list(cfg: dict[str, Any], key: str) -> list[int] | None:
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise UsageError(f"config.json's {key} is {str(v)[:60]}; it must be a list of layer indices. Fix config.json")
    return v


def _first_int(cfg: dict[str, Any], keys: tuple[str, ...], minimum: int = 1) -> tuple[str, int] | None:
    for k in keys:
        if (v := _int(cfg, k, minimum)) is not None:
            return k, v
    return None


EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# sliding-window layer pattern of a family whose older config.json has no `layer_types`: layer i slides unless
# (i + 1) is a multiple of it (the default each config class's __post_init__ fills in)
FAMILY_SLIDING_PATTERN = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "gpt_oss": 2}
WINDOWED_LAYER_TYPES = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


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
    text = text_config(cfg)
    n = _int(text, "num_hidden_layers")
    if n is None:
        raise UsageError("config.json lacks num_hidden_layers; fix config.json, or pass --layers/--kv-heads/--head-dim")
    return n


def attention_layers(cfg: dict[str, Any]) -> tuple[AttentionLayer, ...]:
    """Each layer's attention kind and window: `layer_types`, else `sliding_window_pattern` or the family's
    pattern, else a `sliding_window` every layer uses (Mistral; Qwen2 only where use_sliding_window, from
    layer max_window_layers on), else full attention everywhere."""
    text = text_config(cfg)
    n = layer_count(cfg)
    window = _int(text, "sliding_window")
    types = text.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n or not all(isinstance(t, str) for t in types):
            raise UsageError(
                f"config.json's layer_types must list one attention type per layer ({n}); got {str(types)[:80]}"
            )
        return tuple(_typed_layer(text, t) for t in types)
    pattern = _int(text, "sliding_window_pattern") or FAMILY_SLIDING_PATTERN.get(str(text.get("model_type")))
    if window is not None and pattern is not None:
        return tuple(_layer(window) if (i + 1) % pattern else _layer(None) for i in range(n))
    if window is None or text.get("use_sliding_window") is False:
        return (_layer(None),) * n
    first = _int(text, "max_window_layers", 0) if text.get("use_sliding_window") is True else None
    return tuple(_layer(window if first is None or i >= first else None) for i in range(n))


def _layer(window: int | None) -> AttentionLayer:
    return AttentionLayer("full_attention" if window is None else "sliding_attention", window)


def _typed_layer(text: dict[str, Any], kind: str) -> AttentionLayer:
    if kind == "full_attention":
        return AttentionLayer(kind, None)
    if kind in WINDOWED_LAYER_TYPES:
        key = WINDOWED_LAYER_TYPES[kind]
        if (w := _int(text, key)) is None:
            raise UsageError(f"config.json's layer_types names {kind} layers but {key} is not set; fix config.json")
        return AttentionLayer(kind, w)
    raise UsageError(
        f"config.json's layer_types names {kind!r} layers, whose cache the cost model does not know (it knows "
        f"full_attention, {', '.join(WINDOWED_LAYER_TYPES)}); pass --layers/--kv-heads/--head-dim instead"
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
    return KVSpec(
        "MHA/GQA", 2 * kv_heads * head_dim, layers, f"2 × num_key_value_heads {kv_heads} × head_dim {head_dim}"
    )


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
    top_k = _int(text, "num_experts_per_tok")
    if top_k is None or top_k > experts:
        raise UsageError(
            f"config.json declares {experts} routed experts ({count_key}) but num_experts_per_tok is "
            f"{text.get('num_experts_per_tok')!r}; it must be a whole number from 1 to {experts}. Fix config.json"
        )
    shared = _int(text, "n_shared_experts", 0) or (1 if _int(text, "shared_expert_intermediate_size") else 0)
    n = layer_count(cfg)
    layers, rule = _moe_layers(text, n)
    return MoESpec(experts, top_k, shared, layers, f"{count_key}, num_experts_per_tok{rule}")


# --- the routed experts' tensors against config.json --------------------------------------------

# one routed expert's tensor (`...experts.N.REST`, per expert) and a fused one (`...experts.NAME`, E experts stacked
# on its first dimension: gpt-oss, Llama 4, transformers 5 in memory), by name
_PER_EXPERT = re.compile(r"^(.*(?:^|\.)experts)\.(\d+)\.(.+)$")
_FUSED_EXPERTS = re.compile(r"^(.*(?:^|\.)experts)\.([^.]+)$")
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


def expert_problems(cfg: dict[str, Any], shapes: dict[str, tuple[list[int], str]], mixed: bool = False) -> list[str]:
    """What the safetensors headers (`shapes`: tensor name -> (shape, dtype)) hold of the routed experts against
    what config.json declares (its expert count E: routed_experts), without a model. Per expert module
    `...experts`: each of experts 0 to E-1 holds the same tensors with the same shapes as the others (an expert
    missing, an index past E, a tensor one expert lacks or has alone, a shape the others do not share), and every
    unquantized 2-D weight is hidden_size by the expert width (EXPERT_WIDTH_KEYS), either way round; a fused expert
    tensor stacks E experts on its first dimension. mixed: each expert may hold its own tensors (a quantization of
    its own, read by the per-expert loader: checkpoint/decompressed.py), so only the experts' count is checked
    across them. [] for a dense model or consistent experts."""
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
        found += _expert_module_problems(module, experts, count, declared, text, mixed)
    return found


def _expert_module_problems(
    module: str,
    experts: dict[int, dict[str, tuple[list[int], str]]],
    count: int,
    declared: str,
    text: dict[str, Any],
    mixed: bool = False,
) -> list[str]:
    """One per-expert module's experts against each other and against config.json (expert_problems)."""
    found = [f"{module}.{i} is missing (no tensor of expert {i}); {declared}" for i in range(count) if i not in experts]
    found += [
        f"{module}.{i} is an expert past the last ({', '.join(sorted(experts[i]))}); {declared}, 0 to {count - 1}"
        for i in sorted(experts)
        if i >= count
    ]
    held = {i: t for i, t in experts.items() if i < count}
    if mixed:
        return found
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
    if (listed := _int_list(text, "moe_layers")) is not None:
        return tuple(i for i in range(n) if i in listed), ", moe_layers"
    if (dense := _int(text, "first_k_dense_replace", 0)) is not None:
        freq = _int(text, "moe_layer_freq") or 1
        return tuple(i for i in range(n) if i >= dense and i % freq == 0), ", first_k_dense_replace"
    if "decoder_sparse_step" in text or "mlp_only_layers" in text:
        step = _int(text, "decoder_sparse_step") or 1
        only = set(_int_list(text, "mlp_only_layers") or [])
        return tuple(
            i for i in range(n) if i not in only and (i + 1) % step == 0
        ), ", mlp_only_layers/decoder_sparse_step"
    if (step := _int(text, "interleave_moe_layer_step")) is not None:
        return tuple(range(step - 1, n, step)), ", interleave_moe_layer_step"
    return tuple(range(n)), ""
