"""compressed-tensors' target matching, copied without torch (checked on 0.19.0 by compressed_tensors.problems()).

`utils.match.match_name(name, target)` and `match_targets(name, module, targets)` are public: a target names a
module exactly, or is a `re:` pattern `re.match`ed against the name (from its start); of the targets that match a
module, the scheme applied is the first of exact names (sorted), then patterns (sorted), then class names.
`first_target` is that rule for a name alone (no class: the accounting reads headers, not modules). A copy, in a
module of its own, because importing `compressed_tensors.utils.match` imports torch (85 s and 500 MB measured on a
loaded 2-core machine), where `quantize inspect`, the report and cost answer from headers in milliseconds and the
layering test holds them to importing no torch (tests/test_layers.py); compressed_tensors.problems() compares it
with the library on TARGET_CASES, so a change upstream fails tests/compat.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# (module name, targets): which target compressed-tensors applies, checked against the library by problems()
TARGET_CASES = (
    ("model.layers.0.mlp.down_proj", ("re:.*mlp.*", "re:.*down_proj", "model.layers.0.mlp.down_proj")),
    ("model.layers.1.mlp.down_proj", ("re:.*mlp.*", "re:.*down_proj", "model.layers.0.mlp.down_proj")),
    ("model.layers.1.self_attn.q_proj", ("re:.*mlp.*", "re:.*down_proj", "Linear")),
    ("model.layers.1.mlp.up_proj", ("re:.*up_proj$", "re:model.layers.1.*", "model.layers.10.mlp.up_proj")),
    ("lm_head", ("re:.*head", "lm", "re:head")),  # re.match anchors at the start only
)


def match_name(name: str, target: str) -> bool:
    """compressed-tensors' `match_name` without torch: `target` is `name`, or a `re:` pattern matching its start."""
    return re.match(target.removeprefix("re:"), name) is not None if target.startswith("re:") else target == name


def first_target(name: str, targets: Iterable[str]) -> str | None:
    """The target whose scheme compressed-tensors applies to module `name` (`match_targets`' first, class names
    aside): exact names before `re:` patterns, each in sorted order; None where none matches."""
    return next((t for t in sorted(targets, key=lambda t: ("re:" in t, t)) if match_name(name, t)), None)
