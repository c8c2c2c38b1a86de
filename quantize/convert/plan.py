"""Which Linear layers get which group size: the recipe's targets and its `indivisible` policy,
planned on a meta-device model (shapes and names, no weights, no memory).

Mixture-of-experts models (config.json declares routed experts: architecture.moe_spec): transformers 5 holds
each MoE layer's experts as fused 3-D tensors, which no `Linear` target matches. For a backend that
`linearizes_experts` (llm-compressor) the plan first runs llm-compressor's own conversion (`linearize_moe`, on the
meta model) so that every expert is
one Linear per projection, named as `oneshot` will name it (`mlp.experts.N.gate_proj`), and is planned like any
other layer. Routers (the part architecture.part_of names `router`) stay at 16 bits, with the reason; a fused
expert tensor that llm-compressor cannot convert is listed as kept, with the reason, never silently left out.

Parameters no Linear holds, which compressed-tensors' schemes (Linear weights) cannot reach, are listed too where
they are a weight of the model's computation rather than a norm or its input/output embeddings: a recurrent or
state-space mixer's own parameters (A_log, D, dt_bias), a causal convolution's kernel, a per-layer input embedding
(Gemma 4), a per-head or per-layer scalar (gpt-oss's sinks, Gemma 4's layer_scalar), by their role in the
accounting (checkpoint/accounting.role_of), under the names the checkpoint stores them by where transformers merges
several into one on load (Kimi-Linear's q/k/v_conv1d)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from quantize.checkpoint import vllm_reading
from quantize.checkpoint.accounting import role_of
from quantize.checkpoint.architecture import moe_spec, part_of
from quantize.checkpoint.expert_names import ModelNames, expert_checkpoint_names, per_expert_loader, renamings
from quantize.checkpoint.expert_names import checkpoint_name as checkpoint_name
from quantize.checkpoint.headers import TensorInfo
from quantize.compat.llmcompressor import NotLinearizable, linearized_on_meta
from quantize.convert.recipe import MIN_GROUP, GroupedRecipe, Indivisible, Recipe
from quantize.errors import UsageError
from quantize.records import ExpertRouting, LayerPlanRecord


@dataclass
class LayerPlan:
    """Target Linear layers by weight group size (None: per channel / per tensor), and layers kept at 16 bits."""

    groups: dict[int | None, list[str]] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    # parameters (not modules) the targets would cover but no modifier can reach: fused 3-D expert tensors
    # llm-compressor has no per-expert conversion for (kept at 16 bits, never added to the modifiers' ignore)
    unconverted: dict[str, str] = field(default_factory=dict)
    experts: list[str] = field(default_factory=list)  # the MoE modules turned into per-expert Linear layers
    routing: list[ExpertRouting] = field(default_factory=list)  # filled in by the conversion's calibration
    stored_names: dict[str, str] = field(default_factory=dict)  # expert projection -> its name in the checkpoint
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (checkpoint regex, model name) on load
    ignored: dict[str, str] = field(default_factory=dict)  # Linear layers the targets match and `ignore` removes
    fused: list[str] = field(default_factory=list)  # the fused 3-D expert tensors of the model as loaded
    model_type: str = ""  # config.json's model_type (messages name the family; a backend may refuse one)
    schemes: dict[str, str] = field(default_factory=dict)  # layer -> another scheme than the recipe's (overrides)

    @property
    def quantized(self) -> int:
        return sum(len(v) for v in self.groups.values())

    def record(self) -> LayerPlanRecord:
        return LayerPlanRecord(
            quantized_layers=self.quantized,
            by_group_size={("per-channel" if g is None else str(g)): len(v) for g, v in self.groups.items()},
            adjusted={n: g for g, names in self.groups.items() for n in names if g is not None}
            if len(self.groups) > 1
            else {},
            kept_16bit=self.kept | self.unconverted,
            schemes=dict(Counter(self.schemes.values())),
            routing=self.routing,
        )


def divisor_group(in_features: int, group_size: int) -> int | None:
    """The largest power-of-two group <= group_size (and >= MIN_GROUP) that divides in_features."""
    g = group_size
    while g >= MIN_GROUP:
        if in_features % g == 0:
            return g
        g //= 2
    return None


# how a layer's kept-at-16-bits reason begins when the group does not divide its input features (the gptqmodel
# backend tells these apart from other kept layers)
INDIVISIBLE = "in_features"

ROUTER_REASON = (
    "router of an MoE layer: its logits choose each token's experts, so rounding it reroutes tokens, and it is a "
    "tiny share of the bytes (llm-compressor's MoE examples ignore it too)"
)


STORED_AS_IS = "compressed-tensors' schemes quantize Linear weights, so it is stored as the source stores it"
# the accounting's role of a parameter no Linear holds -> why it stays at 16 bits (embeddings: beside the model's
# input and output embeddings only)
NOT_LINEAR = {
    "state": "a recurrent or state-space mixer's own parameter (A_log, D, dt_bias: its decay, skip and step terms, "
    f"no Linear's weight); {STORED_AS_IS}",
    "conv": "a causal convolution's kernel (a Conv1d of a linear-attention, Mamba2 or short-convolution mixer, no "
    f"Linear); {STORED_AS_IS}",
    "embedding": "a per-layer input embedding (an Embedding looked up beside the input embeddings, no Linear); "
    f"{STORED_AS_IS}",
    "scalar": "a per-head or per-layer scalar the computation adds or multiplies (gpt-oss's attention sinks, Gemma "
    f"4's layer_scalar: no Linear's weight); {STORED_AS_IS}",
}


def _not_linear(model: Any, plan: LayerPlan) -> None:
    """Parameters no Linear holds that are a weight of the computation (NOT_LINEAR, by the accounting's role of
    their name), listed as left at 16 bits under the names the checkpoint stores them by; a buffer the checkpoint
    stores (persistent: Gemma 4's layer_scalar) too."""
    import torch

    names = ModelNames(plan.model_type)
    own = {id(m) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}
    stored = set(model.state_dict())  # parameters and persistent buffers
    buffers = [(n, b) for n, b in model.named_buffers() if n in stored]
    for name, p in [*model.named_parameters(), *buffers]:
        module = model.get_submodule(name.rpartition(".")[0])
        if isinstance(module, torch.nn.Linear) or id(module) in own or name in plan.unconverted:
            continue
        role = role_of(name, TensorInfo(name, "BF16", list(p.shape), 0, ""), set())
        if role in NOT_LINEAR:
            plan.unconverted |= dict.fromkeys(names.sources(name), NOT_LINEAR[role])


# values a config field may hold to pass down as config.json would hold it
_PLAIN = (int, float, str, bool, list, dict, type(None))


def config_fields(config: Any) -> dict[str, Any]:
    """A transformers config as a plain dict under the names transformers gives its fields: what it saves
    (`to_dict`), plus every name its class's attribute_map aliases (ERNIE 4.5's num_experts for moe_num_experts,
    Kimi-Linear's num_experts_per_tok for num_experts_per_token, Nemotron-H's layer_types for layers_block_type)
    and every property of the class it does not save (Nemotron-H's num_hidden_layers, from its layer list), read
    through the class; a property that cannot be read as one value (a per-layer attribute) is left out. For the
    architecture module, which reads config.json's fields without transformers."""
    from transformers.utils import logging as hf_logging

    fields = config.to_dict()
    cls = type(config)
    aliases = list(getattr(cls, "attribute_map", {}) or {})
    properties = [n for n in dir(cls) if not n.startswith("_") and isinstance(getattr(cls, n, None), property)]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a deprecated property (torch_dtype) says so when read
    try:
        for name in [n for n in [*aliases, *properties] if n not in fields]:
            try:
                value = getattr(config, name)
            except (AttributeError, RuntimeError, ValueError, TypeError):  # a per-layer attribute has no one value
                continue
            if isinstance(value, _PLAIN):
                fields[name] = value
    finally:
        hf_logging.set_verbosity(verbosity)
    return fields


def _moe(model: Any, recipe: Recipe, plan: LayerPlan, linearize: bool) -> None:
    """An MoE model's experts as per-expert Linear layers (llm-compressor's conversion, for a backend that
    `linearize`s them), its routers kept at 16 bits and any fused expert tensor left over listed as kept."""
    plan.fused = [n for n, p in model.named_parameters() if p.ndim == 3 and part_of(n, "") == "routed_experts"]
    if moe_spec(config_fields(model.config)) is None and not plan.fused:  # fused experts are planned whatever
        return  # the config calls them: never left at 16 bits unlisted for a spelling this module does not read
    if linearize:
        try:
            plan.experts = linearized_on_meta(model)
        except NotLinearizable as e:
            raise UsageError(
                f"{model.config.model_type}: llm-compressor cannot turn this checkpoint's fused experts "
                f"({e.experts_class}) into per-expert layers ({e.why[:200]}), so no method can calibrate or "
                "quantize them and its oneshot would stop on them. Use a checkpoint of the layout llm-compressor "
                "converts for this family"
            ) from None
        if plan.experts:
            plan.stored_names = expert_checkpoint_names(model.config.model_type)
    for name, p in model.named_parameters():
        module, _, param = name.rpartition(".")
        part = part_of(module, "")
        if part == "router" and param == "weight":
            plan.kept[module] = ROUTER_REASON
        elif p.ndim == 3 and part_of(name, "") == "routed_experts" and linearize:
            plan.unconverted[name] = (
                f"fused expert tensor {tuple(p.shape)} of {type(model.get_submodule(module)).__name__}: "
                f"no per-expert Linear conversion for it in {recipe.backend}, so no target reaches it"
            )


def _fused_only(model: Any, plan: LayerPlan, planned: set[str]) -> None:
    """A family whose checkpoints store its experts fused (transformers has no per-expert loader for it: gpt-oss,
    Granite 4). With its experts in `ignore` they are written back fused, at 16 bits (the backend's save), as every
    loader reads them. With them quantized llm-compressor writes them one per expert, a layout transformers does not
    read for such a family (from_pretrained would leave its fused experts missing, initialised at random) and
    quantize's own loader does (checkpoint/decompressed.py: the reload check, `eval`, the gate): written so where
    vLLM reads it (vllm_reading.PER_EXPERT, read in its source: Granite 4), refused before loading where vLLM reads
    nothing of it (gpt-oss), since no engine would serve it."""
    family = model.config.model_type
    if not plan.experts or per_expert_loader(family):
        return
    quantized = sorted(n for n in planned if _is_expert(n, plan.experts))
    if not quantized:
        plan.unconverted |= {
            n: "routed experts of a family transformers reads only fused, kept at 16 bits (the recipe's ignore) and "
            "written back fused"
            for n in plan.fused
        }
        return
    reading = vllm_reading.PER_EXPERT.get(family)
    if reading is not None and reading.reads:
        return  # written per expert; the run's reload stage says which loaders read it (convert/checks.py)
    vllm = (
        f"; {vllm_reading.said(family, [])}"
        if reading is not None
        else "; what vLLM reads of it is not known here (checkpoint/vllm_reading.py has no reading of this family)"
    )
    raise UsageError(
        f"{family}: llm-compressor would write this family's quantized experts one per expert (e.g. {quantized[0]}): "
        f"transformers {_version('transformers')} reads its routed experts only as fused 3-D tensors, with no "
        f"quantized form (from_pretrained would leave them missing, initialised at random){vllm}. Only quantize's "
        "own loader is known to read such a checkpoint. Add 're:.*\\.experts\\..*' to "
        "`ignore` to keep the experts at 16 bits (the rest is quantized; the experts' bytes are recorded as left at "
        "16 bits), or quantize them with a tool whose output your serving engine reads"
    )


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _is_expert(name: str, experts: list[str]) -> bool:
    return any(name.startswith(f"{e}.") for e in experts)


def _one_expert_group(
    layers: list[tuple[str, Any]], recipe: Recipe, plan: LayerPlan, override: dict[str, Any]
) -> list[tuple[str, Any]]:
    """transformers 5 reloads a compressed-tensors MoE checkpoint by dequantizing each layer's per-expert weights
    into its fused tensors with ONE scheme for all experts: under `indivisible: smaller-group`, every expert
    projection (but one an override names) gets one group size, the largest (<= the recipe's) that divides all
    their input features. Returns the layers left to plan."""
    g = recipe.weight_group
    experts = {n for n, _ in layers if _is_expert(n, plan.experts) and n not in override}
    expert_in = [m.in_features for n, m in layers if n in experts]
    if not expert_in or g is None or recipe.indivisible is not Indivisible.smaller_group:
        return layers
    common = divisor_group(math.gcd(*expert_in), g)
    if common is None or common == g or not getattr(recipe, "smaller_groups", True):
        return layers
    plan.groups.setdefault(common, []).extend(n for n, _ in layers if n in experts)
    return [(n, m) for n, m in layers if n not in experts]


def _check_overrides(recipe: Recipe, matched: list[set[str]], names: set[str]) -> None:
    """Each override matches a layer the recipe quantizes: one that matched none, or only ignored layers, did
    nothing and said nothing (a review)."""
    for i, found in enumerate(matched):
        if not found & names:
            targets = recipe.overrides[i].targets  # type: ignore[union-attr]  # only a GroupedRecipe has overrides
            raise UsageError(
                f"overrides.{i}.targets {targets} match no layer the recipe quantizes (its targets {recipe.targets} "
                f"minus ignore {recipe.ignore}), so the override would change nothing; check the names, or remove it"
            )


def plan_layers(model: Any, recipe: Recipe, linearize_experts: bool) -> LayerPlan:
    """The layer plan of `recipe` on `model` (meta device); `linearize_experts`: the backend's capability of that
    name (its class's, read through the registry by the caller: this module sits below the backends)."""
    import torch
    from compressed_tensors.utils.match import match_named_modules

    plan = LayerPlan(model_type=str(model.config.model_type), renamed=renamings(str(model.config.model_type)))
    _moe(model, recipe, plan, linearize_experts)
    _not_linear(model, plan)
    layers = [
        (n, m)
        for n, m in match_named_modules(model, recipe.targets, recipe.ignore)
        if isinstance(m, torch.nn.Linear) and n not in plan.kept
    ]
    names = {n for n, _ in layers}
    plan.ignored = {
        n: "in the recipe's ignore list"
        for n, m in match_named_modules(model, recipe.targets, [])
        if isinstance(m, torch.nn.Linear) and n not in names and n not in plan.kept
    }
    _fused_only(model, plan, names)
    if not layers:
        raise UsageError(
            f"targets {recipe.targets} minus ignore {recipe.ignore} match no Linear layer of this model; "
            "check the names (use 'Linear' for all linear layers, or 're:<regex>' on module names)"
        )
    g = recipe.weight_group
    override = {}
    overrides = recipe.overrides if isinstance(recipe, GroupedRecipe) else []
    matched = [{n for n, _ in match_named_modules(model, o.targets, recipe.ignore)} for o in overrides]
    _check_overrides(recipe, matched, names)
    for o, found in reversed(list(zip(overrides, matched, strict=True))):  # the first matching override wins
        override |= dict.fromkeys(found, o.scheme)
    bad = []
    layers = _one_expert_group(layers, recipe, plan, override)
    for name, module in layers:
        if override.get(name) == "keep":
            plan.kept[name] = "kept at 16 bits by an override"
            continue
        if name in override and override[name] != recipe.scheme:
            plan.schemes[name] = override[name].value
        if g is None or module.in_features % g == 0:
            plan.groups.setdefault(g, []).append(name)
            continue
        if recipe.indivisible is Indivisible.error:
            bad.append(f"{name} (in_features {module.in_features})")
        elif (
            recipe.indivisible is Indivisible.smaller_group
            and getattr(recipe, "smaller_groups", True)
            and (g2 := divisor_group(module.in_features, g))
        ):
            plan.groups.setdefault(g2, []).append(name)
        else:
            what = f"group_size {g}" if getattr(recipe, "smaller_groups", True) else f"the format's group of {g}"
            plan.kept[name] = f"{INDIVISIBLE} {module.in_features} is not divisible by {what}"
    if bad:
        raise UsageError(
            f"group_size {g} does not divide the input features of {len(bad)} layer(s), e.g. {bad[0]}; "
            "set `indivisible: smaller-group` (largest group that divides) or `indivisible: keep` (16 bits)"
        )
    if not plan.groups:
        raise UsageError(
            "no layer is left to quantize after the indivisible policy; lower group_size or use indivisible: "
            "smaller-group"
        )
    return plan
