"""lm-eval's own task definitions frozen as golden sets: arc_easy (multiple choice, acc_norm), hellaswag with its
process_docs and 2 shots from the split it scores, 5-shot gsm8k with both regex filter pipelines, gsm8k_cot's
inline few-shot samples, and lambada_openai, each over local parquet in its hub dataset's shape (the parquet
route for a machine without the hub). Frozen, verified, and scored item for item like lm-eval's own run of the
original tasks: the same prompts and log-likelihoods, in full and in a sequential gate's stages."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from quantize.cli import main
from quantize.evaluate.suite import open_suite
from quantize.golden.manifest import verify

from conftest import HUB_ONLY_TASK, frozen_set, lm_eval_direct

WORDS = [
    "the",
    "of",
    "a",
    "and",
    "to",
    "is",
    "in",
    "that",
    "it",
    "for",
    "as",
    "with",
    "on",
    "was",
    "be",
    "are",
    "this",
    "by",
    "or",
    "from",
    "at",
    "an",
    "not",
    "which",
]
TASKS = ["arc_easy", "gsm8k", "gsm8k_cot", "hellaswag", "lambada_openai"]


def _phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _rows(kind: str, n: int, rng: random.Random) -> list[dict]:
    if kind == "arc":
        return [
            {
                "id": f"q{rng.randrange(10**6)}",
                "question": _phrase(rng, 6) + "?",
                "choices": {"text": [_phrase(rng, rng.randint(1, 3)) for _ in range(4)], "label": list("ABCD")},
                "answerKey": rng.choice("ABCD"),
            }
            for _ in range(n)
        ]
    if kind == "hellaswag":
        return [
            {
                "ind": i,
                "activity_label": _phrase(rng, 1).capitalize(),
                "ctx_a": _phrase(rng, 5) + " [title]",
                "ctx_b": _phrase(rng, 3),
                "ctx": "",
                "endings": [_phrase(rng, rng.randint(2, 4)) for _ in range(4)],
                "source_id": "s",
                "split": "val",
                "split_type": "indomain",
                "label": str(rng.randrange(4)),
            }
            for i in range(n)
        ]
    if kind == "gsm8k":
        rows = []
        for _ in range(n):
            a, b = rng.randint(2, 40), rng.randint(2, 40)
            rows.append(
                {
                    "question": f"{_phrase(rng, 4)} {a} and {b} {_phrase(rng, 3)}?",
                    "answer": f"{_phrase(rng, 5)} {a} + {b} = {a + b}.\n#### {a + b}",
                }
            )
        return rows
    return [{"text": _phrase(rng, rng.randint(8, 16))} for _ in range(n)]  # lambada


def _parquet(path: Path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_standard_tasks(root: Path) -> Path:
    """lm-eval's own YAMLs, each included unchanged but for its dataset (local parquet) and, for hellaswag,
    2 shots drawn from the validation split it scores."""
    import lm_eval

    own = Path(lm_eval.__file__).parent / "tasks"
    rng = random.Random(11)
    data = root / "parquet"
    files = {
        "arc_easy": {
            s: _parquet(data / f"arc-{s}.parquet", _rows("arc", n, rng))
            for s, n in [("train", 8), ("validation", 4), ("test", 6)]
        },
        "hellaswag": {
            s: _parquet(data / f"hs-{s}.parquet", _rows("hellaswag", n, rng))
            for s, n in [("train", 6), ("validation", 7), ("test", 3)]
        },
        "gsm8k": {
            s: _parquet(data / f"gsm-{s}.parquet", _rows("gsm8k", n, rng)) for s, n in [("train", 9), ("test", 6)]
        },
        "lambada_openai": {"test": _parquet(data / "lambada-test.parquet", _rows("lambada", 6, rng))},
    }
    files["gsm8k_cot"] = files["gsm8k"]
    origin = {
        "arc_easy": own / "arc" / "arc_easy.yaml",
        "hellaswag": own / "hellaswag" / "hellaswag.yaml",
        "gsm8k": own / "gsm8k" / "gsm8k.yaml",
        "gsm8k_cot": own / "gsm8k" / "gsm8k-cot.yaml",
        "lambada_openai": own / "lambada" / "lambada_openai.yaml",
    }
    tasks = root / "tasks"
    tasks.mkdir()
    for name in TASKS:
        cfg = {
            "include": str(origin[name]),
            "task": name,
            "dataset_path": "parquet",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": files[name]},
        }
        if name == "hellaswag":
            cfg |= {"num_fewshot": 2, "fewshot_split": "validation"}
        if name in ("gsm8k", "gsm8k_cot"):  # a tiny model never stops on its own: keep generations short
            gen = {"until": ["Question:", "Q:", "\n\n"], "do_sample": False, "max_gen_toks": 12}
            cfg["generation_kwargs"] = gen
        (tasks / f"{name}.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    return tasks


@pytest.fixture(scope="module")
def std(tmp_path_factory):
    root = tmp_path_factory.mktemp("std")
    tasks = write_standard_tasks(root)
    out, manifest, suite = frozen_set(root, "std", tasks, TASKS)
    return root, tasks, out, manifest, suite


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-std"))


def test_standard_tasks_freeze_with_shots_pinned_and_inline_samples(std):
    _, _, out, _, _ = std
    g = verify(out)
    assert g.tasks == sorted(TASKS)
    for name, shots in (("gsm8k", 5), ("gsm8k_cot", 8), ("hellaswag", 2)):
        e = g.entry(name)
        items = [json.loads(x) for x in (out / e.data).read_text().splitlines()]
        assert all(len(it["golden_shots"]) == shots for it in items), name
        assert e.source["fewshot"]["num_fewshot"] == shots and e.source["fewshot"]["seed"] == 1234
    cot = [json.loads(x) for x in (out / "data" / "gsm8k_cot.jsonl").read_text().splitlines()]
    assert "There are 15 trees in the grove" in cot[0]["golden_context"]  # lm-eval's inline samples, first_n
    assert len({tuple(it["golden_shots"]) for it in cot}) == 1
    hs = [json.loads(x) for x in (out / "data" / "hellaswag.jsonl").read_text().splitlines()]
    assert len({tuple(it["golden_shots"]) for it in hs}) > 1  # drawn per item from the one random sequence
    assert g.item_metrics("arc_easy") == ["acc_norm"] and g.item_metrics("hellaswag") == ["acc_norm"]
    assert g.item_metrics("gsm8k") == ["exact_match@strict-match", "exact_match@flexible-extract"]
    assert g.entry("arc_easy").source["dataset_path"] == "parquet"


def test_frozen_standard_tasks_score_like_lm_eval_on_the_originals(std, tiny_model):
    """Prompts (lm-eval's prompt hash), log-likelihoods, responses and every per-item metric equal lm-eval's
    own run of the original tasks with its default few-shot seed."""
    from lm_eval.models.huggingface import HFLM

    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.score import item_records, score

    _, tasks, _, _, suite = std
    ours = score(open_suite(suite), tiny_model).doc
    model, tok = LastModel().get(tiny_model, dtype="float32", on="cpu")
    r = lm_eval_direct(TASKS, tasks, model=HFLM(pretrained=model, tokenizer=tok, batch_size=4))
    for t in TASKS:
        samples = [{**x, "doc": {**x["doc"], "golden_id": f"{t}-{x['doc_id']:05d}"}} for x in r["samples"][t]]
        theirs, _ = item_records(r["configs"][t]["output_type"], samples, ("golden_id", None))
        mine = [i.model_dump() for i in ours.tasks[t].items]
        assert len(mine) == len(theirs) > 0
        for a, b in zip(mine, theirs, strict=True):
            assert a["id"] == b["id"] and a["prompt_sha256"] == b["prompt_sha256"], (t, a["id"])
            assert a["score"] == b["score"] and a["metrics"] == b["metrics"], (t, a["id"])
            if "ll" in a:
                assert a["ll"] == pytest.approx(b["ll"], abs=1e-4), (t, a["id"])
            if "response" in a:
                assert a["response"] == b["response"], (t, a["id"])
    assert set(ours.tasks["gsm8k"].items[0].metrics) == {"exact_match@strict-match", "exact_match@flexible-extract"}
    assert set(ours.tasks["arc_easy"].metrics) == {"acc_norm"}


def test_a_staged_score_gives_every_item_its_full_run_prompt(std, tiny_model):
    """The staged scorer scores subsets through lm-eval's samples=: with shots pinned, each item's prompt and
    scores are the full run's (they drew other shots, 3 of 8 gsm8k responses differing, before)."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.score import Staged, score

    _, _, _, _, suite = std
    s = open_suite(suite)
    full = score(s, tiny_model).doc
    order = {t: [i.id for i in full.tasks[t].items] for t in TASKS}
    staged = Staged(s, tiny_model, order, LastModel())
    staged.full = None  # as for a candidate: nothing cached, scored in stages
    picks = {t: order[t][1::2] for t in TASKS}
    part = staged.score(picks)
    for t in TASKS:
        whole = {i.id: i for i in full.tasks[t].items}
        assert [i.id for i in part.tasks[t].items] == sorted(picks[t])
        for i in part.tasks[t].items:
            assert i.prompt_sha256 == whole[i.id].prompt_sha256 and i.score == whole[i.id].score, (t, i.id)
            assert i.metrics == whole[i.id].metrics


def test_headline_metrics_are_gateable_and_an_unknown_one_is_refused(std, tiny_model, tmp_path, capsys):
    _, _, _, _, suite = std
    policy = tmp_path / "std.yaml"
    policy.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n"
        "  - {task: arc_easy, metric: acc_norm, margin: 0.5}\n"
        "  - {task: gsm8k, metric: exact_match@flexible-extract, margin: 0.5}\n"
        "  - {task: lambada_openai, metric: perplexity, max_ratio: 1.5}\n"
    )
    assert (
        main(["gate", str(policy), "--baseline", str(tiny_model), "--candidate", str(tiny_model), "--json", "-q"]) == 0
    )
    v = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in v["rules"]] == ["pass"] * 3
    assert v["rules"][0]["evidence"]["n"] == 6
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"suite: {suite}\nrules:\n  - {{task: gsm8k, metric: exact_match@strict, margin: 0.1}}\n")
    assert main(["gate", str(bad), "--baseline", str(tiny_model), "--candidate", str(tiny_model)]) == 2
    err = capsys.readouterr().err
    assert "exact_match@strict-match" in err and "exact_match@flexible-extract" in err


def test_different_prompts_on_the_two_sides_are_refused(std, tiny_model, tmp_path, capsys):
    _, _, _, _, suite = std
    assert main(["eval", str(suite), str(tiny_model), "--json", "--items", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    base, cand = tmp_path / "base.json", tmp_path / "cand.json"
    base.write_text(json.dumps(doc))
    doc["tasks"]["hellaswag"]["items"][2]["prompt_sha256"] = "0" * 64  # as if its shots had been drawn again
    cand.write_text(json.dumps(doc))
    policy = tmp_path / "p.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: hellaswag, metric: acc_norm, margin: 0.5}}\n")
    assert main(["gate", str(policy), "--baseline", str(base), "--candidate", str(cand)]) == 2
    assert "different prompts for 1 item(s) (e.g. hellaswag-00002)" in capsys.readouterr().err


def test_agreement_runs_over_the_suites_tasks_unless_it_names_its_own(std, tmp_path):
    """Most of a 365 s gate was agreement on a task the suite did not score."""
    _, _, out, _, _ = std
    for extra, want in (
        ("tasks: [arc_easy, lambada_openai]\n", ["arc_easy", "lambada_openai"]),
        ("tasks: [arc_easy]\nagreement: {tasks: [gsm8k], per_task: 2}\n", ["gsm8k"]),
        ("", sorted(TASKS)),
    ):
        suite = tmp_path / "s.yaml"
        suite.write_text(f"golden: {out}\n{extra}")
        assert open_suite(suite).agreement_tasks == want


def test_a_users_folder_adds_to_lm_evals_own_tasks(std):
    """--include-path turned lm-eval's own tasks off; lm-eval's flag adds to them, and so does ours now."""
    from quantize.golden.freeze import _task_manager

    _, tasks, _, _, _ = std
    alone = set(_task_manager(["hellaswag"], tasks).all_tasks)  # every name in the folder: the folder's index
    assert set(TASKS) <= alone and "mmlu" not in alone
    mixed = _task_manager(["hellaswag", "arc_challenge"], tasks)
    assert {"arc_challenge", "mmlu", "hellaswag"} <= set(mixed.all_tasks)


def test_a_dataset_this_machine_cannot_read_offline_names_the_two_routes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mine = tmp_path / "tasks"
    mine.mkdir()
    (mine / "hub_only.yaml").write_text(json.dumps(HUB_ONLY_TASK))
    out = tmp_path / "g" / "v1"
    assert main(["golden", "freeze", "--task", "hub_only", "--include-path", str(mine), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "hf download" in err and "dataset_path: parquet" in err and "HF_DATASETS_CACHE" in err
    assert not out.exists()


def test_the_freezes_prompt_check_names_an_item_whose_prompt_differs(std):
    """check_prompts is what every freeze runs on the temporary folder: a prompt that is not the original
    task's is an error naming the task and the item (and the folder is never renamed into place): our failure,
    exit 3, not the user's input."""
    from quantize.errors import RuntimeFailure
    from quantize.golden.freeze import load_tasks
    from quantize.golden.prompts import check_prompts, prompts

    _, tasks, out, _, _ = std
    original = prompts(load_tasks(["arc_easy"], tasks)["arc_easy"])
    check_prompts(out, {"arc_easy": original}, {"arc_easy": "golden_id"})  # the frozen set as written: no error
    original[3] = [c.replace("Question:", "Q:") for c in original[3]]
    with pytest.raises(RuntimeFailure, match="arc_easy: the frozen item arc_easy-00003 would be scored on another"):
        check_prompts(out, {"arc_easy": original}, {"arc_easy": "golden_id"})
