"""The Hub's libraries' offline switch (checked on huggingface_hub 1.x and datasets 5.x): each reads its variables
once, when first imported, into a module constant its calls consult from then on: `huggingface_hub.constants.
HF_HUB_OFFLINE` (from HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE; `is_offline_mode()` returns it) and `datasets.config.
HF_HUB_OFFLINE` (from HF_DATASETS_OFFLINE, else huggingface_hub's; `load_dataset` reads it when called). A variable
set after the import changes nothing, so a library call cannot go offline by setting one (nor should it set a
process's variables): `offline()` sets the two constants for a block instead and restores them after it.

`problems()` lists every guarded assumption that does not hold in the installed versions (tests/compat fails on
any).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from importlib.metadata import version

from quantize.compat import outside

CHECKED = {"huggingface_hub": ((1, 0), (2, 0)), "datasets": ((5, 0), (6, 0))}  # [from, to) of each
# The variables a caller (the CLI, before any import: cli._offline) says offline or online with: where any is set,
# the libraries do as it says and `offline()` leaves them alone
VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def problems() -> list[str]:
    """What no longer holds: a version outside CHECKED, a constant missing or not a bool, is_offline_mode not
    reading the constant."""
    import datasets.config
    import huggingface_hub.constants as hub

    found = [why for name, checked in CHECKED.items() if (why := outside(name, version(name), checked))]
    for module, name in ((hub, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE")):
        if not isinstance(getattr(module, name, None), bool):
            found.append(f"{module.__name__}.{name} is no longer a bool constant (offline() sets it)")
    before = hub.HF_HUB_OFFLINE
    try:
        hub.HF_HUB_OFFLINE = not before
        if hub.is_offline_mode() is before:
            found.append("huggingface_hub.constants.is_offline_mode() no longer returns HF_HUB_OFFLINE")
    finally:
        hub.HF_HUB_OFFLINE = before
    return found


@contextlib.contextmanager
def offline() -> Iterator[bool]:
    """huggingface_hub and datasets offline inside the block, unless the environment says either way (VARIABLES:
    then as it says). Yields whether datasets reads the Hub's datasets offline (from its cache only)."""
    import datasets.config
    import huggingface_hub.constants as hub

    if any(v in os.environ for v in VARIABLES):
        yield bool(datasets.config.HF_HUB_OFFLINE)
        return
    before = hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield True
    finally:
        hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = before
