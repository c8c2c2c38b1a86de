"""A recipe and its layer plan compiled to llm-compressor modifiers (architecture-free: the plan
names the layers, the method names the modifier chain)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from quantize.convert.plan import LayerPlan
from quantize.convert.recipe import FORMATS, WEIGHT_ONLY_INT, GPTQRecipe, KVCacheScheme, Method, Recipe, Scheme
from quantize.errors import UsageError

# Presets of compressed-tensors used as-is (activation settings included); the 2026 formats are all presets.
PRESET = {Scheme.W8A8: "W8A8", Scheme.FP8: "FP8", Scheme.FP8_DYNAMIC: "FP8_DYNAMIC"} | {s: s.value for s in FORMATS}


def _scheme(recipe: Recipe, g: int | None, targets: list[str], scheme: Scheme | None = None) -> Any:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme, preset_name_to_scheme

    s = scheme or recipe.scheme
    if s in PRESET:
        scheme = preset_name_to_scheme(PRESET[s], targets)
        if s is Scheme.W8A8:
            scheme.weights.symmetric = recipe.symmetric
        if s in FORMATS and FORMATS[s].smaller_group and g is not None and g != FORMATS[s].group:
            scheme.weights.group_size = g  # a layer the format's group does not divide (`indivisible: smaller-group`)
        return scheme
    weights = QuantizationArgs(
        num_bits=WEIGHT_ONLY_INT[s],
        type="int",
        symmetric=recipe.symmetric,
        strategy="group" if g else "channel",
        group_size=g,
    )
    return QuantizationScheme(targets=targets, weights=weights)


def kv_cache_args(scheme: KVCacheScheme) -> Any:
    """compressed-tensors' arguments of a quantized KV cache: E4M3, symmetric, static (calibrated) scales."""
    from compressed_tensors.quantization import QuantizationArgs

    strategy = "attn_head" if scheme is KVCacheScheme.FP8_PER_HEAD else "tensor"
    return QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, dynamic=False)


def checked_verbatim(stages: dict[str, Any]) -> str:
    """A verbatim `stages:` recipe as YAML, parsed by llm-compressor's own recipe model (`Recipe.create_instance`,
    no model needed) before the model loads: an unknown modifier, a field a modifier does not take or a scheme it
    does not know was exit 2 only after the load (oneshot parses it there). llm-compressor reads only the `*_stage`
    keys (and `args`) and, in each, its `*_modifiers` groups (Recipe.from_dict) and skips any other key without a
    word: a stage named otherwise quantized nothing and the run said it had converted, so such keys are refused."""
    from llmcompressor.recipe import Recipe as Parsed

    skipped = [k for k, v in stages.items() if k != "args" and not (k.endswith("_stage") and isinstance(v, dict))]
    skipped += [
        f"{k}.{g}"
        for k, v in stages.items()
        if k.endswith("_stage") and isinstance(v, dict)
        for g, m in v.items()
        if not (g.endswith("_modifiers") and isinstance(m, dict))
    ]
    if skipped:
        raise UsageError(
            f"the recipe's verbatim `stages:` has {', '.join(map(repr, skipped[:5]))}, which llm-compressor skips "
            "without reading: it reads a mapping under each key ending in `_stage`, and in it the mappings under keys "
            "ending in `_modifiers` (e.g. {quant_stage: {quant_modifiers: {QuantizationModifier: {targets: [Linear], "
            "scheme: FP8_DYNAMIC, ignore: [lm_head]}}}}); rename or remove them"
        )
    text = yaml.safe_dump(stages, sort_keys=False)
    try:
        parsed = Parsed.create_instance(text)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # pydantic's ValidationError is a ValueError
        raise UsageError(
            f"llm-compressor rejects the recipe's verbatim `stages:`: {str(e).strip()[:600]}. Fix the stage's "
            "modifiers as llm-compressor's recipe format writes them (e.g. {quant_stage: {quant_modifiers: "
            "{QuantizationModifier: {targets: [Linear], scheme: FP8_DYNAMIC, ignore: [lm_head]}}}})"
        ) from None
    if not parsed.modifiers:
        raise UsageError(
            "the recipe's verbatim `stages:` holds no llm-compressor modifier, so nothing would be quantized; put "
            "them in a stage (e.g. {quant_stage: {quant_modifiers: {QuantizationModifier: {...}}}})"
        )
    return text


def compile_modifiers(recipe: Recipe, plan: LayerPlan) -> list[Any] | str:
    """The llm-compressor recipe for this recipe: modifier objects, or YAML for a verbatim recipe (checked_verbatim)."""
    if recipe.method is Method.llmcompressor:
        return checked_verbatim(recipe.stages)
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier, SmoothQuantModifier

    # one config group per (scheme, group size): overrides give some layers another weight-only scheme
    # routed experts are named by `re:^name$` targets: transformers 5 dequantizes every expert of an MoE
    # checkpoint it reloads with the config group whose `re:` targets mention experts, else the first group
    # (integrations.compressed_tensors.get_experts_scheme), and the saved config orders groups by module order.
    # quantize reads every scheme back through its own per-expert loader (checkpoint/decompressed.py), which
    # applies each expert's own group.
    by: dict[tuple[Scheme, int | None], list[str]] = {}
    experts = tuple(f"{e}." for e in plan.experts)
    for g, names in sorted(plan.groups.items(), key=lambda kv: -(kv[0] or 0)):
        for n in names:
            target = f"re:^{re.escape(n)}$" if n.startswith(experts) else n
            by.setdefault((Scheme(plan.schemes.get(n, recipe.scheme.value)), g), []).append(target)
    groups = {f"group_{i}": _scheme(recipe, g, names, s) for i, ((s, g), names) in enumerate(by.items())}
    ignore = list(recipe.ignore) + sorted(plan.kept)
    quant: dict[str, Any] = dict(config_groups=groups, ignore=ignore)
    if (kv := getattr(recipe, "kv_cache", None)) is not None:
        quant["kv_cache_scheme"] = kv_cache_args(kv.scheme)

    def gptq() -> Any:
        # act_order: columns in order of decreasing diag(H) with static groups ("weight"): no g_idx is
        # stored, so the checkpoint keeps the plain layout every W4A16 kernel reads.
        return GPTQModifier(
            **quant,
            dampening_frac=recipe.dampening_frac,
            actorder="weight" if isinstance(recipe, GPTQRecipe) and recipe.act_order else None,
        )

    # Method -> modifier chain: transforms first, then the modifier that sets scales and rounds.
    chains = {
        Method.rtn: lambda: [QuantizationModifier(**quant)],
        Method.fp8: lambda: [QuantizationModifier(**quant)],
        Method.gptq: lambda: [gptq()],
        Method.awq: lambda: [AWQModifier(duo_scaling=True, n_grid=recipe.awq_grid), QuantizationModifier(**quant)],
        Method.smoothquant: lambda: [SmoothQuantModifier(smoothing_strength=recipe.smoothing_strength), gptq()],
    }
    return chains[recipe.method]()
