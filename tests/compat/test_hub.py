"""quantize/compat/hub.py: the Hub's libraries' offline constants, as golden_freeze sets them for a call."""

from __future__ import annotations

import datasets.config
import huggingface_hub.constants as hub_constants

from quantize.compat import hub


def test_the_offline_constants_hold_on_the_pinned_versions():
    """Fails loudly when an upgrade renames the constants or stops reading them: read quantize/compat/hub.py, check
    the new versions, then widen CHECKED."""
    assert hub.problems() == []


def test_another_version_and_a_constant_that_moved_are_found(monkeypatch):
    monkeypatch.setattr(hub, "version", lambda _name: "9.0.0")
    assert any("outside the checked range" in p for p in hub.problems())
    monkeypatch.delattr(datasets.config, "HF_HUB_OFFLINE")
    assert any("datasets.config.HF_HUB_OFFLINE" in p for p in hub.problems())


def test_offline_sets_both_for_the_block_only_unless_the_environment_says(monkeypatch):
    for var in hub.VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with hub.offline() as off:
        assert off and hub_constants.is_offline_mode() and datasets.config.HF_HUB_OFFLINE
    assert not hub_constants.HF_HUB_OFFLINE and not datasets.config.HF_HUB_OFFLINE
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")  # the caller's word: datasets read it at import
    with hub.offline() as off:
        assert not off and not hub_constants.HF_HUB_OFFLINE
