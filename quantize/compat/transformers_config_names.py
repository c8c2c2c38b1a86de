"""transformers' config attribute maps, copied without torch (checked on 5.17 by compat/transformers.problems()).

A transformers config class may store a field under another name than the one other classes use, and reads both:
its `attribute_map` sends the common name to the stored one (ERNIE 4.5 stores `num_experts_per_tok` as `moe_k`,
DeepSeek-V3 `num_local_experts` as `n_routed_experts`, Nemotron-H `layer_types` as `layers_block_type`), and
`PretrainedConfig.__setattr__` (so `from_pretrained` reading config.json) sets the stored attribute whichever name
a file uses. The light readers (checkpoint/architecture.py: cost, the accounting, the checks on headers) answer
from config.json without importing transformers (its config classes import torch: 40-110 s measured on a loaded
2-core machine), so the maps of the fields they read are copied here as data: every `attribute_map` entry of
transformers 5.17's CONFIG_MAPPING whose name or stored name is one of READ. `problems()` in compat/transformers.py
compares them with the library's classes (`library_maps` there), so a change upstream fails tests/compat. So is
SLIDING_SWITCH, the families whose sliding window is off unless config.json switches it on, and which layers each
class slides once it is (`library_switches`: each class built switched on), and MTP_UNEXPECTED, the stored names
each family's model ignores as its multi-token-prediction module (`library_mtp_patterns`).
"""

from __future__ import annotations

# the common names the light readers read (architecture.py): the routed experts per MoE layer, the experts each
# token is routed to, the per-layer type list, the multi-token-prediction layers stored after the decoder's (the
# name DeepSeek's and GLM's config.json use, which DeepseekV3Config, Glm4MoeConfig and Step3p7TextConfig store
# their `num_mtp_layers` under, and DeepseekV4Config and NemotronHConfig hold as a field of their own)
READ = ("num_local_experts", "num_experts", "num_experts_per_tok", "layer_types", "num_nextn_predict_layers")

# model_type -> {name: the attribute it is stored under}, for every entry touching READ (transformers 5.17)
ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {
    "axk1": {"num_local_experts": "n_routed_experts"},
    "axk2": {"num_local_experts": "n_routed_experts"},
    "bamba": {"layer_types": "layers_block_type"},
    "deepseek_ocr2_text": {"num_experts": "n_routed_experts"},
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    "deepseek_v32": {"num_local_experts": "n_routed_experts"},
    "deepseek_v4": {"num_local_experts": "n_routed_experts"},
    "dots1": {"num_local_experts": "n_routed_experts"},
    "ernie4_5_moe": {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
    "ernie4_5_vl_moe_text": {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
    "falcon_h1": {"layer_types": "layers_block_type"},
    "flex_olmo": {"num_local_experts": "num_experts"},
    "glm4_moe": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    "glm4_moe_lite": {"num_local_experts": "n_routed_experts"},
    "glm4v_moe_text": {"num_local_experts": "n_routed_experts"},
    "glm5_next_text": {"num_local_experts": "n_routed_experts"},
    "glm_moe_dsa": {"num_local_experts": "n_routed_experts"},
    "gpt_oss": {"num_experts": "num_local_experts"},
    "granitemoehybrid": {"layers_block_type": "layer_types"},
    "hunyuan_v1_moe": {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"},
    "hy_v3": {"num_local_experts": "num_experts"},
    "hy_v4": {"num_local_experts": "n_routed_experts"},
    "inkling_text": {"num_local_experts": "n_routed_experts"},
    "jamba": {"num_local_experts": "num_experts"},
    "kimi_linear": {"num_experts_per_tok": "num_experts_per_token", "num_local_experts": "num_experts"},
    "longcat_flash": {"num_experts_per_tok": "moe_topk", "num_local_experts": "n_routed_experts"},
    "mellum": {"num_experts": "num_local_experts"},
    "mimo_v2_flash": {"num_local_experts": "n_routed_experts"},
    "minimax": {"num_experts": "num_local_experts"},
    "minimax_m2": {"num_experts": "num_local_experts"},
    "minimax_m3_vl_text": {"num_experts": "num_local_experts"},
    "mistral4": {"num_local_experts": "n_routed_experts"},
    "mixtral": {"num_experts": "num_local_experts"},
    "nemotron_h": {"layer_types": "layers_block_type", "num_local_experts": "n_routed_experts"},
    "olmoe": {"num_local_experts": "num_experts"},
    "openai_privacy_filter": {"num_experts": "num_local_experts"},
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "qwen3_omni_moe_talker_text": {"num_experts": "num_local_experts"},
    "qwen3_vl_moe_text": {"num_experts": "num_local_experts"},
    "solar_open": {"num_local_experts": "n_routed_experts"},
    "step3p5": {
        "moe_top_k": "num_experts_per_tok",
        "num_local_experts": "n_routed_experts",
        "num_mtp_layers": "num_nextn_predict_layers",
    },
    "zamba": {"layer_types": "layers_block_type"},
    "zamba2": {"layer_types": "layers_block_type"},
}


# SLIDING_SWITCH's value for a family whose config class, switched on, derives its own layer_types by a rule other
# than Qwen2's (transformers 5.17: Qwen2-MoE's slides layers 0, 2, 4, ... below max_window_layers, SmolLM3's the
# layers its no_rope_layers leave without RoPE): which layers slide is the class's to say, and a reader without
# transformers cannot say it (architecture.attention_layers refuses such a config.json as written)
OWN_LAYER_TYPES = "own layer_types"

# model_type -> which layers its config class slides when config.json switches the window on: from the class's
# default `max_window_layers` on (Qwen2's rule: that default), every layer (None: the class has no such field), or
# by a rule of its own (OWN_LAYER_TYPES), for every family whose config class switches its sliding window with a
# `use_sliding_window` field (default False in each: a config.json without the field keeps no window whatever its
# `sliding_window` says, as the class's __post_init__ drops it or derives full-attention layer_types); transformers
# 5.17, each class built switched on and its layer_types compared with the rules (compat/transformers.py)
SLIDING_SWITCH: dict[str, int | str | None] = {
    "deepseek_ocr2_encoder": 28,
    "qwen2": 28,
    "qwen2_5_omni_talker": 28,
    "qwen2_5_omni_text": 28,
    "qwen2_5_vl_text": 80,
    "qwen2_moe": OWN_LAYER_TYPES,
    "qwen2_vl_text": 80,
    "qwen3": 28,
    "qwen3_moe": None,
    "smollm3": OWN_LAYER_TYPES,
}


# model_type -> the patterns of its causal LM's (or image-text-to-text model's) `_keys_to_ignore_on_load_unexpected`
# that name a multi-token-prediction (MTP) module stored under a prefix of its own (`mtp.*`, `model.mtp.*`,
# `model.mtp_layers.*`), beside the decoder's layers: transformers matches each with re.search against a stored name
# and drops a match from the unexpected keys, so its model never holds that module (transformers 5.17: the classes
# of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES with a pattern mentioning
# "mtp"; DeepSeek's and GLM's `model.layers.61`-style patterns name no prefix: architecture.mtp_layers reads those)
MTP_UNEXPECTED: dict[str, tuple[str, ...]] = {
    "deepseek_v4": (r"(^|\.)mtp\..*",),
    "ernie4_5_moe": ("mtp",),
    "exaone4_5": ("mtp.*",),
    "exaone_moe": ("mtp.*",),
    "hy_v4": (r"model\.mtp_layers\..*",),
    "inkling_mm_model": (r"model\.mtp\..*",),
    "inkling_text": (r"model\.mtp\..*",),
    "longcat_flash": (r"model\.mtp.*",),
    "mimo_v2_flash": (r"^model\.mtp\.",),
    "minimax_m3_vl": (r"(^|\.)mtp\..*",),
    "minimax_m3_vl_text": (r"(^|\.)mtp\..*",),
    "nemotron_h": ("mtp.*",),
    "olmo_hybrid": ("^mtp.*",),
    "qwen3_5": ("^mtp.*",),
    "qwen3_5_moe": ("^mtp.*",),
    "qwen3_5_moe_text": ("^mtp.*",),
    "qwen3_5_text": ("^mtp.*",),
    "qwen3_next": ("^mtp.*",),
    "qwen4_exp": ("^mtp.*",),
    "qwen4_exp_text": ("^mtp.*",),
}


def spellings(model_type: str | None, name: str) -> tuple[str, ...]:
    """The config.json keys that set field `name` in family `model_type`'s config class, the one it is stored
    under first: attribute_map[name] (else `name`), then `name`, then every other name the map sends to the same
    attribute. A family the copy does not know reads `name` alone."""
    amap = ATTRIBUTE_MAPS.get(model_type or "", {})
    stored = amap.get(name, name)
    return tuple(dict.fromkeys([stored, name, *(k for k, v in amap.items() if v == stored)]))
