"""`golden verify` checks the items, not only the hashes (quantize/golden/items.py): a MANIFEST re-sealed over an
edited file (its sha256 and item count rewritten, as anyone who edits a set can do) still fails on a line that
is not JSON, an answer past its choices, a duplicate id, a malformed or dangling few-shot pin, or a file that
leads outside the set; every problem is exit 2 naming the file and the line. Hashing streams: verify's memory
does not grow with a data file's size."""

from __future__ import annotations

import json
import shutil
import tracemalloc
import unicodedata
from pathlib import Path

import pytest

from quantize.cli import main
from quantize.errors import UsageError
from quantize.golden.manifest import verify
from quantize.io import sha256_bytes

from conftest import ROOT


def copy_set(tmp_path: Path, name: str) -> Path:
    root = tmp_path / "golden" / name.replace("/", "_")
    shutil.copytree(ROOT / "golden" / name, root, symlinks=True)
    return root


def reseal(root: Path) -> None:
    """Rewrite the MANIFEST's sha256 and item counts to the files as they are now (what verify used to trust)."""
    m = json.loads((root / "MANIFEST.json").read_text())
    for name, entry in m["files"].items():
        blob = (root / name).read_bytes()
        entry["sha256"] = sha256_bytes(blob)
        if entry["items"] is not None:
            entry["items"] = blob.count(b"\n")
    (root / "MANIFEST.json").write_text(json.dumps(m, indent=2))


def edit_line(root: Path, name: str, n: int, change) -> None:
    """Replace line n (from 1) of a data file by change(its object) (a str is written as it is)."""
    path = root / name
    lines = path.read_text(encoding="utf-8").splitlines()
    new = change(json.loads(lines[n - 1]))
    lines[n - 1] = new if isinstance(new, str) else json.dumps(new, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    reseal(root)


def refused(root: Path, capsys, *expected: str) -> str:
    assert main(["golden", "verify", str(root)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for e in expected:
        assert e in err, err
    return err


def test_every_shipped_set_verifies_with_its_items_checked():
    for manifest in sorted((ROOT / "golden").glob("*/v*/MANIFEST.json")):
        verify(manifest.parent)


def test_a_resealed_line_that_is_not_json_is_named(tmp_path, capsys):
    root = copy_set(tmp_path, "std/v1")
    edit_line(root, "data/hellaswag.jsonl", 3, lambda d: '{"golden_id": "x", ')
    refused(root, capsys, "data/hellaswag.jsonl line 3: not JSON")


def test_a_line_that_is_json_but_no_object_is_named(tmp_path, capsys):
    root = copy_set(tmp_path, "core/v2")
    edit_line(root, "data/facts.jsonl", 5, lambda d: "[1, 2]")
    refused(root, capsys, "data/facts.jsonl line 5: a JSON list, not an object")


@pytest.mark.parametrize(
    "name,data,field,change",
    [
        # doc_to_target: a field name (answer), a template of a field ({{label}}), a template that computes the
        # index ({{choices.label.index(answerKey)}}): each answer set past its choices' end
        ("core/v2", "data/facts.jsonl", "answer", lambda d: {**d, "answer": len(d["choices"])}),
        ("std/v1", "data/hellaswag.jsonl", "{{label}}", lambda d: {**d, "label": str(len(d["choices"]))}),
        ("std/v1", "data/arc_easy.jsonl", "answerKey", lambda d: {**d, "answerKey": "Z"}),
        ("pydoc/v1", "data/pydoc_cloze.jsonl", "answer", lambda d: {**d, "answer": -1}),
    ],
    ids=["field", "template", "computed-index", "negative"],
)
def test_an_answer_outside_its_choices_is_named(tmp_path, capsys, name, data, field, change):
    root = copy_set(tmp_path, name)
    edit_line(root, data, 7, change)
    err = refused(root, capsys, f"{data} line 7: ", "doc_to_target")
    assert field in err


def test_choices_that_are_no_list_of_strings_are_named(tmp_path, capsys):
    root = copy_set(tmp_path, "core/v2")
    edit_line(root, "data/facts.jsonl", 2, lambda d: {**d, "choices": "a b c"})
    refused(root, capsys, "data/facts.jsonl line 2: doc_to_choice", "not a list of strings")


@pytest.mark.parametrize(
    "twin",
    [lambda i: i, lambda i: f" {i} ", lambda i: unicodedata.normalize("NFD", i)],
    ids=["same", "spaces", "nfd"],
)
def test_duplicate_ids_after_normalization_are_named(tmp_path, capsys, twin):
    root = copy_set(tmp_path, "core/v2")
    edit_line(root, "data/facts.jsonl", 1, lambda d: {**d, "id": "café-1"})
    edit_line(root, "data/facts.jsonl", 9, lambda d: {**d, "id": twin("café-1")})
    refused(root, capsys, "data/facts.jsonl line 9: id 'café-1' (field 'id') is already used on line 1")


def test_a_missing_id_is_named(tmp_path, capsys):
    root = copy_set(tmp_path, "std/v1")
    edit_line(root, "data/lambada_openai.jsonl", 4, lambda d: {k: v for k, v in d.items() if k != "golden_id"})
    refused(root, capsys, "data/lambada_openai.jsonl line 4: field 'golden_id' (the item's id) is null")


def test_a_malformed_fewshot_file_is_named(tmp_path, capsys):
    root = copy_set(tmp_path, "std/v1")
    edit_line(root, "data/gsm8k.fewshot.jsonl", 2, lambda d: "not json")
    refused(root, capsys, "data/gsm8k.fewshot.jsonl line 2: not JSON")


def test_a_fewshot_file_shorter_than_its_ids_is_named(tmp_path, capsys):
    root = copy_set(tmp_path, "std/v1")
    f = root / "data/gsm8k.fewshot.jsonl"
    f.write_text("".join(f.read_text().splitlines(keepends=True)[:-1]))
    reseal(root)
    refused(root, capsys, "data/gsm8k.fewshot.jsonl: 39 few-shot examples, but the manifest's fewshot_ids names 40")


@pytest.mark.parametrize("pin", ["gsm8k-fewshot-99999", "gsm8k-00001"], ids=["missing", "a-test-item"])
def test_a_pin_naming_no_fewshot_example_is_named(tmp_path, capsys, pin):
    root = copy_set(tmp_path, "std/v1")
    edit_line(root, "data/gsm8k.jsonl", 6, lambda d: {**d, "golden_shots": [*d["golden_shots"][:-1], pin]})
    refused(root, capsys, f"data/gsm8k.jsonl line 6: field 'golden_shots' names {pin!r}")


def test_pins_that_are_no_list_are_named(tmp_path, capsys):
    root = copy_set(tmp_path, "std/v1")
    edit_line(root, "data/gsm8k.jsonl", 2, lambda d: {**d, "golden_shots": "gsm8k-fewshot-00000"})
    refused(root, capsys, "data/gsm8k.jsonl line 2: field 'golden_shots' is ")


def test_a_pin_in_a_task_without_fewshot_is_named(tmp_path, capsys):
    root = copy_set(tmp_path, "core/v2")
    edit_line(root, "data/kv.jsonl", 3, lambda d: {**d, "golden_shots": ["kv-00001"]})
    refused(root, capsys, "data/kv.jsonl line 3: field 'golden_shots' pins few-shot examples")


def test_a_data_file_that_links_outside_the_set_is_refused(tmp_path, capsys):
    """The link's target has the very bytes the manifest lists: only the link check can catch it."""
    root = copy_set(tmp_path, "std/v1")
    outside = tmp_path / "elsewhere.jsonl"
    shutil.copy(root / "data/gsm8k.fewshot.jsonl", outside)
    (root / "data/gsm8k.fewshot.jsonl").unlink()
    (root / "data/gsm8k.fewshot.jsonl").symlink_to(outside)
    refused(root, capsys, "data/gsm8k.fewshot.jsonl: a link that leads outside the version folder")


def test_a_data_folder_that_links_outside_the_set_is_refused(tmp_path, capsys):
    root = copy_set(tmp_path, "core/v2")
    shutil.move(root / "data", tmp_path / "data-elsewhere")
    (root / "data").symlink_to(tmp_path / "data-elsewhere")
    refused(root, capsys, "data/facts.jsonl: a link that leads outside the version folder")


def test_a_fifo_in_the_set_is_refused_without_blocking(tmp_path, capsys):
    import os

    root = copy_set(tmp_path, "core/v2")
    (root / "data/kv.jsonl").unlink()
    os.mkfifo(root / "data/kv.jsonl")
    refused(root, capsys, "data/kv.jsonl: golden data file", "not a regular file")


def test_smoke_ids_must_name_items(tmp_path, capsys):
    root = copy_set(tmp_path, "core/v2")
    m = json.loads((root / "MANIFEST.json").read_text())
    m["smoke_ids"]["core_facts"][0] = "facts-99999"
    (root / "MANIFEST.json").write_text(json.dumps(m))
    refused(root, capsys, "smoke_ids of core_facts name 'facts-99999'")


def test_a_task_with_no_items_is_refused_by_verify_and_by_scoring(tmp_path, capsys):
    """A resealed empty data file verified, and a gate on it ended in lm-eval's StopIteration (exit 3)."""
    from quantize.evaluate.suite import open_suite

    from conftest import suite_file

    root = copy_set(tmp_path, "core/v2")
    (root / "data/kv.jsonl").write_bytes(b"")
    m = json.loads((root / "MANIFEST.json").read_text())
    m["smoke_ids"]["core_kv"] = []  # no smoke id left naming a missing item: the empty task alone is wrong
    (root / "MANIFEST.json").write_text(json.dumps(m))
    reseal(root)
    refused(root, capsys, "data/kv.jsonl: task core_kv holds no items")
    with pytest.raises(UsageError, match="task core_kv holds no items"):
        open_suite(suite_file(tmp_path / "suite.yaml", root))


def test_scoring_refuses_what_verify_refuses(tmp_path):
    """Scoring opens its suite through verify: a duplicate id is exit 2 before any model loads."""
    from quantize.evaluate.suite import open_suite

    from conftest import suite_file

    root = copy_set(tmp_path, "core/v2")
    edit_line(root, "data/facts.jsonl", 4, lambda d: {**d, "id": "facts-00000"})
    first = json.loads((root / "data/facts.jsonl").read_text().splitlines()[0])["id"]
    edit_line(root, "data/facts.jsonl", 1, lambda d: {**d, "id": first})
    with pytest.raises(UsageError, match="already used on line"):
        open_suite(suite_file(tmp_path / "suite.yaml", root))


def test_problems_per_file_are_capped_and_counted(tmp_path, capsys):
    root = copy_set(tmp_path, "core/v2")
    f = root / "data/facts.jsonl"
    f.write_text("".join("nope\n" for _ in range(10)) + f.read_text())
    reseal(root)
    err = refused(root, capsys, "data/facts.jsonl line 1: not JSON", "data/facts.jsonl: 7 more lines")
    assert "line 4:" not in err


def test_verify_streams_a_large_data_file(tmp_path):
    """A 48 MB data file is hashed and checked line by line: verify's peak Python memory stays a small fraction
    of the file (the old verify read it whole: over 48 MB)."""
    root = copy_set(tmp_path, "core/v2")
    prose = root / "data/prose.jsonl"
    first = json.loads(prose.read_text().splitlines()[0])
    text = "word " * 2_000  # 10 kB a line
    with prose.open("a") as fh:
        for i in range(4_800):
            fh.write(json.dumps({**first, "id": f"big-{i:05d}", "text": text}) + "\n")
    reseal(root)
    assert prose.stat().st_size > 48_000_000
    tracemalloc.start()
    try:
        verify(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak


def test_a_set_whose_config_shares_an_object_is_written_without_aliases(tmp_path):
    """A task config holding one list twice (as lm-eval's configs can) is written out twice: verify reads task
    YAMLs without aliases, so a set written with one would be refused."""
    from quantize.golden.version import TaskFiles, write_version

    until = ["\n\n", "</s>"]
    items = [{"id": f"i{i}", "prompt": f"p{i}", "answer": "a"} for i in range(3)]
    config = {
        "output_type": "generate_until",
        "doc_to_text": "prompt",
        "doc_to_target": "answer",
        "generation_kwargs": {"until": until},
        "stop_copy": until,
    }
    task = TaskFiles(name="shared", output_type="generate_until", items=items, config=config)
    write_version(tmp_path / "s" / "v1", [task], sources={}, builder={})
    assert "&id" not in (tmp_path / "s" / "v1" / "tasks" / "shared.yaml").read_text()
    verify(tmp_path / "s" / "v1")


def test_a_data_file_two_tasks_read_is_checked_as_each_reads_it(tmp_path, capsys):
    """Two tasks reading one data file, each by its own id field: the check kept one task per file (the last), so
    ids duplicated under the other task's field verified, and its gate paired 2 of 3 items (a review)."""
    root = tmp_path / "s" / "v1"
    shutil.copytree(ROOT / "tests" / "data" / "shared-file-golden" / "s" / "v1", root)
    refused(root, capsys, "id 'a' (field 'id') is already used on line 1", "(read as s_b's items)")
    edit_line(root, "data/s_greedy.jsonl", 2, lambda d: {**d, "id": "c"})
    assert main(["golden", "verify", str(root)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "change,says",
    [
        (lambda s: {**s, "core_cloze": []}, "smoke_ids of core_cloze is empty"),
        (lambda s: {**s, "core_nothing": ["x"]}, "smoke_ids names task core_nothing, which the set does not have"),
    ],
)
def test_a_smoke_subset_of_no_item_or_of_no_task_is_refused(tmp_path, capsys, change, says):
    """`smoke_ids: {core_cloze: []}` verified, then a smoke run stopped inside lm-eval, exit 3; a task the set does
    not have was accepted (a review)."""
    root = copy_set(tmp_path, "core/v1")
    m = json.loads((root / "MANIFEST.json").read_text())
    m["smoke_ids"] = change(m["smoke_ids"])
    (root / "MANIFEST.json").write_text(json.dumps(m, indent=2))
    refused(root, capsys, says)
