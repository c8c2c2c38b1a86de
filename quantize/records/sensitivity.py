"""A sensitivity cache entry ($QUANTIZE_CACHE/search/sensitivity-*.json), written by `quantize search`: each
layer group's damage per option, keyed by what changes it (evaluate/cache.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from quantize.records.base import Record


class SensitivityRecord(Record):
    """$QUANTIZE_CACHE/search/sensitivity-*.json: each layer group's damage per option, keyed by what changes it."""

    WHAT: ClassVar[str] = "sensitivity cache entry"
    REGENERATE: ClassVar[str] = "delete it; the next `quantize search` measures again"

    schema_version: Literal[1] = 1
    key: str
    kl: dict[str, dict[str, float]]  # layer group -> option -> mean KL with it alone quantized so
    seconds: float
