"""The golden-set builder (determinism on a small fixture source), the manifest check (a tampered
byte is caught), and the task YAMLs loading in lm-eval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantize.cli import main
from quantize.compat.lm_eval import sandboxed_metrics
from quantize.errors import UsageError
from quantize.golden.build import Sizes, build_core
from quantize.golden.manifest import lm_eval_tasks, read_items, verify

from conftest import ROOT, make_sources

SMALL = Sizes(facts=30, cloze=20, analogy=6, kv=9, prose=5, smoke=3)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden")
    src = make_sources(base / "src")
    build_core(src, base / "v1", seed=7, sizes=SMALL)
    return src, base / "v1"


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rebuild_is_byte_identical(built, tmp_path):
    src, v1 = built
    build_core(src, tmp_path / "v1", seed=7, sizes=SMALL)
    assert tree_bytes(tmp_path / "v1") == tree_bytes(v1)


def test_another_seed_changes_items(built, tmp_path):
    src, v1 = built
    build_core(src, tmp_path / "v1", seed=8, sizes=SMALL)
    assert (tmp_path / "v1" / "data" / "facts.jsonl").read_bytes() != (v1 / "data" / "facts.jsonl").read_bytes()


def test_items_have_id_and_cluster_and_valid_answers(built):
    _, v1 = built
    g = verify(v1)
    assert g.tasks == ["core_analogy", "core_cloze", "core_facts", "core_kv", "core_prose"]
    for task in g.tasks:
        items = read_items(g, task)
        assert items and len({it["id"] for it in items}) == len(items)
        assert all(it["cluster"] for it in items)
    for it in read_items(g, "core_facts"):
        assert len(set(it["choices"])) == 4 and 0 <= it["answer"] < 4
    assert "\b" not in (v1 / "data" / "facts.jsonl").read_text()
    young_fox = [it for it in read_items(g, "core_facts") if "young fox" in it["question"]]
    for it in young_fox:  # "kitten" is right for a fox too, so it is never a distractor there
        assert it["choices"][it["answer"]] == "kitten"


def test_quiz_syntax_is_expanded(built):
    from quantize.golden.sources import quiz_rows

    rows = {r[0][0]: r for r in quiz_rows(built[0] / "x" / "usr/share/games/bsdgames/quiz/america")}
    assert rows["Colombia"][1][0] == "Bogota"  # overstruck accent dropped
    state = {r[0][0]: r for r in quiz_rows(built[0] / "x" / "usr/share/games/bsdgames/quiz/state")}
    assert state["Alaska"][3][0] == "forget-me-not" and state["Alabama"][0][1] == {"alabama", "al"}


def test_cloze_and_prose_never_share_a_document(built):
    g = verify(built[1])
    assert not {it["cluster"] for it in read_items(g, "core_cloze")} & {
        it["cluster"] for it in read_items(g, "core_prose")
    }


def test_tampered_byte_is_caught(built, tmp_path):
    _, v1 = built
    copy = tmp_path / "v1"
    for name, blob in tree_bytes(v1).items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes(blob)
    data = bytearray((copy / "data" / "kv.jsonl").read_bytes())
    data[10] ^= 1
    (copy / "data" / "kv.jsonl").write_bytes(bytes(data))
    with pytest.raises(UsageError, match="data/kv.jsonl: sha256 differs"):
        verify(copy)


def test_unlisted_and_missing_files_are_caught(built, tmp_path):
    _, v1 = built
    copy = tmp_path / "v1"
    for name, blob in tree_bytes(v1).items():
        if name != "data/prose.jsonl":
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(blob)
    (copy / "data" / "extra.jsonl").write_text("{}\n")
    with pytest.raises(UsageError) as e:
        verify(copy)
    assert "data/prose.jsonl: listed in the manifest but missing" in str(e.value)
    assert "data/extra.jsonl: not listed" in str(e.value)


def test_cli_verify_exit_codes(built, tmp_path, capsys):
    assert main(["golden", "verify", str(built[1])]) == 0
    assert main(["golden", "verify", str(tmp_path)]) == 2
    assert "no MANIFEST.json" in capsys.readouterr().err


def test_builder_refuses_to_overwrite_a_version(built):
    from quantize.golden.build import main as build_main

    assert build_main(["--sources", str(built[0]), "--out", str(built[1])]) == 2


def test_builder_refuses_a_task_its_sources_give_no_items(tmp_path, capsys):
    """v3 takes v2's sizes: 200 prose documents take every document of the small sources, leaving none for cloze,
    whose data file was written empty (and verified)."""
    src = make_sources(tmp_path / "src")
    out = tmp_path / "core" / "v3"
    assert main(["golden", "build", str(out), "--sources", str(src)]) == 2
    err = capsys.readouterr().err
    assert "task core_cloze would hold no items" in err and "usr/share/doc/jargon-text/jargon.txt.gz" in err
    assert not out.parent.exists()  # refused before anything was written


def test_task_yamls_load_in_lm_eval(built, tmp_path):
    from lm_eval.tasks import TaskManager

    g = verify(built[1])
    inc = lm_eval_tasks(g, tmp_path / "tasks", g.manifest.smoke_ids, sandboxed_metrics())
    tm = TaskManager(include_path=str(inc), include_defaults=False)
    assert {"core", *g.tasks} <= set(tm.all_tasks)
    tasks = tm.load_task_or_group(g.tasks)
    for name, task in tasks.items():
        docs = list(task.test_docs())
        assert len(docs) == len(g.manifest.smoke_ids[name]) > 0
        assert task.config.metadata["version"] == 1.0


def test_shipped_golden_core_v1_verifies():
    g = verify(ROOT / "golden" / "core" / "v1")
    assert g.manifest.version == "v1" and len(g.tasks) == 5


def test_a_data_file_rewritten_with_its_mtime_kept_is_read_as_its_new_items(built, tiny_model, tmp_path, monkeypatch):
    """lm-eval loads a golden set's data through HF datasets, whose cache knows a local file by its path and mtime
    alone: a target rewritten in place with the mtime kept and the manifest resealed was scored as the old target
    under the new manifest's key (a review's repro: -8.1348 where the new text gives -8.0111). lm-eval now reads a
    copy named by the manifest's sha256 (manifest.addressed), so another content is another path."""
    import hashlib
    import json
    import os
    import shutil

    from quantize import api

    from conftest import suite_file

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
    golden = shutil.copytree(built[1], tmp_path / "g" / "golden" / "v1")
    suite = suite_file(tmp_path / "s.yaml", golden, extra="tasks: [core_kv]\n")
    first = {i.id: i.ll for i in api.scored(suite, tiny_model).doc.tasks["core_kv"].items}
    data = golden / "data" / "kv.jsonl"
    st = data.stat()
    lines = data.read_text().splitlines()
    item = json.loads(lines[0])
    item["target"] = " a completely different answer"
    lines[0] = json.dumps(item, sort_keys=True)
    data.write_text("\n".join(lines) + "\n")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back
    manifest = json.loads((golden / "MANIFEST.json").read_text())
    manifest["files"]["data/kv.jsonl"]["sha256"] = hashlib.sha256(data.read_bytes()).hexdigest()
    (golden / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    second = {i.id: i.ll for i in api.scored(suite, tiny_model).doc.tasks["core_kv"].items}
    assert second[item["id"]] != first[item["id"]]
    assert all(second[i] == first[i] for i in first if i != item["id"])


def test_a_subsets_data_is_one_path_per_content(built, tmp_path, monkeypatch):
    """A smoke subset was written to a fresh temporary path each run, so HF datasets' cache (keyed by path and mtime)
    grew by one entry a run; it is named by its bytes now: the same subset one path, another subset another."""
    import yaml

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
    golden = verify(built[1])

    def data(into: Path, ids: dict[str, list[str]]) -> str:
        lm_eval_tasks(golden, into, ids, sandboxed_metrics())
        return yaml.safe_load((into / "core_kv.yaml").read_text())["dataset_kwargs"]["data_files"]["test"]

    kv = [json.loads(line)["id"] for line in (built[1] / "data" / "kv.jsonl").read_text().splitlines()]
    one, again = data(tmp_path / "a", {"core_kv": kv[:2]}), data(tmp_path / "b", {"core_kv": kv[:2]})
    other = data(tmp_path / "c", {"core_kv": kv[1:3]})
    assert one == again != other and Path(one).is_relative_to(tmp_path / "qcache")
    assert len(Path(one).read_text().splitlines()) == 2


def _resealed(root: Path, name: str, text: str) -> None:
    """Write a source file and record its sha256, as a fetch of another file would."""
    import hashlib
    import json

    (root / "x" / name).write_text(text)
    meta = json.loads((root / "sources.json").read_text())
    for s in meta.values():
        if name in s["sha256"]:
            s["sha256"][name] = hashlib.sha256(text.encode()).hexdigest()
    (root / "sources.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "change,says",
    [
        (lambda m: [m], "holds a JSON list"),
        (lambda m: {**m, "devil": "x"}, "source 'devil' lists no `files`"),
        (lambda m: {k: v for k, v in m.items() if k != "devil"}, "names no source devil"),
        (lambda m: {k: {**v, "sha256": {}} for k, v in m.items()}, "has no sha256: nothing would check"),
        (lambda m: {**m, "quiz": {**m["quiz"], "files": m["quiz"]["files"][:1]}}, "records no sha256 for"),
        (
            lambda m: {**m, "extra": {"files": ["../x"], "sha256": {"../x": "0" * 64}}},
            "a path outside the sources folder",
        ),
    ],
    ids=["list", "string-source", "missing-source", "empty-sha256", "quiz-unrecorded", "outside"],
)
def test_a_sources_record_that_is_not_fetch_sources_is_exit_2(tmp_path, capsys, change, says):
    """A list, a string value or a missing source ended in exit 3 (AttributeError, TypeError, KeyError); empty
    sha256 maps built from files nothing checked, exit 0 (a review)."""
    import json

    from quantize.cli import main

    root = make_sources(tmp_path / "src")
    meta = json.loads((root / "sources.json").read_text())
    new = change(meta)
    if isinstance(new, dict) and "quiz" in new and new["quiz"] is not meta["quiz"]:
        new["quiz"]["sha256"] = {f: meta["quiz"]["sha256"][f] for f in new["quiz"]["files"]}
    (root / "sources.json").write_text(json.dumps(new))
    assert main(["golden", "build", str(tmp_path / "out" / "core" / "v9"), "--sources", str(root)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name,text,says",
    [
        ("gensim/questions-words.txt", ": s\na b c\n", "line 2: 'a b c' is not four words"),
        ("gensim/questions-words.txt", "a b c d\n", "line 1: 'a b c d' is not four words"),
        ("usr/share/wordnet/index.noun", "word n many 1\n", "line 1: 'word n many 1' is not an index.noun line"),
    ],
)
def test_a_source_file_of_another_shape_is_exit_2_naming_its_line(tmp_path, capsys, name, text, says):
    from quantize.cli import main

    root = make_sources(tmp_path / "src")
    _resealed(root, name, text)
    assert main(["golden", "build", str(tmp_path / "out" / "core" / "v9"), "--sources", str(root)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says in err and "Traceback" not in err, err
