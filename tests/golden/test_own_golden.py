"""Users' own golden sets: `golden freeze` of lm-eval task YAMLs over a local dataset (every output type the
gate supports, process_docs, few-shot, a regex filter), `golden new` from a JSONL of each item type with
every bad input refused, gating on a user set (JSON and JUnit), and `golden size`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from quantize import records
from quantize.cli import main
from quantize.errors import UsageError
from quantize.evaluate.score import score
from quantize.evaluate.suite import open_suite
from quantize.golden.manifest import verify
from quantize.records import Verdict

from conftest import ROOT, frozen_set, lm_eval_direct, make_tiny_llama

WORDS = [
    *("the", "of", "a", "and", "to", "is", "in", "that", "it", "for", "as", "with"),
    *("on", "was", "be", "are", "this", "by", "or", "from", "at", "an", "not", "which"),
]
TASKS = ["u_mc", "u_greedy", "u_rolling", "u_gen"]


def _phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_user_tasks(root: Path) -> Path:
    """A user's lm-eval tasks over local JSON files: process_docs filters and adds a field, the
    multiple-choice task takes 2 few-shot examples from its own train split, the generation task
    extracts its answer with a regex."""
    rng = random.Random(7)
    data = root / "data"
    data.mkdir(parents=True)
    rows = []
    for i in range(30):
        opts = [_phrase(rng, 2) for _ in range(3)]
        rows.append(
            {
                "q": _phrase(rng, 5),
                "opts": opts,
                "label": i % 3,
                "topic": f"t{i % 4}",
                "skip": i % 7 == 0,  # filtered out by process_docs
                "ctx": _phrase(rng, 6),
                "tgt": " " + _phrase(rng, 2),
                "body": _phrase(rng, 40),
                "ans": rng.choice(WORDS),
            }
        )
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:24]))
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[24:]))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "utils.py").write_text(
        "def process(ds):\n"
        "    ds = ds.filter(lambda d: not d['skip'])\n"
        "    return ds.map(lambda d: {'prompt': 'Q: ' + d['q'] + '\\nA:'})\n"
        "def target(doc):\n    return doc['ans']\n"
    )
    files = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data / 'test.jsonl'}\n"
        f"    train: {data / 'train.jsonl'}\n"
    )
    common = files + "test_split: test\nprocess_docs: !function utils.process\nmetadata: {version: 2.0}\n"
    (tasks / "u_mc.yaml").write_text(
        "task: u_mc\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{prompt}}'\n"
        "doc_to_choice: '{{opts}}'\ndoc_to_target: label\nnum_fewshot: 2\nfewshot_split: train\n"
        "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
    )
    (tasks / "u_greedy.yaml").write_text(
        "task: u_greedy\n" + common + "output_type: loglikelihood\ndoc_to_text: '{{ctx}}'\n"
        "doc_to_target: '{{tgt}}'\ntarget_delimiter: ''\n"
        "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
    )
    (tasks / "u_rolling.yaml").write_text(
        "task: u_rolling\n" + common + "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{body}}'\n"
        "metric_list:\n  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n"
    )
    (tasks / "u_gen.yaml").write_text(
        "task: u_gen\n" + common + "output_type: generate_until\ndoc_to_text: '{{prompt}}'\n"
        "doc_to_target: '{{ans}}'\ngeneration_kwargs: {until: ['.'], do_sample: false, max_gen_toks: 4}\n"
        "filter_list:\n  - name: first-word\n    filter:\n"
        "      - {function: regex, regex_pattern: '(\\w+)', group_select: 0, fallback: '[none]'}\n"
        "      - {function: take_first}\n"
        "metric_list:\n  - {metric: exact_match, aggregation: mean, higher_is_better: true}\n"
    )
    return tasks


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    tasks = write_user_tasks(root)
    out, manifest, suite = frozen_set(root, "support", tasks, TASKS, cluster_field="topic")
    return root, tasks, out, manifest, suite


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-own"))


def test_freeze_writes_a_verified_set_with_sources_ids_clusters_and_fewshot(user):
    _, tasks, out, m, _ = user
    g = verify(out)
    assert g.tasks == sorted(TASKS)
    kept = 24 - sum(1 for i in range(24) if i % 7 == 0)  # process_docs dropped every 7th document
    for t in TASKS:
        e = g.entry(t)
        assert m.files[e.data].items == kept
        items = [json.loads(x) for x in (out / e.data).read_text().splitlines()]
        assert [it["golden_id"] for it in items] == [f"{t}-{i:05d}" for i in range(kept)]
        assert all(it["prompt"].startswith("Q: ") and not it["skip"] for it in items)  # after process_docs
        assert e.cluster_field == "topic" and e.source["task_version"] == 2.0
        assert e.source["data_files"]["test"]["sha256"] and e.source["task_yaml"]["path"].endswith(f"{t}.yaml")
        cfg = (out / "tasks" / f"{t}.yaml").read_text()
        assert "process_docs" not in cfg and str(tasks) not in cfg and "../data/" in cfg
    mc = g.entry("u_mc")
    assert mc.fewshot == "data/u_mc.fewshot.jsonl" and len(mc.fewshot_ids) == 5  # 6 train rows, one filtered
    assert g.entry("u_greedy").fewshot is None
    assert all(len(ids) == 8 for ids in m.smoke_ids.values())


def test_frozen_set_scores_item_for_item_like_the_original_task(user, tiny_model):
    """The same model, the original task (lm-eval loading the user's YAML and data) and the frozen one
    (ours, offline): equal per-item scores, log-likelihoods and generations."""
    from lm_eval.models.huggingface import HFLM

    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.score import item_records

    _, tasks, _, _, suite = user
    s = open_suite(suite)
    ours = score(s, tiny_model).doc
    model, tok = LastModel().get(tiny_model, dtype="float32", on="cpu")
    r = lm_eval_direct(TASKS, tasks, model=HFLM(pretrained=model, tokenizer=tok, batch_size=4))
    for t in TASKS:
        # the original documents carry no id: lm-eval's doc_id is the frozen item's index
        samples = [{**x, "doc": {**x["doc"], "golden_id": f"{t}-{x['doc_id']:05d}"}} for x in r["samples"][t]]
        theirs, _ = item_records(r["configs"][t]["output_type"], samples, ("golden_id", "topic"))
        mine = [i.model_dump() for i in ours.tasks[t].items]
        assert len(mine) == len(theirs) == 20
        for a, b in zip(mine, theirs, strict=True):
            assert a["id"] == b["id"] and a["cluster"] == b["cluster"] and a["score"] == b["score"], (t, a["id"])
            if "ll" in a:
                assert a["ll"] == pytest.approx(b["ll"], abs=1e-4), (t, a["id"])
            if "response" in a:
                assert a["response"] == b["response"]
    gen = ours.tasks["u_gen"]
    assert gen.output_type == "generate_until" and gen.filter == "first-word"
    assert all(" " not in i.response for i in gen.items)  # the regex kept the first word


def test_a_one_byte_change_is_refused(user, tmp_path):
    import shutil

    _, _, out, _, _ = user
    copy = tmp_path / "support" / "v1"
    shutil.copytree(out, copy)
    p = copy / "data" / "u_gen.jsonl"
    blob = bytearray(p.read_bytes())
    blob[10] = ord("X") if blob[10] != ord("X") else ord("Y")
    p.write_bytes(bytes(blob))
    with pytest.raises(UsageError, match="u_gen.jsonl: sha256 differs"):
        verify(copy)
    assert main(["golden", "verify", str(copy)]) == 2


def test_freeze_refuses_code(user, tmp_path, capsys):
    import shutil

    _, tasks, _, _, _ = user
    mine = tmp_path / "tasks"
    shutil.copytree(tasks, mine)
    edited = (
        (mine / "u_gen.yaml").read_text().replace("doc_to_target: '{{ans}}'", "doc_to_target: !function utils.target")
    )
    (mine / "u_gen.yaml").write_text(edited)
    out = tmp_path / "g" / "v1"
    assert main(["golden", "freeze", "--task", "u_gen", "--include-path", str(mine), "--out", str(out)]) == 2
    assert "Python code" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()  # refused before anything was written


def test_shots_drawn_from_the_scored_split_are_pinned_as_lm_eval_draws_them(user, tmp_path):
    """Was refused (and, frozen by hand, drew n shots where lm-eval draws n + 1 and drops the item itself): now
    each item keeps lm-eval's own draw, and the freeze's prompt check proves every prompt equals the original's."""
    import shutil

    _, tasks, _, _, _ = user
    mine = tmp_path / "tasks"
    shutil.copytree(tasks, mine)
    (mine / "u_gen.yaml").write_text((mine / "u_gen.yaml").read_text() + "num_fewshot: 2\nfewshot_split: test\n")
    out = tmp_path / "g" / "v1"
    assert main(["golden", "freeze", "--task", "u_gen", "--include-path", str(mine), "--out", str(out)]) == 0
    g = verify(out)
    items = [json.loads(x) for x in (out / "data" / "u_gen.jsonl").read_text().splitlines()]
    lines = (out / "data" / "u_gen.fewshot.jsonl").read_text().splitlines()
    shots = dict(zip(g.entry("u_gen").fewshot_ids, lines, strict=True))
    assert all(len(it["golden_shots"]) == 2 for it in items)
    for it in items:  # an item is never its own example
        own = {k: v for k, v in it.items() if not k.startswith("golden_")}
        assert all(json.loads(shots[s]) != own for s in it["golden_shots"]), it["golden_id"]
        assert it["golden_context"].count("Q: ") == 2 and it["prompt"] not in it["golden_context"]
    cfg = (out / "tasks" / "u_gen.yaml").read_text()
    assert "num_fewshot: 0" in cfg and "description: golden_context" in cfg and "fewshot_split" not in cfg


def test_freeze_refuses_an_unknown_task_and_an_existing_version(user, capsys):
    root, tasks, out, _, _ = user
    assert main(["golden", "freeze", "--task", "u_gne", "--include-path", str(tasks), "--out", str(root / "x/v1")]) == 2
    assert "did you mean u_gen" in capsys.readouterr().err
    assert main(["golden", "freeze", "--task", "u_gen", "--include-path", str(tasks), "--out", str(out)]) == 2
    assert "immutable" in capsys.readouterr().err


# --- golden new -------------------------------------------------------------------------------------

GOOD = {
    "multiple_choice": [
        {"question": "the of a", "choices": ["and", "to", "is"], "answer": 1},
        {"question": "in that it", "choices": ["for", "as"], "answer": "as", "id": "q2"},
    ],
    "greedy": [{"context": "the of a", "target": " and"}, {"context": "in that", "target": " it"}],
    "perplexity": [{"text": "the of a and to is in that"}, {"text": "it for as with on was"}],
    "generate": [{"prompt": "the of a", "answer": "and"}, {"prompt": "in that", "answer": "it"}],
}


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_golden_new_writes_a_verified_set_of_each_type(tmp_path, kind, capsys):
    src = tmp_path / "items.jsonl"
    # ids default to the line number, so repeated rows are distinct items
    src.write_text(_jsonl(GOOD[kind] * 3 if kind != "multiple_choice" else GOOD[kind]))
    out = tmp_path / "faq" / "v1"
    assert main(["golden", "new", str(out), "--from", str(src), "--type", kind]) == 0, capsys.readouterr().err
    g = verify(out)
    task = f"faq_{kind}"
    assert g.tasks == [task]
    items = [json.loads(x) for x in (out / g.entry(task).data).read_text().splitlines()]
    if kind == "multiple_choice":
        assert [it["answer"] for it in items] == [1, 1] and [it["id"] for it in items] == [f"{task}-00001", "q2"]
    else:
        assert [it["id"] for it in items] == [f"{task}-{n:05d}" for n in range(1, 7)]
    assert g.entry(task).cluster_field is None


BAD = [
    ("empty field", '{"question": "", "choices": ["a", "b"], "answer": 0}\n', "line 1: question"),
    ("answer not a choice", '{"question": "q", "choices": ["a", "b"], "answer": "c"}\n', "not among the choices"),
    ("answer index out of range", '{"question": "q", "choices": ["a", "b"], "answer": 2}\n', "not among the choices"),
    (
        "mixed types",
        '{"question": "q", "choices": ["a", "b"], "answer": 0}\n{"text": "t"}\n',
        "line 2 has fields of a perplexity item",
    ),
    (
        "duplicate ids",
        '{"question": "q", "choices": ["a", "b"], "answer": 0, "id": "x"}\n' * 2,
        "already used on line 1",
    ),
    ("not utf-8", b'{"question": "q\xff", "choices": ["a", "b"], "answer": 0}\n', "line 1 is not UTF-8"),
    (
        "oversize line",
        '{"question": "' + "q" * 70000 + '", "choices": ["a", "b"], "answer": 0}\n',
        "over the 65,536-byte",
    ),
    ("not json", '{"question": "q", \n', "line 1 is not valid JSON"),
    ("one choice", '{"question": "q", "choices": ["a"], "answer": 0}\n', "at least two"),
    ("missing field", '{"question": "q", "choices": ["a", "b"]}\n', "lacks answer"),
    (
        "blank line",
        '{"question": "q", "choices": ["a", "b"], "answer": 0}\n\n{"question": "r", "choices": ["a", "b"], '
        '"answer": 1}\n',
        "line 2 is empty",
    ),
    ("no items", "", "has no items"),
    (
        "ids alike once trimmed",  # verify compares ids NFC and stripped: `new` wrote a set its verify refused
        '{"question": "q", "choices": ["a", "b"], "answer": 0, "id": "x"}\n'
        '{"question": "q", "choices": ["a", "b"], "answer": 0, "id": "x\\u00a0"}\n',
        "already used on line 1",
    ),
    (  # json.loads keeps the last of a key written twice, silently (a review); the YAML loader refuses it too
        "a key twice",
        '{"question": "q", "question": "r", "choices": ["a", "b"], "answer": 0}\n',
        'line 1 writes the key "question" twice in one object',
    ),
]


@pytest.mark.parametrize("name,content,message", BAD, ids=[b[0] for b in BAD])
def test_golden_new_refuses_bad_input_with_one_message_and_writes_nothing(tmp_path, capsys, name, content, message):
    src = tmp_path / "items.jsonl"
    src.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "faq" / "v1"
    assert main(["golden", "new", str(out), "--from", str(src), "--type", "multiple_choice"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists() and not (tmp_path / "faq").exists()


def test_golden_new_refuses_a_bad_regex_and_options_of_another_type(tmp_path, capsys, monkeypatch):
    import quantize
    from quantize.golden import new

    src = tmp_path / "items.jsonl"
    src.write_text(_jsonl(GOOD["generate"]))
    out = tmp_path / "g" / "v1"
    # re.compile raises OverflowError for a count over its limit and RecursionError for deep nesting: exit 3 before
    nested = "(" * 600 + "a" + ")" * 600
    for regex, says in (("(a", "missing )"), ("a{99999999999}", "too large"), (nested, "nested too deeply")):
        assert main(["golden", "new", str(out), "--from", str(src), "--type", "generate", "--regex", regex]) == 2
        err = capsys.readouterr().err
        assert f"--regex: {regex[:40]!r}"[:-1] in err and "is not a regular expression" in err
        assert says in err and "Traceback" not in err
        with pytest.raises(UsageError, match="is not a regular expression"):
            quantize.golden_new(out, src, "generate", regex=regex)
    # a nested repetition backtracks exponentially on the generated answers lm-eval runs it on: refused, as a gguf
    # recipe's tensor_types are (quantize/patterns.searched)
    monkeypatch.setattr(new, "SPEED_SECONDS", 1)
    assert main(["golden", "new", str(out), "--from", str(src), "--type", "generate", "--regex", "(a+)+$"]) == 2
    assert "'(a+)+$' took more than 1 s" in capsys.readouterr().err
    assert main(["golden", "new", str(out), "--from", str(src), "--type", "greedy", "--regex", "(a)"]) == 2
    assert "apply to --type generate only" in capsys.readouterr().err
    # an empty stop sequence ends every answer before it starts (it was written as `until: ['']`)
    assert main(["golden", "new", str(out), "--from", str(src), "--type", "generate", "--stop", ""]) == 2
    assert "a stop sequence is at least one character" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "set_name,version,says",
    [
        ("faq", ".v1", "starts with '.'"),
        ("faq", "v1\n", "control character"),
        ("faq", " v1", "whitespace"),
        ("fa\u200bq", "v1", "invisible"),
        ("s\udcff", "v1", "lone surrogate"),  # a folder name that is not UTF-8, as Python decodes it
        ("x" * 101, "v1", "at most 100"),
    ],
)
def test_golden_new_refuses_a_set_or_version_name_that_is_not_a_plain_name(tmp_path, capsys, set_name, version, says):
    src = tmp_path / "items.jsonl"
    src.write_text(_jsonl(GOOD["greedy"]))
    out = tmp_path / set_name / version
    assert main(["golden", "new", str(out), "--from", str(src), "--type", "greedy", "--task", "t"]) == 2
    err = capsys.readouterr().err
    # a control character or a lone surrogate anywhere in the path is refused first, by the output-path rule (OUT)
    assert says in err and ("--out" in err or "OUT takes an output path" in err), err
    assert "Traceback" not in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["items.jsonl"]


@pytest.mark.parametrize("task", ["../evil", "a/b", ".", "t\n"])
def test_a_task_name_that_is_not_one_file_name_is_refused_before_anything_is_written(tmp_path, task):
    from quantize.golden.version import TaskFiles, write_version

    t = TaskFiles(
        name=task, output_type="generate_until", items=[{"id": "1", "context": "a", "target": "b"}], config={}
    )
    with pytest.raises(UsageError, match="a task's name"):
        write_version(tmp_path / "set" / "v1", [t], sources={}, builder={})
    assert list(tmp_path.iterdir()) == []


def test_two_tasks_of_one_name_on_a_case_insensitive_file_system_are_refused(tmp_path):
    from quantize.golden.version import TaskFiles, write_version

    tasks = [
        TaskFiles(name=n, output_type="generate_until", items=[{"id": "1", "context": "a", "target": "b"}], config={})
        for n in ("qa", "QA")
    ]
    with pytest.raises(UsageError, match='tasks of this set are named "qa" and "QA"'):
        write_version(tmp_path / "set" / "v1", tasks, sources={}, builder={})


# --- gating on a user set ---------------------------------------------------------------------------


def test_gate_on_a_user_golden_set_gives_the_same_kinds_of_evidence(user, tiny_model, tmp_path, capsys):
    suite = user[4]
    other = make_tiny_llama(tmp_path / "other", seed=5)
    policy = tmp_path / "support.yaml"
    policy.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n"
        "  - {task: u_mc, metric: acc, margin: 0.3}\n"
        "  - {task: u_gen, metric: exact_match, margin: 0.3}\n"
        "  - {task: u_rolling, metric: perplexity, max_ratio: 1.5}\n"
        "  - {agreement: kl, max: 1.0}\n"
    )
    junit = tmp_path / "gate.xml"
    argv = ["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json"]
    assert main([*argv, "--junit", str(junit)]) == 0
    v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    assert v.verdict == "pass" and [r.kind for r in v.rules] == ["accuracy", "accuracy", "perplexity", "agreement"]
    gen = v.accuracy_evidence("u_gen")
    assert gen.n == 20 and gen.flips_right_to_wrong == gen.flips_wrong_to_right == 0 and gen.delta == 0
    assert v.provenance.golden.name == "support" and v.provenance.task_versions["u_gen"] == 2.0
    assert junit.read_text().count("<testcase") == 4
    # another model: the generation rule counts its flips from the per-item exact matches
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(other), "--json"])
    v2 = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    assert code == v2.exit_code == (0 if v2.verdict == "pass" else 1)
    gen2 = v2.accuracy_evidence("u_gen")
    b = {i.id: i.score for i in score(open_suite(suite), tiny_model).doc.tasks["u_gen"].items}
    c = {i.id: i.score for i in score(open_suite(suite), other).doc.tasks["u_gen"].items}
    assert gen2.flips_right_to_wrong == sum(b[i] > c[i] for i in b)
    assert gen2.flips_wrong_to_right == sum(b[i] < c[i] for i in b)


@pytest.mark.parametrize(
    "rule,message",
    [
        ("{task: core_facts, metric: acc, margin: 0.1}", "names task 'core_facts', which its suite"),
        ("{task: u_rolling, metric: acc, margin: 0.1}", "acc on u_rolling, a loglikelihood_rolling task"),
        ("{task: u_mc, metric: exact_match, margin: 0.1}", "exact_match applies to generate_until"),
    ],
)
def test_gate_refuses_a_rule_the_golden_set_cannot_answer_before_scoring(
    user, tiny_model, tmp_path, capsys, rule, message
):
    _, _, out, _, suite = user
    policy = tmp_path / "p.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {rule}\n")
    missing = tmp_path / "never-scored"
    assert main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(missing)]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "core_facts" in rule:
        assert str(out) in err and "u_gen" in err  # names the set and the tasks it has


def test_golden_size_reports_flip_rates_and_items_needed(user, tiny_model, tmp_path, capsys):
    import math

    from quantize import stats

    _, _, _, _, suite = user
    other = make_tiny_llama(tmp_path / "other", seed=5)
    argv = ["golden", "size", str(suite), "--baseline", str(tiny_model), "--candidate", str(other)]
    assert main([*argv, "--json", "--margin", "0.1"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {r["task"]: r for r in rep["tasks"]}
    assert set(rows) == set(TASKS) and rows["u_rolling"]["kind"] == "perplexity"
    b = score(open_suite(suite), tiny_model).doc.tasks["u_mc"].items
    c = {i.id: i for i in score(open_suite(suite), other).doc.tasks["u_mc"].items}
    flips = sum(i.score != c[i.id].score for i in b)
    mc = rows["u_mc"]
    assert mc["flip_rate"] == pytest.approx(flips / 20)
    z = stats.z(0.95) + stats.z(0.8)
    assert mc["items_needed"] == math.ceil(z**2 * (mc["se"] * math.sqrt(20)) ** 2 / 0.1**2)
    ppl = rows["u_rolling"]
    assert ppl["half_width"] == pytest.approx(ppl["upper_bound"] / ppl["ratio"] - 1)
    assert ppl["documents_needed"] == math.ceil(20 * (ppl["half_width"] / 0.01) ** 2)
    assert main(argv) == 0
    assert "flip rate" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--margin", "1e-300"], "--margin 1e-300 is finer than one item"),  # m² underflowed: ZeroDivisionError
        (["--margin", "1e-10"], "--margin 1e-10 is finer than one item"),  # past any golden set's items
        (["--alpha", "1e-300"], "--alpha 1e-300: 1 − alpha rounds to 1"),  # z infinite: OverflowError in ceil
    ],
)
def test_golden_size_refuses_a_margin_no_golden_set_resolves_before_scoring(
    user, tiny_model, tmp_path, capsys, monkeypatch, flags, named
):
    import quantize.flows.size as size

    def no_scoring(*a, **k):
        raise AssertionError("scored before the margin was checked")

    monkeypatch.setattr(size, "load_scores", no_scoring)
    _, _, _, _, suite = user
    argv = ["golden", "size", str(suite), "--baseline", str(tiny_model), "--candidate", str(tiny_model), *flags]
    assert main(argv) == 2
    assert named in capsys.readouterr().err
    from quantize.golden.items import MAX_SET_FILE_BYTES, MAX_TASK_ITEMS

    # the bound is one item of the largest task: a data file at its cap, every line the shortest item with an id
    shortest = json.dumps({"": 0}, separators=(",", ":")) + "\n"
    assert MAX_SET_FILE_BYTES // len(shortest.encode()) == MAX_TASK_ITEMS
    size.check_computable(2 / MAX_TASK_ITEMS, 0.05, 0.8)  # one item more resolves: no refusal


# --- the shipped demo sets ----------------------------------------------------------------------------


def _rebuilt_equals_committed(out: Path, committed: Path) -> None:
    mine, theirs = verify(out).manifest, verify(committed).manifest
    assert mine.files == theirs.files and mine.tasks.keys() == theirs.tasks.keys()
    assert mine.smoke_ids == theirs.smoke_ids


def test_the_answers_set_is_rebuilt_byte_for_byte_from_its_source(tmp_path):
    import subprocess
    import sys

    items = tmp_path / "answers.jsonl"
    script = ROOT / "golden" / "answers" / "source" / "make_items.py"
    items.write_bytes(subprocess.run([sys.executable, str(script)], check=True, capture_output=True).stdout)
    committed = ROOT / "golden" / "answers" / "v1"
    cmd = verify(committed).manifest.builder["command"].split()
    opts = dict(zip(cmd[4::2], cmd[5::2], strict=True))  # quantize golden new OUT --from F --type T ...
    out = tmp_path / "answers" / "v1"
    argv = ["golden", "new", str(out), "--from", str(items), "--type", opts["--type"], "--task", opts["--task"]]
    assert main([*argv, "--max-gen-toks", opts["--max-gen-toks"]]) == 0
    _rebuilt_equals_committed(out, committed)


def _refrozen_equals_committed(tmp_path: Path, name: str, script: str, tasks: list[str], *extra: str) -> None:
    """Run a shipped set's source script, freeze its tasks as its builder did, compare with golden/NAME/v1
    (skipped on another Python: the sets are made of Python's own documentation, which changes between versions)."""
    import platform
    import subprocess
    import sys

    committed = ROOT / "golden" / name / "v1"
    made_on = verify(committed).manifest.sources[tasks[0]]["python_version"]
    if platform.python_version() != made_on:
        pytest.skip(f"Python's documentation differs between versions: frozen on {made_on}")
    src = tmp_path / "src"
    subprocess.run([sys.executable, str(ROOT / "golden" / name / "source" / script), str(src)], check=True)
    include = src / "tasks" if (src / "tasks").is_dir() else src
    out = tmp_path / name / "v1"
    argv = ["golden", "freeze", *(a for t in tasks for a in ("--task", t)), "--include-path", str(include)]
    assert main([*argv, *extra, "--out", str(out)]) == 0
    _rebuilt_equals_committed(out, committed)


def test_the_pydoc_set_is_refrozen_byte_for_byte_from_its_task(tmp_path):
    _refrozen_equals_committed(
        tmp_path, "pydoc", "make_task.py", ["pydoc_cloze", "pydoc_prose"], "--cluster-field", "topic"
    )


def test_a_group_freezes_as_its_tasks_and_a_smoke_suite_scores_the_fixed_ids(user, tiny_model, tmp_path):
    import shutil

    _, tasks, _, _, _ = user
    mine = tmp_path / "tasks"
    shutil.copytree(tasks, mine)
    (mine / "both.yaml").write_text("group: both\ntask: [u_greedy, u_gen]\n")
    out = tmp_path / "grp" / "v1"
    assert main(["golden", "freeze", "--task", "both", "--include-path", str(mine), "--out", str(out)]) == 0
    g = verify(out)
    assert g.tasks == ["u_gen", "u_greedy"] and g.entry("u_gen").cluster_field is None
    suite = tmp_path / "smoke.yaml"
    suite.write_text(f"golden: {out}\nsubset: smoke\nbatch_size: 4\n")
    doc = score(open_suite(suite), tiny_model).doc
    for t in g.tasks:
        assert sorted(i.id for i in doc.tasks[t].items) == sorted(g.manifest.smoke_ids[t])
        assert all(i.cluster == i.id for i in doc.tasks[t].items)  # no cluster field: each item its own


def test_a_sequential_gate_on_a_user_golden_set_scores_generation_and_documents_in_stages(
    user, tiny_model, tmp_path, capsys
):
    """Another model, uncached: multiple choice, generation and documents scored in stages through lm-eval's
    `samples=`; each rule's evidence covers exactly the items its task had scored when it was decided."""
    suite = user[4]
    other = make_tiny_llama(tmp_path / "other", seed=7)  # a model no other test scores: never cached
    policy = tmp_path / "staged.yaml"
    policy.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nsequential: {{looks: [0.5, 1.0]}}\nrules:\n"
        "  - {task: u_mc, metric: acc, margin: 0.3}\n"
        "  - {task: u_gen, metric: exact_match, margin: 0.3}\n"
        "  - {task: u_rolling, metric: perplexity, max_ratio: 1.5}\n"
    )
    code = main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(other), "--json"])
    out = capsys.readouterr()
    v = records.parse(Verdict, json.loads(out.out), "stdout")
    assert code == v.exit_code == (0 if v.verdict == "pass" else 1), out.err
    sq = v.sequential
    assert sq is not None and sq.candidate_seconds is not None and all(r.look is not None for r in v.rules)
    for task in ("u_mc", "u_gen"):
        assert v.accuracy_evidence(task).n == sq.items_scored[task] <= sq.items_total[task]
    ppl = next(r for r in v.rules if r.kind == "perplexity")
    assert ppl.evidence.n == sq.items_scored["u_rolling"]


def test_the_std_set_is_refrozen_byte_for_byte_from_lm_evals_own_tasks(tmp_path):
    """golden/std/v1: lm-eval's own task YAMLs over the items golden/std/source writes; the few-shot pins too."""
    _refrozen_equals_committed(tmp_path, "std", "make_data.py", ["arc_easy", "hellaswag", "gsm8k", "lambada_openai"])


def test_golden_new_into_a_link_or_below_a_file_is_exit_2_before_reading(tmp_path, capsys):
    """A set folder that is a file was exit 3 (FileExistsError); OUT a dangling link read the whole input, then
    named the temporary folder; a set name starting with a digit blamed a --task that was not given."""
    src = tmp_path / "items.jsonl"
    src.write_text(_jsonl(GOOD["multiple_choice"]))
    (tmp_path / "s4").write_text("")
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "v1").symlink_to(tmp_path / "nowhere")
    for out, says in (
        (tmp_path / "s4" / "v1", "is a file"),
        (tmp_path / "s2" / "v1", "is a link"),
        (tmp_path / "1s" / "v1", "give --task NAME, or a set folder whose name starts with a letter"),
    ):
        assert main(["golden", "new", str(out), "--from", str(src), "--type", "multiple_choice"]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("planted", ["fifo", "folder", "oversize"])
def test_freeze_refuses_an_include_path_lm_eval_could_not_read_safely(user, tmp_path, capsys, planted):
    """A FIFO named t.yaml in --include-path blocked the freeze inside lm-eval's open forever (a review)."""
    import os
    import shutil

    _, tasks, _, _, _ = user
    mine = tmp_path / "tasks"
    shutil.copytree(tasks, mine)
    bad = mine / "sub" / "t.yaml"
    bad.parent.mkdir()
    if planted == "fifo":
        os.mkfifo(bad)
    elif planted == "folder":
        bad.mkdir()
    else:
        bad.write_text("task: t\n" + "#" * 2**20)
    out = tmp_path / "g" / "v1"
    assert main(["golden", "freeze", "--task", "u_gen", "--include-path", str(mine), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert str(bad) in err and "lm-eval reads every *.yaml there as a task" in err, err
    assert not (tmp_path / "g").exists()
