"""`quantize golden export SUITE OUT` (quantize/golden/export.py): a suite's golden tasks as a standalone lm-eval
task folder that lm-eval itself loads (its own TaskManager, no quantize code between), with the suite's tasks and
items (its smoke subset), the data inside OUT, written atomically, and the lm-eval command lines printed with the
suite's seed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from quantize.cli import main
from quantize.compat.lm_eval import sandboxed_metrics
from quantize.evaluate.suite import open_suite
from quantize.golden.manifest import lm_eval_tasks, read_items

from conftest import ROOT, small_golden, suite_file


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    golden = small_golden(base)
    full = suite_file(base / "full.yaml", golden, extra="seed: 7\nmax_length: 256\n")
    smoke = suite_file(base / "smoke.yaml", golden, extra="subset: smoke\ntasks: [core_facts, core_prose]\n")
    return base, golden, full, smoke


def exported(suite: Path, out: Path, capsys, *extra: str) -> str:
    assert main(["golden", "export", str(suite), str(out), *extra]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def lm_eval_docs(out: Path, tasks: list[str]) -> dict[str, list[dict]]:
    """Each task's test documents as lm-eval itself loads the exported folder."""
    from lm_eval.tasks import TaskManager, get_task_dict

    tm = TaskManager(include_path=str(out), include_defaults=False)
    found = get_task_dict(tasks, tm)
    return {name: list(task.test_docs()) for name, task in found.items()}


def test_lm_eval_loads_the_export_with_the_suites_tasks_and_items(world, tmp_path, capsys):
    _, _, full, _ = world
    out = tmp_path / "tasks"
    text = exported(full, out, capsys)
    suite = open_suite(full)
    docs = lm_eval_docs(out, suite.tasks)
    assert sorted(docs) == sorted(suite.tasks)
    for task in suite.tasks:
        ids = [str(i["id"]) for i in read_items(suite.golden, task)]
        assert [str(d["id"]) for d in docs[task]] == ids, task  # every item, in the golden set's order
        assert f"{task} ({len(ids)} items)" in text
    # the command a user runs: the suite's tasks, its seed for all four of lm-eval's, samples kept, the suite's window
    assert f"--include_path {out} --tasks {','.join(suite.tasks)} --log_samples --output_path RESULTS --seed 7" in text
    assert "lm_eval --model vllm --model_args pretrained=MODEL,max_length=256 " in text
    assert "--model local-completions --model_args base_url=http://HOST:PORT/v1/completions,model=NAME," in text


def test_the_smoke_subset_and_the_suites_tasks_are_honoured(world, tmp_path, capsys):
    _, _, _, smoke = world
    out = tmp_path / "smoke"
    text = exported(smoke, out, capsys)
    suite = open_suite(smoke)
    docs = lm_eval_docs(out, ["core_facts", "core_prose"])
    for task in ("core_facts", "core_prose"):
        assert sorted(str(d["id"]) for d in docs[task]) == sorted(suite.golden.manifest.smoke_ids[task])
    assert "--tasks core_facts,core_prose " in text and "the smoke subset" in text


def test_the_yamls_are_lm_eval_tasks_own_with_the_data_inside_out(world, tmp_path, capsys):
    """The same YAMLs scoring writes (manifest.lm_eval_tasks), but every data file copied into OUT/data and named
    by its absolute path there: the folder stands alone once the golden set is gone."""
    _, golden, full, _ = world
    out = tmp_path / "tasks"
    exported(full, out, capsys)
    ours = lm_eval_tasks(open_suite(full).golden, tmp_path / "ours", None, sandboxed_metrics())
    for theirs in sorted(ours.glob("*.yaml")):
        a, b = yaml.safe_load(theirs.read_text()), yaml.safe_load((out / theirs.name).read_text())
        files = (b.get("dataset_kwargs") or {}).get("data_files") or {}
        for split, path in files.items():
            assert Path(path).is_absolute() and Path(path).parent == out.resolve() / "data"
            assert Path(path).read_bytes() == Path(a["dataset_kwargs"]["data_files"][split]).read_bytes()
            a["dataset_kwargs"]["data_files"][split] = path
        assert a == b
    moved = shutil.copytree(golden, tmp_path / "golden-moved")
    shutil.rmtree(golden)
    try:
        assert len(lm_eval_docs(out, ["core_facts"])["core_facts"]) == 24
    finally:
        shutil.move(moved, golden)


def test_the_repositorys_smoke_suite_exports(tmp_path, capsys):
    out = tmp_path / "smoke"
    text = exported(ROOT / "evaluate" / "smoke.yaml", out, capsys)
    suite = open_suite(ROOT / "evaluate" / "smoke.yaml")
    docs = lm_eval_docs(out, suite.tasks)
    assert {t: len(d) for t, d in docs.items()} == {t: len(suite.golden.manifest.smoke_ids[t]) for t in suite.tasks}
    assert "--seed 0" in text


def test_an_existing_out_is_refused_and_force_replaces_only_an_export(world, tmp_path, capsys):
    _, _, full, smoke = world
    out = tmp_path / "tasks"
    exported(full, out, capsys)
    assert main(["golden", "export", str(smoke), str(out)]) == 2
    assert "exists" in capsys.readouterr().err and len(list((out / "data").iterdir())) == 5  # untouched
    exported(smoke, out, capsys, "--force")
    assert len((out / "data" / "core_facts.test.jsonl").read_text().splitlines()) == 3  # the smoke subset's now
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["golden", "export", str(smoke), str(mine), "--force"]) == 2
    assert "no export record" in capsys.readouterr().err and (mine / "notes.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left beside


def test_force_replaces_no_folder_of_the_users_own_yaml_files(world, tmp_path, capsys):
    """A folder of recipes (YAMLs only) looked like an export to the earlier rule, and `--force` deleted it (a
    review). Only a folder holding exactly what its export record lists, unchanged, is replaced."""
    _, _, full, smoke = world
    mine = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", mine)
    before = sorted(p.name for p in mine.iterdir())
    assert main(["golden", "export", str(smoke), str(mine), "--force"]) == 2
    assert "no export record" in " ".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in mine.iterdir()) == before
    out = tmp_path / "tasks"
    exported(full, out, capsys)
    edited = next(out.glob("*.yaml"))
    edited.write_text(edited.read_text() + "# my note\n")
    assert main(["golden", "export", str(smoke), str(out), "--force"]) == 2  # an export the user edited since
    assert "is not the file its export wrote" in capsys.readouterr().err and "# my note" in edited.read_text()
    (out / "extra.yaml").write_text("task: mine\n")
    edited.write_text(edited.read_text().replace("# my note\n", ""))
    assert main(["golden", "export", str(smoke), str(out), "--force"]) == 2
    assert "extra.yaml, which its export did not write" in " ".join(capsys.readouterr().err.split())
    (out / "extra.yaml").unlink()
    record = out / "quantize-export.json"
    kept = record.read_text()
    forged = json.loads(kept)
    forged["files"]["../outside.yaml"] = forged["files"].pop(edited.name)
    record.write_text(json.dumps(forged))
    assert main(["golden", "export", str(smoke), str(out), "--force"]) == 2  # a record naming a path out of the folder
    assert "no export record" in capsys.readouterr().err
    record.write_text(kept)
    exported(smoke, out, capsys, "--force")  # the export as written: replaced
    assert len((out / "data" / "core_facts.test.jsonl").read_text().splitlines()) == 3


def test_a_bad_suite_is_exit_2_before_anything_is_written(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("golden: nowhere/v1\n")
    assert main(["golden", "export", str(bad), str(tmp_path / "out")]) == 2
    assert "MANIFEST" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("inside", ["x", "deep/er/x", "."])
def test_an_export_inside_a_golden_set_version_is_refused(world, tmp_path, capsys, inside):
    """A version is immutable: `golden export suite.yaml golden/v1/x` wrote into it (a review), at any depth."""
    _, golden, _, _ = world
    mine = tmp_path / "golden" / "v1"
    shutil.copytree(golden, mine)
    suite = suite_file(tmp_path / "suite.yaml", mine)
    before = sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*"))
    assert main(["golden", "export", str(suite), str(mine / inside), "--force"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"inside the golden-set version {mine.resolve()}" in err and "MANIFEST.json" in err
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == before
    assert main(["golden", "verify", str(mine)]) == 0
