"""Which Linear layers get which group size: the recipe's targets and its `indivisible` policy,
planned on a meta-device model (shapes and names, no weights, no memory)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from quantize.convert.recipe import MIN_GROUP, GroupedRecipe, Indivisible, Recipe
from quantize.errors import UsageError
from quantize.records import LayerPlanRecord


@dataclass
class LayerPlan:
    """Target Linear layers by weight group size (None: per channel / per tensor), and layers kept at 16 bits."""

    groups: dict[int | None, list[str]] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
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
            kept_16bit=self.kept,
            schemes=dict(Counter(self.schemes.values())),
        )


def divisor_group(in_features: int, group_size: int) -> int | None:
    """The largest power-of-two group <= group_size (and >= MIN_GROUP) that divides in_features."""
    g = group_size
    while g >= MIN_GROUP:
        if in_features % g == 0:
            return g
        g //= 2
    return None


def plan_layers(model: Any, recipe: Recipe) -> LayerPlan:
    import torch
    from compressed_tensors.utils.match import match_named_modules

    plan = LayerPlan()
    layers = [
        (n, m) for n, m in match_named_modules(model, recipe.targets, recipe.ignore) if isinstance(m, torch.nn.Linear)
    ]
    if not layers:
        raise UsageError(
            f"targets {recipe.targets} minus ignore {recipe.ignore} match no Linear layer of this model; "
            "check the names (use 'Linear' for all linear layers, or 're:<regex>' on module names)"
        )
    g = recipe.weight_group
    override = {}
    for o in reversed(
        recipe.overrides if isinstance(recipe, GroupedRecipe) else []
    ):  # the first matching override wins
        override |= {n: o.scheme for n, _ in match_named_modules(model, o.targets, recipe.ignore)}
    bad = []
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
            plan.kept[name] = f"in_features {module.in_features} is not divisible by {what}"
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
