"""Before a model loads: do AWQ's or SmoothQuant's smoothing mappings apply to this model?

Both methods smooth activations between a layer (a norm, or v_proj/up_proj) and the linears it feeds, listed as
regex mappings. Which mappings llm-compressor uses is its own choice (`get_layer_mappings_from_model`: its
registry by model class, else its default Llama mappings); how they resolve is compressed-tensors'
`match_modules_set`, the call both modifiers make. This module makes that same choice and that same call on the
model's module tree on the meta device (no weight read), with fused experts laid out as `oneshot` lays them out
before calibration (compat/llmcompressor.linearized_on_meta), and refuses (UsageError, exit 2) a model where they
cannot apply:
- a mapping's targets do not close into one set per layer (compressed-tensors raises), or a set holds more
  than one smoothing layer (the modifier raises "AWQ needs to match a single smoothlayer for each mapping",
  as on DeepSeek-V3 with dense first layers, whose routers exist only in later layers);
- no mapping matches anything (the default's names are not this model's): the run would smooth nothing;
- a mapping smooths a norm (a 1-D weight, which absorbs the smoothing by division) into linears that do not read
  that norm's output, or another layer with a weight reads that output unbalanced, so the smoothing would change
  what the model computes: traced by one forward of the meta model (shapes only) with hooks, as far as that forward
  runs (not where routing needs data, e.g. an MoE's experts), routers excepted (llm-compressor leaves them
  unbalanced by design), or a block that passes it to routed experts none of which is balanced. Found so:
  llm-compressor 0.14's Qwen3.5-MoE SmoothQuant mapping balances post_attention_layernorm into the shared expert
  alone (converted, it gave a smoke-suite KL of 4.3e-4 on a tiny model, SmoothQuant elsewhere 3e-7 to 1e-6).
  llm-compressor 0.14 registers its default mappings for Gemma 2 and Gemma 3, which smooth
  post_attention_layernorm into gate_proj/up_proj; in those models that norm feeds the residual and the MLP reads
  pre_feedforward_layernorm, and SmoothQuant alone (no quantization) moved the logits of a tiny Gemma 2 by up to
  1.16 (KL 0.028; 7e-7 on Llama; docs/families.md).
The mapping data is the library's; nothing here names an architecture."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize.checkpoint.architecture import part_of
from quantize.checkpoint.files import read_config
from quantize.checkpoint.loader import meta_model
from quantize.compat.llmcompressor import NotLinearizable, linearized_on_meta
from quantize.compat.torch import view_base
from quantize.convert.recipe import Method, Recipe
from quantize.errors import UsageError

NAMES = {Method.awq: ("AWQ", "AWQModifier"), Method.smoothquant: ("SmoothQuant", "SmoothQuantModifier")}


@dataclass(frozen=True)
class Resolution:
    """How the library's mappings for a method resolve on one model."""

    default: bool  # the library has none registered for the model's class and falls back to its default
    mappings: int  # how many mappings it chose
    sets: int  # layer groups they resolve to, over all mappings
    problem: str | None  # why they cannot apply, or None


def _chosen(model: Any, method: Method) -> tuple[list[tuple[str, ...]], bool]:
    """The library's mappings for `model` as (smoothing layer, *balance layers) target tuples, and whether they
    are its fallback default: the model's class is in neither of its registries (a class registered to the same
    list as the default is registered, e.g. Gemma 2's SmoothQuant entry)."""
    name = type(model).__name__
    if method is Method.awq:
        from llmcompressor.modifiers.transform.awq.dynamic_mappings import (
            AWQ_DYNAMIC_MAPPING_REGISTRY,
            get_layer_mappings_from_model,
        )
        from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY

        maps = get_layer_mappings_from_model(model)
        default = name not in AWQ_DYNAMIC_MAPPING_REGISTRY and name not in AWQ_MAPPING_REGISTRY
        return [(m.smooth_layer, *m.balance_layers) for m in maps], default
    from llmcompressor.modifiers.transform.smoothquant.dynamic_mappings import (
        SMOOTHQUANT_DYNAMIC_MAPPING_REGISTRY,
        get_layer_mappings_from_model,
    )
    from llmcompressor.modifiers.transform.smoothquant.utils import MAPPINGS_REGISTRY

    maps = get_layer_mappings_from_model(model)
    default = name not in SMOOTHQUANT_DYNAMIC_MAPPING_REGISTRY and name not in MAPPINGS_REGISTRY
    return [(m.smooth_layers, *m.balance_layers) for m in maps], default


def resolve(model: Any, method: Method) -> Resolution:
    """The library's mappings for `method` resolved on `model` (meta device, experts already laid out)."""
    from compressed_tensors.utils import match_modules_set

    mappings, default = _chosen(model, method)
    names = {id(m): n for n, m in model.named_modules()}
    sets, resolved = 0, []
    for targets in mappings:
        try:
            groups = list(match_modules_set(model, targets))
        except ValueError as e:
            return Resolution(default, len(mappings), sets, f"mapping {targets} does not resolve: {e}")
        for smooth, *_ in groups:
            if len(smooth) > 1:
                which = ", ".join(names.get(id(m), "?") for m in smooth[:4])
                return Resolution(
                    default,
                    len(mappings),
                    sets,
                    f"mapping {targets} groups {len(smooth)} smoothing layers into one set ({which}); the modifier "
                    "needs exactly one per set",
                )
        sets += len(groups)
        resolved += [(targets, smooth[0], [b for group in balance for b in group]) for smooth, *balance in groups]
    problem = None if sets else f"none of its {len(mappings)} mappings matches a layer of this model"
    return Resolution(default, len(mappings), sets, problem or unfed(model, resolved, names))


def unfed(model: Any, resolved: list[tuple[Any, Any, list[Any]]], names: dict[int, str]) -> str | None:
    """The first resolved set whose smoothing layer is a norm (a 1-D weight: the smoothing is folded into it by
    division) while a balance layer reads another tensor than that norm's output, or another layer with a weight
    reads that norm's output without being balanced (its input would be divided with nothing to make up for it;
    routers excepted, which llm-compressor's MoE mappings leave unbalanced by design, trading routing logits),
    traced by one forward of the meta-device model with hooks (the same tensor object, or a view of it, not an
    equal one); None when every such set is fed by its norm and feeds its balance layers alone. Where the forward
    stops (data-dependent ops, e.g. an MoE's routing, cannot run on the meta device), what it traced before
    stopping still counts, and nothing is claimed of what it did not reach."""
    import torch

    norms = [r for r in resolved if getattr(r[1], "weight", None) is not None and r[1].weight.ndim == 1]
    if not norms:
        return None
    produced: dict[int, str] = {}  # id of a module's output tensor -> the innermost module that returned it
    inputs: dict[int, Any] = {}  # id of a module -> the tensor it read first (taken as its forward starts)
    keep: list[Any] = []  # the traced tensors stay alive, so no id is reused during the trace

    def read(module: Any, args: tuple, kwargs: dict) -> None:
        if id(module) not in inputs:
            x = args[0] if args else next(iter(kwargs.values()), None)
            keep.append(x)
            inputs[id(module)] = view_base(x)  # a reshape of an output reads that output

    def hook(module: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            keep.append(out)
            produced.setdefault(id(out), names.get(id(module), "?"))

    handles = [m.register_forward_pre_hook(read, with_kwargs=True) for m in model.modules()]
    handles += [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()]
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 4, dtype=torch.long, device="meta"))
    except Exception:  # any architecture's forward may stop on the meta device: the trace so far counts
        pass
    finally:
        for h in handles:
            h.remove()
    for targets, norm, bs in norms:
        for b in bs:
            x = inputs.get(id(b))
            if x is None or produced.get(id(x)) == names.get(id(norm)):
                continue
            reads = produced.get(id(x))
            return (
                f"mapping {targets} smooths {names.get(id(norm))} into {names.get(id(b))}, but that layer reads "
                f"{'the output of ' + reads if reads else 'another tensor'}, not that norm's (traced on the meta "
                "device): the smoothing would change what the model computes"
            )
        if said := unbalanced(model, (targets, norm, bs), inputs, produced, names):
            return said
    return None


def unbalanced(
    model: Any, mapping: tuple[Any, Any, list[Any]], inputs: dict[int, Any], produced: dict[int, str], names: dict
) -> str | None:
    """Of `unfed`'s trace: a module other than the mapping's balance layers that reads its norm's output, with a
    weight of its own (a router excepted), or a block passing it to routed experts none of which is balanced."""
    import torch

    targets, norm, bs = mapping
    balanced = {id(b) for b in bs} | {id(norm)}
    for n, m in model.named_modules():
        x = inputs.get(id(m))
        if x is None or produced.get(id(x)) != names.get(id(norm)) or id(m) in balanced:
            continue
        if experts := [e for e, sub in m.named_modules() if part_of(f"{n}.{e}", "") == "routed_experts" and e]:
            if not any(id(sub) in balanced for e, sub in m.named_modules() if e in experts):
                return (
                    f"mapping {targets} smooths {names.get(id(norm))} into "
                    f"{', '.join(names.get(id(b), '?') for b in bs)}, but {n} reads that norm's output and "
                    "passes it to its routed experts, none of which is balanced (traced on the meta device): "
                    "their inputs would be divided by the smoothing scales with nothing to make up for it"
                )
            continue  # a block whose routed experts are balanced: its own layers are judged one by one
        if not isinstance(getattr(m, "weight", None), torch.Tensor) or part_of(n, "") == "router":
            continue  # a router: llm-compressor's MoE mappings leave it unbalanced by design (its routing moves)
        return (
            f"mapping {targets} smooths {names.get(id(norm))} into {', '.join(names.get(id(b), '?') for b in bs)}, "
            f"but {n} reads that norm's output too and is not balanced (traced on the meta device): its input "
            "would be divided by the smoothing scales with nothing to make up for it"
        )
    return None


def check_mappings(model_dir: Path, recipe: Recipe) -> Resolution | None:
    """Refuse (UsageError) an AWQ or SmoothQuant recipe whose mappings cannot apply to the model, before it loads;
    None for other methods, or where the library cannot lay the model's experts out (its own run says why)."""
    if recipe.method not in NAMES:
        return None

    model = meta_model(model_dir, recipe.trust_remote_code)
    try:
        linearized_on_meta(model)
    except (NotLinearizable, NotImplementedError):  # the plan refuses a family llm-compressor cannot linearize
        return None
    r = resolve(model, recipe.method)  # the library logs its choice (a default: "not found in mappings") unless quiet
    if r.problem is None:
        return r
    cfg = read_config(model_dir)
    arch = ", ".join(cfg.get("architectures") or []) or type(model).__name__
    method, modifier = NAMES[recipe.method]
    whose = (
        f"llm-compressor has no {method} mapping for {arch} and its default (Llama's layer names) does not fit"
        if r.default
        else f"llm-compressor's {method} mapping for {arch} does not fit this model"
    )
    raise UsageError(
        f"method: {recipe.method.value} cannot run on {model_dir} ({arch}, model_type "
        f"{cfg.get('model_type', '?')}): {whose}: {r.problem}. Nothing was loaded. Use method: gptq (it needs no "
        f"mapping), or a verbatim llm-compressor recipe (method: llmcompressor) whose {modifier} gives `mappings:` "
        "naming this model's layers"
    )
