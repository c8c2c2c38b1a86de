"""The shipped chat calibration set (builtin:jargon-chat) and the calibration-effect benchmark's table (issue 46)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from convert.test_calibration import TEMPLATE

from quantize.convert.calibration import build_calibration, check_calibration, source_path
from quantize.convert.recipe import Calibration
from quantize.errors import UsageError
from quantize.golden.sources import jargon_split

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("calibration_effect", ROOT / "benchmarks" / "calibration_effect.py")
effect = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(effect)

CHAT = "builtin:jargon-chat"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "quantize" / "data" / name).read_text(encoding="utf-8").splitlines()]


def test_the_chat_set_is_a_chat_source_checked_before_load(tiny_model):
    """Read as conversations: a checkpoint without a chat template is refused by the pre-load check."""
    path, _ = source_path(CHAT)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(UsageError, match="chat template"):
        check_calibration(Calibration(source=CHAT, samples=2, seq_len=32), tiny_model)


def test_the_chat_set_loads_through_the_calibration_reader(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(tmp_path))
    cal = Calibration(source=CHAT, samples=4, seq_len=64)
    check_calibration(cal, tmp_path)  # passes with a template
    got = build_calibration(tok, cal)
    assert tuple(got.input_ids.shape) == (4, 64)
    [src] = got.record.sources
    assert (src.kind, src.field) == ("chat", "messages")
    assert got.record.chat_template_share is not None and got.record.chat_template_share > 0
    mixed = Calibration(
        mixture=[{"source": "builtin:jargon", "weight": 1}, {"source": CHAT, "weight": 1}], samples=4, seq_len=64
    )
    assert [s.kind for s in build_calibration(tok, mixed).record.sources] == ["text", "chat"]


def test_the_chat_set_holds_only_calibration_split_entries():
    """No held-out Jargon entry (the golden set's cloze and prose text) is in a conversation."""
    heldout = {r["headword"] for r in rows("jargon-heldout.jsonl")}
    calibration = {r["headword"] for r in rows("jargon-calibration.jsonl")}
    used = [h for r in rows("jargon-chat.jsonl") for h in r["headwords"]]
    assert len(used) == len(set(used)) and len(used) >= 300
    assert set(used) <= calibration and not set(used) & heldout
    assert all(jargon_split(h) == "calibration" for h in used)


def test_the_shipped_chat_set_is_what_the_generator_writes(tmp_path):
    """Rebuilt from the shipped text with its seed, byte for byte (the generator also drops any entry sharing 13
    words with a golden item)."""
    out = tmp_path / "chat.jsonl"
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_chat_calibration.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    counts = json.loads(r.stdout)
    assert counts["conversations"] == 300 and counts["heldout"] == 0
    assert out.read_bytes() == (ROOT / "quantize" / "data" / "jargon-chat.jsonl").read_bytes()


def test_the_recipe_of_a_cell_changes_only_its_calibration_source():
    base = effect.recipe_for("awq-builtin")
    chat, mixture = effect.recipe_for("awq-chat"), effect.recipe_for("awq-mixture")
    assert chat["calibration"] == {**base["calibration"], "source": CHAT}
    assert "source" not in mixture["calibration"] and len(mixture["calibration"]["mixture"]) == 2
    assert {k: v for k, v in chat.items() if k not in ("calibration", "name")} == {
        k: v for k, v in base.items() if k not in ("calibration", "name")
    }
    assert base["calibration"]["samples"] == 8 and base["calibration"]["overlap_with"] == "golden/core/v2"


def _run(template_share: float | None) -> dict:
    return {
        "calibration": {
            "source": "builtin:jargon-chat",
            "samples": 8,
            "seq_len": 128,
            "tokens": 1024,
            "documents_used": 7,
            "token_sha256": "ab" * 32,
            "chat_template_share": template_share,
            "overlap": {"distinct_share": 0.5, "token_share": 0.875},
        },
        "bits": {"bits_per_weight": 6.745},
    }


def _verdict(kl: tuple[float, float, float], kv: str) -> dict:
    ev = dict(zip(("value", "lower_bound", "upper_bound"), kl, strict=True))
    return {
        "verdict": "rejected",
        "sequential": {"items_scored": {"core_kv": 250, "core_facts": 615}},
        "rules": [
            {"kind": "agreement", "metric": "kl", "verdict": "pass", "evidence": ev},
            {
                "kind": "accuracy",
                "task": "core_kv",
                "verdict": kv,
                "look": 1,
                "evidence": {"delta": -0.052, "lower_bound": -0.081, "upper_bound": -0.023},
            },
            {
                "kind": "perplexity",
                "task": "core_prose",
                "verdict": "inconclusive",
                "evidence": {"ratio": 1.1, "lower_bound": 1.05, "upper_bound": 1.3},
            },
            {
                "kind": "untested",
                "rule": "core_facts acc",
                "task": "core_facts",
                "verdict": "untested",
                "reason": "stopped",
            },
        ],
    }


def test_the_table_is_built_from_the_saved_json():
    cells = [
        effect.collect("awq-chat", _run(0.125), _verdict((0.12, 0.10, 0.14), "regression")),
        effect.collect("awq-builtin", _run(None), _verdict((0.13, 0.11, 0.15), "pass")),
        effect.collect("gptq-chat", _run(None), _verdict((0.50, 0.45, 0.55), "pass")),
        effect.collect("gptq-mixture", _run(None), _verdict((0.30, 0.25, 0.35), "pass")),
    ]
    cells = json.loads(json.dumps(cells))  # as read back from benchmarks/results/calibration_effect.json
    head, rule, first, second, *_ = effect.table(cells)
    assert head.count("|") == rule.count("|") == first.count("|")
    assert first == (
        "| AWQ | chat | 1,024 (7) | 12.5% | 50.0% / 87.5% | 6.745 | 0.120 [0.100, 0.140] | untested | untested | "
        "untested | untested | -5.2 [-8.1, -2.3] regr. | 1.100 [1.050, 1.300] inc. | **rejected** (865) |"
    )
    assert "| - |" in second and "-5.2 [-8.1, -2.3] |" in second  # no template share; a passing rule unmarked
    notes = effect.noise(cells)
    assert "- AWQ, KL (chat, builtin): bounds overlap: within noise" in notes
    assert "- GPTQ, KL (chat, mixture): bounds do not overlap for chat vs mixture" in notes
    assert not any("facts" in n for n in notes)  # never measured: no comparison


def test_a_cell_converted_but_not_gated_shows_its_calibration_only():
    [head, _, row] = effect.table([effect.collect("gptq-builtin", _run(None), None)])
    assert row.count("|") == head.count("|")
    assert row.startswith("| GPTQ | builtin | 1,024 (7) | - | 50.0% / 87.5% | 6.745 | - |")
    assert row.endswith("| - | not gated |") and "untested" not in row
    [*_, row] = effect.table([effect.collect("gptq-builtin", {**_run(None), "bits": None}, None)])
    assert "| 50.0% / 87.5% | - |" in row and row.endswith("| not converted |")


def test_the_docs_section_is_replaced_in_place(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\n## A\n\na\n\n## Calibration's effect\n\nold\n\n## B\n\nb\n")
    effect.update_docs(doc, "new")
    assert doc.read_text() == "# R\n\n## A\n\na\n\n## Calibration's effect\n\nnew\n\n## B\n\nb\n"
    effect.update_docs(doc, "newer")
    assert doc.read_text().count("## Calibration's effect") == 1 and "newer" in doc.read_text()
