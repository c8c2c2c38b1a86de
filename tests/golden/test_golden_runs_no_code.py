"""A golden set is data: what lm-eval reads of it runs no code and is what verify hashed (a review's repros, each
on a copy of golden/answers/v1 edited and its MANIFEST resealed, as anyone who edits a set can do)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_verify_items import copy_set, reseal

from quantize.cli import main
from quantize.compat.lm_eval import sandboxed_metrics
from quantize.errors import UsageError
from quantize.golden.manifest import lm_eval_tasks, verify

from conftest import ROOT, suite_file

TASK = "tasks/answers_facts.yaml"


def edited(tmp_path: Path, change) -> Path:
    """A copy of golden/answers/v1 whose facts task YAML is change(its config), resealed: it verifies."""
    root = copy_set(tmp_path, "answers/v1")
    cfg = yaml.safe_load((root / TASK).read_text())
    change(cfg)
    (root / TASK).write_text(yaml.safe_dump(cfg, sort_keys=False))
    reseal(root)
    return root


def test_a_template_that_reaches_python_runs_nothing_and_is_exit_2(tmp_path):
    """lm-eval renders doc_to_text in a plain Jinja environment: `cycler.__init__.__globals__.os` ran a shell
    command as the set was scored (uid=0 in a marker file). Templates render sandboxed: nothing runs, and the
    set is named."""
    from quantize.evaluate.agreement import requests

    marker = tmp_path / "PWNED"
    attack = "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}{{ prompt }}"
    root = edited(tmp_path, lambda c: c.update(doc_to_text=attack))
    golden = verify(root)  # the hashes hold: the template is what runs
    with pytest.raises(UsageError, match="a task template tried to reach Python"):
        requests(golden, ["answers_facts"], 1)
    assert not marker.exists()


def test_a_metric_lm_eval_does_not_define_is_refused_before_lm_eval_imports_it(tmp_path):
    """An unregistered metric name (a path to a .py file) made lm-eval load it with HF evaluate, which imported
    and ran it."""
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil" / "evil.py"
    evil.parent.mkdir()
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    for metric in ({"metric": str(evil)}, {"metric": "exact_match", "hf_evaluate": True}):
        root = edited(tmp_path / metric["metric"].replace("/", "_"), lambda c, m=metric: c.update(metric_list=[m]))
        with pytest.raises(UsageError, match="is not one lm-eval defines"):
            lm_eval_tasks(verify(root), tmp_path / "include", None, sandboxed_metrics())
    assert not marker.exists()


def test_a_task_yaml_edited_after_verify_is_not_handed_to_lm_eval(tmp_path):
    """The YAMLs were read from disk again after verify: an edit in between was scored and cached under the
    verified manifest's sha."""
    root = copy_set(tmp_path, "answers/v1")
    golden = verify(root)
    (root / TASK).write_text((root / TASK).read_text().replace("doc_to_target: answer", "doc_to_target: prompt"))
    with pytest.raises(UsageError, match="changed after the golden set"):
        lm_eval_tasks(golden, tmp_path / "include", None, sandboxed_metrics())


def test_a_task_name_that_is_a_path_is_refused_by_verify(tmp_path, capsys):
    """`golden export` names files TASK.SPLIT.jsonl: `task: /tmp/x` wrote attacker-chosen bytes there."""
    out = str(tmp_path / "ESCAPED")
    by_task = edited(tmp_path / "t", lambda c: c.update(task=out))
    by_split = edited(
        tmp_path / "s", lambda c: c["dataset_kwargs"].update(data_files={"../x": "../data/answers_facts.jsonl"})
    )
    for root, key in ((by_task, "task"), (by_split, "split")):
        assert main(["golden", "verify", str(root)]) == 2
        assert f"{TASK}: {key} " in capsys.readouterr().err
    assert not list(tmp_path.glob("ESCAPED*"))


def test_the_shipped_sets_still_verify_and_name_lm_evals_own_metrics(tmp_path):
    metrics = sandboxed_metrics()
    for root in sorted((ROOT / "golden").glob("*/v*")):
        lm_eval_tasks(verify(root), tmp_path / root.parent.name / root.name, None, metrics)


def _listed(root: Path, name: str, data: bytes) -> None:
    """Add a data file to a set and to its MANIFEST (as someone editing a set can), then reseal."""
    import json

    (root / name).write_bytes(data)
    m = json.loads((root / "MANIFEST.json").read_text())
    m["files"][name] = {"sha256": "0" * 64, "items": 0}
    (root / "MANIFEST.json").write_text(json.dumps(m, indent=2))
    reseal(root)


def test_what_lm_eval_scores_is_the_task_entry_verify_checked(tmp_path, capsys):
    """verify checked each task entry's data file item by item, while lm-eval read what the YAML named: a listed
    extra file (only hashed) whose six items share one id verified, and a gate judged 7 pairs of 12; a manifest
    output type other than the YAML's, or a task with no YAML, failed only at scoring (exit 3 after the load)."""
    import json

    root = copy_set(tmp_path / "extra", "answers/v1")
    line = (root / "data" / "answers_facts.jsonl").read_text().splitlines()[0]
    _listed(root, "data/extra.jsonl", (line + "\n").encode() * 6)
    cfg = yaml.safe_load((root / TASK).read_text())
    cfg["dataset_kwargs"]["data_files"]["test"] = "../data/extra.jsonl"
    (root / TASK).write_text(yaml.safe_dump(cfg, sort_keys=False))
    reseal(root)
    assert main(["golden", "verify", str(root)]) == 2
    assert "its scored split test reads ../data/extra.jsonl, the manifest's items of" in capsys.readouterr().err
    for change, says in (
        (lambda m: m["tasks"]["answers_facts"].update(output_type="multiple_choice"), "the manifest says"),
        (lambda m: m["tasks"].update(ghost=dict(m["tasks"]["answers_facts"])), "task ghost has no task YAML"),
    ):
        root = copy_set(tmp_path / says.replace(" ", "_"), "answers/v1")
        m = json.loads((root / "MANIFEST.json").read_text())
        change(m)
        (root / "MANIFEST.json").write_text(json.dumps(m, indent=2))
        assert main(["golden", "verify", str(root)]) == 2
        assert says in capsys.readouterr().err


def test_a_task_scoring_its_validation_split_is_cut_to_its_smoke_ids_and_exported(tmp_path):
    """A task whose scored split is `validation` (as lm-eval's own tasks often are) verified, then a smoke subset
    failed with KeyError 'test' (exit 3) and `golden export` the same way."""
    from quantize.golden.export import export_tasks

    def validation(c):
        c["dataset_kwargs"]["data_files"] = {"validation": c["dataset_kwargs"]["data_files"]["test"]}
        del c["test_split"]
        c["validation_split"] = "validation"

    golden = verify(edited(tmp_path, validation))
    ids = golden.manifest.smoke_ids
    include = lm_eval_tasks(golden, tmp_path / "include", ids, sandboxed_metrics())
    cfg = yaml.safe_load((include / "answers_facts.yaml").read_text())
    subset = Path(cfg["dataset_kwargs"]["data_files"]["validation"])
    assert len(subset.read_text().splitlines()) == len(ids["answers_facts"])
    done = export_tasks(golden, tmp_path / "export", ["answers_facts"], None, (0, None))
    assert done.tasks == {"answers_facts": golden.manifest.files["data/answers_facts.jsonl"].items}


def test_a_smoke_id_is_matched_as_verify_matches_it(tmp_path):
    """verify found a smoke id `x ` in the items by its trimmed form; the subset compared str(id) with it and
    dropped the item: the smoke run scored fewer items than the manifest names."""
    import json

    root = copy_set(tmp_path, "answers/v1")
    m = json.loads((root / "MANIFEST.json").read_text())
    m["smoke_ids"]["answers_facts"] = [f" {i}\u00a0" for i in m["smoke_ids"]["answers_facts"]]
    (root / "MANIFEST.json").write_text(json.dumps(m, indent=2))
    golden = verify(root)
    include = lm_eval_tasks(golden, tmp_path / "include", golden.manifest.smoke_ids, sandboxed_metrics())
    cfg = yaml.safe_load((include / "answers_facts.yaml").read_text())
    assert len(Path(cfg["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()) == 8


def test_dataset_kwargs_that_are_no_mapping_are_named_by_verify(tmp_path, capsys):
    """`dataset_kwargs: [1]` was an AttributeError in verify (exit 3)."""
    root = edited(tmp_path, lambda c: c.update(dataset_kwargs=[1]))
    assert main(["golden", "verify", str(root)]) == 2
    err = capsys.readouterr().err
    assert "no dataset_kwargs.data_files" in err and "Traceback" not in err


def test_a_task_version_of_nan_is_refused(tmp_path, capsys):
    """A manifest `task_version: NaN` verified and was stored as "NaN" in every score's provenance."""
    import json

    root = copy_set(tmp_path, "answers/v1")
    m = json.loads((root / "MANIFEST.json").read_text())
    m["task_version"] = float("nan")
    (root / "MANIFEST.json").write_text(json.dumps(m))
    assert main(["golden", "verify", str(root)]) == 2
    assert "task_version" in capsys.readouterr().err


BAD_TEMPLATES = {
    "{{ cycler.__init__.__globals__ }}": "tried to reach Python",
    "{{ nope }}": "names what the item does not hold ('nope' is undefined",
    "{{ answer ": "is not a Jinja template that parses",
}


@pytest.mark.parametrize("template", list(BAD_TEMPLATES))
def test_a_template_lm_eval_cannot_render_is_exit_2_in_verify_naming_the_field(tmp_path, capsys, template):
    """A doc_to_target that reaches Python, names a variable the items lack or does not parse verified (the hashes
    hold), then ended scoring in exit 3 after the model loaded (a review's repro). `golden verify` renders each
    template on the task's first item as lm-eval does: exit 2 naming the set, the task and the field."""
    root = edited(tmp_path, lambda c: c.update(doc_to_target=template))
    verify(root)  # the files are what the manifest says
    assert main(["golden", "verify", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"golden set {root}: task answers_facts's doc_to_target" in err
    assert BAD_TEMPLATES[template] in err


def test_scoring_refuses_a_template_lm_eval_cannot_render_before_the_model_loads(tmp_path, monkeypatch, tiny_model):
    """Scoring a set whose template fails is exit 2 naming it, and the checkpoint is never loaded: it was exit 3
    ("lm-eval could not score"), the UsageError rewrapped after the load."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate import score
    from quantize.evaluate.suite import open_suite
    from quantize.records import CheckpointRef

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(score, "lm_eval_model", loaded)
    for i, template in enumerate(BAD_TEMPLATES):
        root = edited(tmp_path / str(i), lambda c, t=template: c.update(doc_to_target=t))
        suite = open_suite(suite_file(tmp_path / f"suite{i}.yaml", root))
        ref = CheckpointRef(path=str(tiny_model), weights_sha256="0" * 64, identity_sha256="0" * 64)
        with pytest.raises(
            UsageError, match=f"task answers_facts's doc_to_target .*{re.escape(BAD_TEMPLATES[template])}"
        ):
            score.run_lm_eval(suite, tiny_model, ref, LastModel(False))


def test_a_template_that_fails_on_a_later_item_is_exit_2_naming_the_set(tmp_path):
    """A template that renders on the first item but not on another fails inside lm-eval: a UsageError naming the
    set (jinja2's UndefinedError was exit 3)."""
    from jinja2 import Environment, StrictUndefined

    from quantize.compat.lm_eval import templates_refused

    template = Environment(undefined=StrictUndefined).from_string("{{ nope }}")
    failed = "golden set X: a task template failed on an item \\(UndefinedError"
    with pytest.raises(UsageError, match=failed), templates_refused("golden set X"):
        template.render()


def test_the_shipped_sets_templates_render(tmp_path):
    from quantize.golden.templates import check_templates

    for root in sorted((ROOT / "golden").glob("*/v*")):
        check_templates(verify(root))
