"""Gating what any engine computed, from lm-eval's own samples (quantize/evaluate/samples.py): lm-eval runs the
tasks `quantize golden export` writes, with its own `simple_evaluate` and `EvaluationTracker` (what its CLI calls)
or its CLI itself, and `quantize gate` reads the output folder as one side. The same model passes against its own
`quantize eval` scores, a damaged copy is rejected, and samples that are not the suite's items on the suite's
prompts, or files that are not regular, are exit 2 naming what is wrong."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import quantize
from quantize.cli import main
from quantize.errors import UsageError
from quantize.evaluate import samples as samples_mod
from quantize.evaluate.samples import find_run, looks_like_samples, read_samples
from quantize.evaluate.suite import open_suite
from quantize.flows.gate import check_sample_metrics, check_target, is_checkpoint
from quantize.gates.policy import load_policy
from quantize.records import ScoreDoc, read, to_json

from conftest import ROOT, nan_copy, small_golden, suite_file

RULES = """rules:
  - {task: core_facts, metric: acc, margin: 0.3}
  - {task: core_cloze, metric: acc, margin: 0.3}
  - {task: core_prose, metric: perplexity, max_ratio: 1.25}
"""


@pytest.fixture(autouse=True)
def module_cache(tmp_path_factory, monkeypatch):
    """One score cache for the module: the tiny model's baseline is scored once."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-samples"))


def lm_eval_samples(
    model: Path, include: Path, tasks: list[str], out: Path, seed: int = 0, backend: str = "hf", args: str = ""
) -> Path:
    """lm-eval's own run with --log_samples, as its CLI makes it: simple_evaluate with an EvaluationTracker, then
    the tracker's results file and one samples file per task (under OUT/<model name>/). `backend` and `args`: another
    lm-eval model and its arguments (default: hf on `model` in float32)."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tracker = EvaluationTracker(output_path=str(out))
    r = simple_evaluate(
        model=backend,
        model_args=args or f"pretrained={model},dtype=float32",
        tasks=tasks,
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        batch_size=4,
        device="cpu",
        log_samples=True,
        evaluation_tracker=tracker,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        bootstrap_iters=0,
    )
    found = r.pop("samples")
    tracker.save_results_aggregated(results=r, samples=found)
    for task in r["configs"]:
        tracker.save_results_samples(task_name=task, samples=found[task])
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("samples")
    golden = small_golden(base)
    suite = suite_file(base / "suite.yaml", golden)
    policy = base / "gate.yaml"
    policy.write_text(f"name: samples\nsuite: {suite}\n{RULES}")
    tasks = base / "tasks"
    assert main(["golden", "export", str(suite), str(tasks)]) == 0
    names = open_suite(suite).tasks
    good = lm_eval_samples(tiny_model, tasks, names, base / "good")
    damaged = shutil.copytree(tiny_model, base / "nan-model")
    nan_copy(tiny_model / "model.safetensors", damaged / "model.safetensors")
    bad = lm_eval_samples(damaged, tasks, names, base / "nan")
    return {"suite": suite, "policy": policy, "tasks": tasks, "good": good, "nan": bad, "names": names}


def gate(policy: Path, baseline: Path, candidate: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["gate", str(policy), "--baseline", str(baseline), "--candidate", str(candidate), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def run_folder(samples: Path) -> Path:
    return find_run(samples).folder


def edit(folder: Path, task: str, change) -> None:
    """Rewrite a task's samples file line by line: change(sample) returns the sample to write, or None to drop it."""
    path = find_run(folder).samples[task]
    kept = [s for line in path.read_text().splitlines() if (s := change(json.loads(line))) is not None]
    path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in kept))


def test_samples_of_the_same_model_pass_against_its_quantize_scores(world, tiny_model, capsys):
    code, out, err = gate(world["policy"], tiny_model, world["good"], capsys, "--json", "--quiet")
    assert code == 0, err
    v = json.loads(out)
    assert v["verdict"] == "pass" and v["provenance"]["candidate_scores"] == "file"
    doc = read_samples(open_suite(world["suite"]), world["good"])
    assert v["provenance"]["candidate"]["checkpoint"]["identity_sha256"] == doc.provenance.checkpoint.identity_sha256
    note = next(n for n in v["notes"] if "lm-eval samples (hf)" in n)
    assert f"all {sum(t.n for t in doc.tasks.values())} items both sides scored were checked first" in note


def test_the_provenance_says_what_ran(world):
    doc = read_samples(open_suite(world["suite"]), world["good"])
    p = doc.provenance
    assert (p.backend, p.engine, p.dtype, p.device) == ("hf", "lm-eval samples (hf)", "float32", "cpu")
    assert p.model_args.startswith("pretrained=") and p.lm_eval_version == __import__("lm_eval").__version__
    run = find_run(world["good"])
    assert set(p.samples) == {run.results.name, *(f.name for f in run.samples.values())}
    lines = "".join(f"{n} {h}\n" for n, h in sorted(p.samples.items()))
    assert p.checkpoint.identity_sha256 == __import__("hashlib").sha256(lines.encode()).hexdigest()
    assert sorted(doc.tasks) == sorted(world["names"]) and doc.tasks["core_facts"].n == 24


def test_samples_as_the_baseline_beside_a_score_file(world, tiny_model, tmp_path, capsys):
    """Either side may be samples; the other may be a score file `quantize eval --json --items` wrote."""
    scores = tmp_path / "scores.json"
    scores.write_text(to_json(quantize.score(world["suite"], tiny_model)))
    code, out, err = gate(world["policy"], world["good"], scores, capsys, "--quiet")
    assert code == 0, err
    assert "the baseline is lm-eval samples (hf)" in out


def test_samples_of_a_damaged_copy_are_rejected(world, tiny_model, capsys):
    code, out, err = gate(world["policy"], tiny_model, world["nan"], capsys, "--quiet")
    assert code == 1, err
    assert "REJECTED" in out and "NaN or infinity" in out


def test_samples_from_an_openai_compatible_server_pass(world, tiny_model, tmp_path, capsys):
    """lm-eval's local-completions, the backend a vLLM, SGLang or llama.cpp server is scored with, against an
    OpenAI-compatible endpoint on a free port (tests/completions_server.py, the tiny model in float32, stopped after):
    lm-eval's token-id requests and echoed log-probabilities come back as samples with every item's answer and
    log-likelihoods those of `quantize eval`, and the gate passes them."""
    pytest.importorskip("tenacity", reason="lm-eval's API models need tenacity (the test extra: `make setup`)")
    from completions_server import serve

    with serve(tiny_model) as (url, server):
        args = f"base_url={url},model=tiny,tokenizer_backend=huggingface,tokenizer={tiny_model},max_length=512"
        out = lm_eval_samples(tiny_model, world["tasks"], world["names"], tmp_path / "server", args=args,
                              backend="local-completions")  # fmt: skip
    assert server.requests > 0
    suite = open_suite(world["suite"])
    doc = read_samples(suite, out)
    assert doc.provenance.backend == "local-completions" and f"base_url={url}" in doc.provenance.model_args
    ours = quantize.score(world["suite"], tiny_model)
    for task, t in ours.tasks.items():
        theirs = {i.id: i for i in doc.tasks[task].items}
        assert sorted(theirs) == sorted(i.id for i in t.items), task
        for item in t.items:
            got = theirs[item.id]
            if t.output_type != "loglikelihood_rolling":
                assert got.score == item.score, (task, item.id)
            lls = list(zip(getattr(item, "lls", None) or [item.ll], getattr(got, "lls", None) or [got.ll], strict=True))
            assert all(abs(a - b) < 1e-6 * max(10.0, abs(a)) for a, b in lls), (task, item.id, lls)  # float32 sums
    code, text, err = gate(world["policy"], tiny_model, out, capsys, "--quiet")
    assert code == 0, err
    assert "PASS" in text and "lm-eval samples (local-completions)" in text


def test_the_python_api_takes_a_samples_folder(world, tiny_model):
    v = quantize.gate(world["policy"], tiny_model, world["good"])
    assert v.exit_code == 0 and v.provenance.candidate_scores == "file"
    with pytest.raises(UsageError, match="--card writes the verdict"):
        quantize.gate(world["policy"], tiny_model, world["good"], card=True)


def test_eval_reads_a_samples_folder_as_scores_and_caches_no_score(world, capsys, monkeypatch, tmp_path):
    """`quantize eval SUITE SAMPLES` prints what the engine computed, checked as a gate checks it (a damaged run is
    exit 2 naming it), without scoring or caching a score (the golden data lm-eval reads to build the golden
    requests is all the cache gets); the API's `scored` says it was not the cache."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    assert main(["eval", str(world["suite"]), str(world["good"]), "--json", "--items", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    doc = read_samples(open_suite(world["suite"]), world["good"])
    assert (
        printed["key"] == doc.key
        and printed["tasks"]["core_facts"]["items"] == json.loads(to_json(doc))["tasks"]["core_facts"]["items"]
    )
    assert main(["eval", str(world["suite"]), str(world["good"]), "--quiet"]) == 0
    assert "read from lm-eval samples (hf)" in capsys.readouterr().out
    found = quantize.scored(world["suite"], world["good"])
    assert found.cached is False and found.doc.provenance.engine == "lm-eval samples (hf)"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["golden-data"]
    broken = shutil.copytree(run_folder(world["good"]), tmp_path / "broken")
    edit(broken, "core_facts", lambda smp: None if smp["doc_id"] == 0 else smp)
    assert main(["eval", str(world["suite"]), str(broken), "--quiet"]) == 2
    assert "core_facts" in capsys.readouterr().err


def test_a_sequential_policy_decides_on_the_full_items_and_says_so(world, tiny_model, tmp_path, capsys):
    policy = tmp_path / "seq.yaml"
    policy.write_text(f"suite: {world['suite']}\nsequential: {{looks: [0.5, 1.0]}}\n{RULES}")
    code, out, err = gate(policy, tiny_model, world["good"], capsys, "--json", "--quiet")
    assert code == 0, err
    v = json.loads(out)
    assert v["sequential"] is None and any("fixed design" in n for n in v["notes"])


def test_samples_as_the_baseline_of_a_staged_candidate(world, tiny_model, tmp_path, capsys):
    """A baseline read from samples splits the candidate's items into strata like a scored one; every look checks
    the prompts of the items it paired first."""
    policy = tmp_path / "seq.yaml"
    policy.write_text(f"suite: {world['suite']}\nsequential: {{looks: [0.5, 1.0]}}\n{RULES}")
    code, out, err = gate(policy, world["good"], tiny_model, capsys, "--json", "--quiet")
    assert code == 0, err
    v = json.loads(out)
    assert v["sequential"] is not None and any("the baseline is lm-eval samples (hf)" in n for n in v["notes"])


def test_a_pinned_baseline_is_the_samples_identity(world, tiny_model, tmp_path, capsys):
    identity = read_samples(open_suite(world["suite"]), world["good"]).provenance.checkpoint.identity_sha256
    policy = tmp_path / "pinned.yaml"
    for pin, code in ((identity, 0), ("1" * 64, 2)):
        policy.write_text(f"suite: {world['suite']}\nbaseline_scores_sha256: '{pin}'\n{RULES}")
        found, _, err = gate(policy, world["good"], tiny_model, capsys, "--quiet")
        assert found == code, err


def test_agreement_rules_are_refused_for_samples(world, tiny_model, tmp_path, capsys):
    policy = tmp_path / "agree.yaml"
    policy.write_text(f"suite: {world['suite']}\n{RULES}  - {{agreement: kl, max: 0.2}}\n")
    code, _, err = gate(policy, tiny_model, world["good"], capsys)
    assert code == 2 and "token distributions" in err and "without agreement rules" in err


def copied(world, tmp_path, which: str = "good") -> Path:
    return shutil.copytree(world[which], tmp_path / which)


def changed_prompt_hash(s):
    if s["doc"]["id"] == "facts-00003":
        s["prompt_hash"] = "0" * 64
    return s


def changed_prompt(s):
    """Another prompt, hashed as lm-eval hashes it: the sample is consistent, but not the prompt quantize scored."""
    if s["doc"]["id"] == "facts-00003":
        for args in s["arguments"].values():
            args["arg_0"] = "Q: " + args["arg_0"]
        s["prompt_hash"] = __import__("hashlib").sha256(s["arguments"]["gen_args_0"]["arg_0"].encode()).hexdigest()
    return s


def changed_doc(s):
    if s["doc"]["id"] == "facts-00003":
        s["doc"]["answer"] = (s["doc"]["answer"] + 1) % len(s["doc"]["choices"])
        s["doc_hash"] = (
            __import__("hashlib").sha256(json.dumps(s["doc"], indent=2, ensure_ascii=False).encode()).hexdigest()
        )
    return s


@pytest.mark.parametrize(
    "change,says",
    [
        (changed_prompt_hash, "prompt_hash or target_hash not the hash of what the sample records"),
        (changed_prompt, "requests (contexts, continuations or generation settings) other than lm-eval"),
        (changed_doc, "a doc that differs from the golden item: 1 item(s), e.g. facts-00003"),
        (lambda s: None if s["doc"]["id"] == "facts-00003" else s, "missing (no sample): 1 item(s), e.g. facts-00003"),
        (
            lambda s: {**s, "doc": {**s["doc"], "id": "facts-99999"}} if s["doc"]["id"] == "facts-00003" else s,
            "facts-99999",
        ),
    ],
    ids=["prompt-hash", "prompt", "doc", "missing", "extra"],
)
def test_samples_that_are_not_the_suites_items_on_its_prompts_are_exit_2_naming_them(
    world, tiny_model, tmp_path, capsys, change, says
):
    folder = copied(world, tmp_path)
    ids = [json.loads(line)["doc"]["id"] for line in find_run(folder).samples["core_facts"].read_text().splitlines()]
    assert "facts-00003" in ids
    edit(folder, "core_facts", change)
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2, err
    assert says in err and "core_facts" in err


def sign_flipped(s):
    """A rolling document's log-likelihood negated consistently in every field, as an engine that flips its sign."""
    ll = -float(s["filtered_resps"][0])
    s["resps"], s["filtered_resps"] = [[str(ll)]], [str(ll)]
    for m in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        s[m][0] = ll
    return s


def test_a_log_likelihood_above_0_is_exit_2_naming_the_item(world, tiny_model, tmp_path, capsys):
    """A review: a sign-flipped engine's prose gave a perplexity ratio of 0 and a PASS."""
    folder = copied(world, tmp_path)
    edit(folder, "core_prose", sign_flipped)
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2, err
    assert "core_prose item" in err and "at most 0" in err and "Traceback" not in err, err


def _sha(text: str) -> str:
    return __import__("hashlib").sha256(text.encode()).hexdigest()


def flipped_acc(s):
    if s["doc"]["id"] == "facts-00003":
        s["acc"] = 1.0 - float(s["acc"])
    return s


def moved_target(s):
    """The target moved to another choice, its hash recomputed: consistent, but not the golden item's answer."""
    if s["doc"]["id"] == "facts-00003":
        s["target"] = (int(s["target"]) + 1) % len(s["doc"]["choices"])
        s["target_hash"] = _sha(str(s["target"]))
    return s


def twice(folder: Path, task: str, item: str) -> None:
    path = find_run(folder).samples[task]
    lines = path.read_text().splitlines()
    lines += [line for line in lines if json.loads(line)["doc"]["id"] == item]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "change,says",
    [
        (flipped_acc, "an `acc` its log-likelihoods do not give: 1 item(s), e.g. facts-00003"),
        (lambda s: {**s, "acc": 5.0} if s["doc"]["id"] == "facts-00003" else s, "an `acc` that is not 0 or 1"),
        (lambda s: {**s, "acc": "1"} if s["doc"]["id"] == "facts-00003" else s, "an `acc` that is not 0 or 1"),
        (moved_target, "a target other than the golden item's right choice: 1 item(s), e.g. facts-00003"),
        (None, "two samples of one document (doc_id) and filter: 1 item(s), e.g. facts-00003"),
    ],
    ids=["acc-flipped", "acc-5", "acc-string", "target-moved", "twice"],
)
def test_multiple_choice_samples_are_held_to_their_log_likelihoods_and_the_golden_answer(
    world, tiny_model, tmp_path, capsys, change, says
):
    """The gate read a multiple-choice sample's `acc` as written: every item set right passed a candidate whose
    log-likelihoods were the baseline's, and the same file as the baseline rejected an identical candidate; an
    `acc` of 5 or "1" counted; a target moved to another choice (its hash recomputed) was taken; a second sample of
    one document, first in the file, decided the item (a review's repros). Each is exit 2 naming the item."""
    folder = copied(world, tmp_path)
    if change is None:
        twice(folder, "core_facts", "facts-00003")
    else:
        edit(folder, "core_facts", change)
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2, err
    assert says in err and "core_facts" in err


def other_continuation(s):
    """Each request's continuation without the delimiter the golden task gives it (a run on a task YAML that sets
    its own target_delimiter): the first context and the target are the same, so every hash still holds."""
    for args in s["arguments"].values():
        args["arg_1"] = args["arg_1"].lstrip()
    return s


def described(s):
    """A description before every context, its prompt_hash recomputed: the run of a task YAML that adds one."""
    for args in s["arguments"].values():
        args["arg_0"] = "Note: " + args["arg_0"]
    s["prompt_hash"] = _sha(s["arguments"]["gen_args_0"]["arg_0"])
    return s


@pytest.mark.parametrize(
    "task,change,both",
    [("core_facts", other_continuation, False), ("core_cloze", described, True)],
    ids=["continuations", "description-on-both-sides"],
)
def test_samples_are_held_to_the_requests_the_golden_task_builds(
    world, tiny_model, tmp_path, capsys, task, change, both
):
    """Only the first context's hash was compared: a run whose continuations lost the golden task's delimiter
    (every hash intact) passed against quantize's own scores, and two runs of a task YAML that adds a description
    passed against each other (their prompts agree, the golden set's are others). Each sample's requests are now
    compared with the ones lm-eval builds from the golden YAML: exit 2 naming the task and the items."""
    folder = copied(world, tmp_path)
    edit(folder, task, change)
    code, _, err = gate(world["policy"], folder if both else tiny_model, folder, capsys)
    assert code == 2, err
    assert f"the samples of {task} are not the golden items" in err
    assert "requests (contexts, continuations or generation settings) other than lm-eval" in err


def results_edit(folder: Path, change) -> None:
    path = find_run(folder).results
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "change,says",
    [
        (lambda r: r["versions"].update(core_cloze=2.0), "task core_cloze ran at version 2.0"),
        (lambda r: r["config"].update(fewshot_seed=1234), "fewshot_seed 1234"),
        # the suite's seed is 0: `False` and `0.0` compared equal to it (a review)
        (lambda r: r["config"].update(random_seed=False), "random_seed False"),
        (lambda r: r["config"].update(numpy_seed=0.0), "numpy_seed 0.0"),
        # a run on edited task YAMLs records them: the same version, other continuations (a review's repro)
        (
            lambda r: r["configs"]["core_facts"].update(doc_to_target="{{ answer }}", doc_to_choice="{{ choices }}"),
            "task core_facts ran with another doc_to_target, doc_to_choice",
        ),
    ],
    ids=["task-version", "seed", "seed-false", "seed-float", "edited-yaml"],
)
def test_another_task_version_or_seed_is_exit_2(world, tiny_model, tmp_path, capsys, change, says):
    folder = copied(world, tmp_path)
    results_edit(folder, change)
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2 and says in err, err


def test_a_task_missing_or_extra_is_exit_2(world, tiny_model, tmp_path, capsys):
    folder = copied(world, tmp_path)
    run = find_run(folder)
    run.samples["core_kv"].unlink()
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2 and "no samples of core_kv" in err and "--tasks core_analogy,core_cloze" in err
    date = run.results.name.removeprefix("results_").removesuffix(".json")
    shutil.copy(run.samples["core_facts"], run.folder / f"samples_core_kv_{date}.jsonl")
    shutil.copy(run.samples["core_facts"], run.folder / f"samples_hellaswag_{date}.jsonl")
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2 and "samples of hellaswag, which the suite does not score" in err


def refusal_in_thread(policy: Path, baseline: Path, candidate: Path) -> str:
    """quantize.gate's refusal (what the CLI prints with exit 2), in a thread that must end within 60 s: a reader
    that opened a FIFO would block forever."""
    said: list[str] = []

    def run() -> None:
        try:
            quantize.gate(policy, baseline, candidate)
        except UsageError as e:
            said.append(str(e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the gate blocked on a FIFO"
    assert said, "the gate did not refuse"
    return said[0]


def test_a_fifo_is_refused_without_hanging(world, tiny_model, tmp_path):
    folder = copied(world, tmp_path)
    path = find_run(folder).samples["core_facts"]
    path.unlink()
    os.mkfifo(path)
    said = refusal_in_thread(world["policy"], tiny_model, folder)
    assert "not a regular file" in said and path.name in said
    path.unlink()
    os.mkfifo(run_folder(folder) / "samples_x.jsonl")  # a FIFO of no run: named, never opened
    shutil.copy(find_run(world["good"]).samples["core_facts"], path)
    said = refusal_in_thread(world["policy"], tiny_model, folder)
    assert "samples_x.jsonl" in said and "no results file" in said


def test_an_oversized_samples_file_is_exit_2(world, tiny_model, capsys, monkeypatch):
    monkeypatch.setattr(samples_mod, "MAX_SAMPLES_BYTES", 1000)
    code, _, err = gate(world["policy"], tiny_model, world["good"], capsys)
    assert code == 2 and "at most 1,000 are read here" in err


def test_a_samples_folder_is_a_side_not_a_checkpoint(world, tmp_path):
    good, folder = world["good"], run_folder(world["good"])
    for p in (good, folder, find_run(good).results):  # lm-eval's --output_path, its model folder, a results file
        assert looks_like_samples(p) and not is_checkpoint(p)
        check_target(p)
    with pytest.raises(UsageError, match="a sweep gates checkpoint folders"):
        check_target(good, "a sweep gates checkpoint folders, not score files")
    assert not looks_like_samples(world["tasks"]) and not looks_like_samples(ROOT / "golden")


def test_a_run_without_log_samples_says_so(world, tiny_model, tmp_path, capsys):
    folder = copied(world, tmp_path)
    for f in find_run(folder).samples.values():
        f.unlink()
    code, _, err = gate(world["policy"], tiny_model, folder, capsys)
    assert code == 2 and "run lm-eval with --log_samples" in err, err


def test_several_runs_need_the_results_file_of_one(world, tmp_path, capsys):
    folder = copied(world, tmp_path)
    run = find_run(folder)
    date = run.results.name.removeprefix("results_").removesuffix(".json")
    other = date.replace(date[:4], str(int(date[:4]) + 1), 1)
    for p in (run.results, *run.samples.values()):
        shutil.copy(p, p.with_name(p.name.replace(date, other)))
    with pytest.raises(UsageError, match="holds 2 lm-eval runs"):
        find_run(folder)
    suite = open_suite(world["suite"])
    assert read_samples(suite, run.results).tasks["core_facts"].n == 24  # the results file picks its run


def test_a_metric_a_rule_needs_must_be_in_the_samples(world, tmp_path):
    policy = tmp_path / "norm.yaml"
    policy.write_text(f"suite: {world['suite']}\nrules:\n  - {{task: core_facts, metric: acc_norm, margin: 0.3}}\n")
    doc = read_samples(open_suite(world["suite"]), world["good"])
    with pytest.raises(UsageError, match="needs acc_norm per item of core_facts"):
        check_sample_metrics(load_policy(policy), doc, world["good"])
    assert read(ScoreDoc, _written(doc, tmp_path)) == doc  # the record round-trips with its new fields


def _written(doc: ScoreDoc, tmp_path: Path) -> Path:
    path = tmp_path / "doc.json"
    path.write_text(to_json(doc))
    return path


def test_generation_samples_restore_as_quantize_scores_them(tiny_model, tmp_path):
    """A generate_until set made with `golden new` (a regex filter): the responses read from lm-eval's written samples
    are the ones quantize's own scoring of the same model records, item for item."""
    words = ["the of a", "in that it", "and to is", "for as with", "on was he", "at by this"]
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"prompt": w, "answer": w.split()[-1]}) + "\n" for w in words))
    golden = tmp_path / "gen" / "v1"
    quantize.golden_new(golden, src, "generate", regex=r"(\w+)", max_gen_toks=4)
    suite = suite_file(tmp_path / "gen.yaml", golden, extra="backend: hf\n")
    quantize.golden_export(suite, tmp_path / "tasks")
    opened = open_suite(suite)
    doc = read_samples(opened, lm_eval_samples(tiny_model, tmp_path / "tasks", opened.tasks, tmp_path / "out"))
    ours = quantize.score(suite, tiny_model)
    for task in opened.tasks:
        theirs, mine = doc.tasks[task], ours.tasks[task]
        assert theirs.filter == mine.filter == "regex" and theirs.n == len(words)
        assert [(i.id, i.response, i.score, i.prompt_sha256) for i in theirs.items] == [
            (i.id, i.response, i.score, i.prompt_sha256) for i in mine.items
        ]


def test_lm_evals_own_command_line_as_export_prints_it(world, tiny_model, tmp_path, capsys):
    """The transformers line `golden export` prints, run as printed (MODEL and RESULTS filled in) through lm-eval's
    own CLI in a subprocess; its output gates against the same model's `quantize eval` scores."""
    out = tmp_path / "tasks"
    assert main(["golden", "export", str(world["suite"]), str(out)]) == 0
    line = next(x.strip() for x in capsys.readouterr().out.splitlines() if x.strip().startswith("lm_eval --model hf"))
    line = line.replace("pretrained=MODEL", f"pretrained={tiny_model},dtype=float32").replace(
        "RESULTS", str(tmp_path / "results")
    )
    argv = [sys.executable, "-m", "lm_eval", *line.split()[1:], "--device", "cpu", "--batch_size", "4"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    code, _, err = gate(world["policy"], tiny_model, tmp_path / "results", capsys, "--quiet")
    assert code == 0, err


def test_an_acc_norm_is_held_to_its_log_likelihoods_per_character():
    """`acc_norm` (gates/std.yaml's rule on arc_easy and hellaswag) was checked only to be 0 or 1: set to 0 on every
    sample, identical log-likelihoods were REJECTED (a review's repro). It is lm-eval's: the highest log-likelihood
    per character of the choice is the right one."""
    from quantize.evaluate.samples import _choice_problem

    s = {"target": 0, "filtered_resps": [[-1.0, False], [-2.0, False]], "acc": 1.0}
    choices = ["a", "bbbbbbbb"]  # per character: -1.0 against -0.25, so the normalised pick is choice 1
    assert _choice_problem({**s, "acc_norm": 0.0}, 0, choices) is None
    assert _choice_problem({**s, "acc_norm": 1.0}, 0, choices) == "an `acc_norm` its log-likelihoods do not give"
    assert _choice_problem({**s, "acc_norm": 1.0}, 0, ["aaaaaaaa", "b"]) is None


def test_a_run_at_another_window_than_the_suites_max_length_is_exit_2(world, tiny_model, tmp_path, capsys):
    """A suite of max_length 32 took a run made at the model's full length as its samples: rolling documents cut
    to other windows on the two sides, and the same model was REJECTED (a review's repro)."""
    suite = tmp_path / "short.yaml"
    suite.write_text(world["suite"].read_text() + "max_length: 32\n")
    policy = tmp_path / "short-gate.yaml"
    policy.write_text(world["policy"].read_text().replace(f"suite: {world['suite']}", f"suite: {suite}"))
    code, _, err = gate(policy, world["good"], tiny_model, capsys)
    assert code == 2 and "scores with max_length=32" in err, err


def _first(change):
    """change(sample) on the first sample of the file only."""
    done = []

    def once(s):
        if done:
            return s
        done.append(1)
        return change(s)

    return once


@pytest.mark.parametrize(
    "task,change",
    [
        ("core_facts", lambda s: {**s, "doc_id": str(s["doc_id"])}),
        ("core_facts", lambda s: {**s, "doc_id": None}),
        ("core_facts", lambda s: {k: v for k, v in s.items() if k != "target"}),
        ("core_facts", lambda s: {**s, "arguments": []}),
        ("core_cloze", lambda s: {**s, "filtered_resps": []}),
        ("core_prose", lambda s: {**s, "filtered_resps": []}),
    ],
    ids=["doc-id-text", "doc-id-null", "no-target", "no-arguments", "no-responses", "rolling-no-responses"],
)
def test_a_sample_of_another_shape_is_exit_2_naming_the_file(world, tmp_path, capsys, task, change):
    """Each of these ended in exit 3 (TypeError, KeyError, IndexError) past the reader's checks (a review's repros)."""
    folder = copied(world, tmp_path)
    edit(folder, task, _first(change))
    assert main(["eval", str(world["suite"]), str(folder)]) == 2
    err = capsys.readouterr().err
    assert "is not a sample lm-eval writes" in err and "Traceback" not in err and "failed" not in err


@pytest.mark.parametrize(
    "change",
    [lambda r: r.update(date=1e20), lambda r: r.update(date=float("nan")), lambda r: r["results"].update(core_kv="x")],
    ids=["date-huge", "date-nan", "results-text"],
)
def test_a_results_file_of_odd_values_is_read_or_refused_never_a_crash(world, tmp_path, capsys, change):
    folder = copied(world, tmp_path)
    results_edit(folder, change)
    assert main(["eval", str(world["suite"]), str(folder)]) in (0, 2)
    assert "failed" not in capsys.readouterr().err


def test_an_exact_match_is_held_to_its_response_and_target(tiny_model, tmp_path, capsys):
    """A generation sample's exact_match was read as written: every response set to "WRONG" and every
    exact_match to 1 PASSED (a review's repro). It is lm-eval's own metric on the response and the target, with
    the task's options (the answers set: ignore_case, regexes_to_ignore)."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'answers' / 'v1'}\nsubset: smoke\n")
    assert main(["golden", "export", str(suite), str(tmp_path / "tasks")]) == 0
    run = lm_eval_samples(tiny_model, tmp_path / "tasks", ["answers_facts"], tmp_path / "run")
    assert main(["eval", str(suite), str(run)]) == 0  # as lm-eval wrote it
    edit(run, "answers_facts", lambda s: {**s, "exact_match": 1.0})  # the tiny model answers none right
    assert main(["eval", str(suite), str(run)]) == 2
    assert "an `exact_match` its response and target do not give" in capsys.readouterr().err


def test_one_sample_a_filter_pipeline_is_read_and_a_document_lacking_one_is_named(world, tmp_path, capsys):
    """lm-eval writes one sample per document and filter pipeline (gsm8k in golden/std has two): a second filter's
    samples were refused as "two samples of one document", and a document without the first sample's filter was
    a StopIteration (exit 3). Every document must have one sample of each filter the file holds."""
    folder = copied(world, tmp_path)
    path = find_run(folder).samples["core_facts"]
    lines = path.read_text().splitlines()
    other = [json.dumps({**json.loads(line), "filter": "other"}) for line in lines]
    path.write_text("\n".join(lines + other) + "\n")
    assert main(["eval", str(world["suite"]), str(folder)]) == 0  # two pipelines, each on every document
    capsys.readouterr()
    path.write_text("\n".join(lines + other[1:]) + "\n")  # the first document lacks the second pipeline
    assert main(["eval", str(world["suite"]), str(folder)]) == 2
    err = capsys.readouterr().err
    assert "not one sample for each filter (none, other)" in err and "failed" not in err
