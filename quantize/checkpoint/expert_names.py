"""The names a family's checkpoints give its routed experts, against the names of the model transformers 5 builds
once llm-compressor turns its fused experts into per-expert Linear layers (`mlp.experts.N.gate_proj`), read from
the conversions transformers applies on load (compat.transformers.conversions). The conversion writes these names
(convert/plan.py, its backend's save) and the per-expert loader reads them back (checkpoint/decompressed.py).

    Mixtral   stored `block_sparse_moe.experts.N.w1` / `w3` / `w2`   model `mlp.experts.N.gate_proj` / `up_proj` /
              `down_proj`
    others    stored as the model names them (Qwen-MoE, OLMoE, DeepSeek-V3)

Besides its experts, a family's checkpoint may store as several tensors what the model holds as one, merged by
transformers on load (Kimi-Linear: `self_attn.q_conv1d`, `k_conv1d`, `v_conv1d` into `self_attn.conv1d`):
`ModelNames.merged` names the model's tensor and the part a stored one is, from the same conversions.
"""

from __future__ import annotations

import re

from quantize.compat.transformers import Conversion, conversions, quantized_per_expert

# llm-compressor's per-expert layers, by the fused tensor transformers 5 merges them into on load
_FUSED = {".experts.gate_up_proj": ("gate_proj", "up_proj"), ".experts.down_proj": ("down_proj",)}
_PER_EXPERT_SOURCE = re.compile(r"\.experts\.\*\.(\w+)\.weight$")
# one expert's projection in a module name or in a `re:` target of one (its dots escaped or not)
EXPERT_LAYER = re.compile(r"(experts(?:\\?\.)\d+(?:\\?\.))(gate_proj|up_proj|down_proj)(?=\\?\.|\$|$)")


def expert_checkpoint_names(model_type: str) -> dict[str, str]:
    """The projection names a family's checkpoints give each expert where they differ from llm-compressor's
    `gate_proj`/`up_proj`/`down_proj` (Mixtral: w1, w3, w2), read from the conversion mapping transformers 5
    merges per-expert tensors with on load: the names a saved per-expert checkpoint must use to reload."""
    names: dict[str, str] = {}
    for conv in conversions(model_type):
        if not _merges_per_expert(conv):
            continue
        for target in conv.targets:
            for fused, projs in _FUSED.items():
                if target.endswith(fused) and len(conv.sources) == len(projs):
                    for proj, src in zip(projs, conv.sources, strict=True):
                        if m := _PER_EXPERT_SOURCE.search(src):
                            names[proj] = m.group(1)
    return {k: v for k, v in names.items() if k != v}


def renamings(model_type: str) -> list[tuple[str, str]]:
    """The (checkpoint regex, model name) renamings transformers 5 applies on load for a family (Mixtral's
    `.block_sparse_moe.` -> `.mlp.`); save_pretrained writes the checkpoint's names back."""
    return [
        (src, tgt)
        for conv in conversions(model_type)
        if conv.renaming
        for src, tgt in zip(conv.sources, conv.targets, strict=False)
    ]


def checkpoint_name(name: str, names: dict[str, str]) -> str:
    """A module name (or a `re:` target of one) as the checkpoint stores it (`expert_checkpoint_names`)."""
    return EXPERT_LAYER.sub(lambda m: m.group(1) + names.get(m.group(2), m.group(2)), name) if names else name


def per_expert_loader(model_type: str) -> bool:
    """Whether transformers 5 reads a per-expert compressed-tensors checkpoint of this family: its conversion
    mapping merges per-expert tensors (`experts.*.gate_proj.weight`, Mixtral's `experts.*.w1.weight`) into the
    fused experts (Qwen, OLMoE, DeepSeek, Mixtral, Nemotron-H), or its quantizer swaps the fused experts for
    per-expert layers before the load (Llama 4: compat.transformers.quantized_per_expert); not gpt-oss, whose
    checkpoints are fused, nor Granite 4, whose mapping only renames its stored fused tensors
    (`block_sparse_moe.input_linear.weight` to `experts.gate_up_proj`): a renaming whose target is the fused
    experts reads no per-expert tensor."""
    if any(_merges_per_expert(conv) for conv in conversions(model_type)):
        return True
    return quantized_per_expert(model_type)


def _merges_per_expert(conv: Conversion) -> bool:
    """Whether a conversion merges per-expert tensors (every source an `experts.*.<proj>.weight` pattern) into one."""
    return not conv.renaming and bool(conv.sources) and all(_PER_EXPERT_SOURCE.search(s) for s in conv.sources)


class ModelNames:
    """A family's checkpoint names mapped to the per-expert model's: a stored tensor's name (transformers'
    renamings, then each expert projection's stored name back to llm-compressor's), and a compressed-tensors
    target or ignore entry (a module name or a `re:` regex over module names) the same way, as text: the
    renamed part (Mixtral's `block_sparse_moe`) and an expert's stored projection name (`experts.N.w1`, its dots
    escaped or not) replaced by the model's."""

    def __init__(self, model_type: str):
        self._renamings = renamings(model_type)
        back = {stored: proj for proj, stored in expert_checkpoint_names(model_type).items()}
        self._back = back
        alternatives = "|".join(re.escape(s) for s in sorted(back))
        self._stored_layer = (
            re.compile(rf"(experts(?:\\?\.)\d+(?:\\?\.))({alternatives})(?=\\?\.|\$|$)") if back else None
        )
        # transformers' merges of tensors other than the routed experts (those the per-expert model holds one by
        # one), named literally (no wildcard): each (its sources, the model's tensor)
        self._merges = [
            (tuple(str(_literal(src)) for src in conv.sources), str(_literal(conv.targets[0])))
            for conv in conversions(model_type)
            if not conv.renaming
            and len(conv.targets) == 1
            and not any(conv.targets[0].endswith(fused) for fused in _FUSED)
            and all(_literal(p) is not None for p in (*conv.sources, conv.targets[0]))
        ]

    def _projections(self, name: str) -> str:
        if self._stored_layer is None:
            return name
        return self._stored_layer.sub(lambda m: m.group(1) + self._back[m.group(2)], name)

    def tensor(self, name: str) -> str:
        """A stored tensor's name as the per-expert model's parameter."""
        for src, tgt in self._renamings:
            name = re.sub(src, tgt, name)
        return self._projections(name)

    def merged(self, name: str) -> tuple[str, int, int] | None:
        """Where a stored tensor (by the model's names: `tensor`) is one of the sources transformers merges into one
        of the model's tensors on load: (the model's tensor, this source's place among them, how many there are);
        None for any other tensor."""
        for sources, target in self._merges:
            for i, src in enumerate(sources):
                if name.endswith(src) and name[: -len(src)][-1:] in ("", "."):
                    return name[: -len(src)] + target, i, len(sources)
        return None

    def sources(self, name: str) -> list[str]:
        """The stored tensors transformers merges into the model's tensor `name` on load (Kimi-Linear's conv1d: its
        q/k/v_conv1d), in order; [name] where it is stored as it is."""
        for sources, target in self._merges:
            if name.endswith(target) and name[: -len(target)][-1:] in ("", "."):
                return [name[: -len(target)] + src for src in sources]
        return [name]

    def target(self, target: str) -> str:
        """A compressed-tensors target or ignore entry over the checkpoint's module names, over the model's."""
        for src, tgt in self._renamings:
            target = target.replace(src.strip("."), tgt.strip("."))
        return self._projections(target)


def _literal(pattern: str) -> str | None:
    """A conversion's name pattern as the plain name it matches (its escaped dots read as dots), or None where it is
    a pattern of many names (a wildcard or another regex operator)."""
    plain = pattern.replace("\\.", ".")
    return None if re.search(r"[*+?\[\]()|^$\\]", plain) else plain
