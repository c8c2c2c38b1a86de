"""The reusable GitHub Action: its gate step (quantize/flows/action.py) run with a fake GitHub environment on the
tiny models (summary, outputs, JUnit, exit codes), Hub model ids resolved from a Hub cache built here (weights
identified by their blob names, not read), the cache key the action saves scores under, and action.yml itself
checked against the schema of a composite action's metadata."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantize import records
from quantize.checkpoint import files
from quantize.cli import main as cli
from quantize.errors import UsageError
from quantize.evaluate import cache
from quantize.flows import action
from quantize.flows.gate import open_policy
from quantize.golden.build import Sizes
from quantize.io import sha256_file
from quantize.records import Verdict
from quantize.tables import md_text

from conftest import ROOT, small_golden, suite_file


@pytest.fixture(autouse=True)
def module_cache(tmp_path_factory, monkeypatch):
    """One cache for every test of this module (under the run's base folder), not conftest's per-test one."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-action"))


def _policy(base: Path, name: str, kl_max: float, batch_size: int = 4) -> Path:
    suite = suite_file(base / f"suite-{batch_size}.yaml", base / "golden" / "v1", batch_size=batch_size)
    p = base / f"{name}.yaml"
    p.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n"
        f"  - {{task: core_prose, metric: perplexity, max_ratio: 2.0}}\n  - {{agreement: kl, max: {kl_max}}}\n"
    )
    return p


def _env(tmp_path: Path, policy: Path, baseline: str, candidate: str, **extra: str) -> dict[str, str]:
    (tmp_path / "summary.md").write_text("earlier step\n")
    return {
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output.txt"),
        "QUANTIZE_POLICY": str(policy),
        "QUANTIZE_BASELINE": baseline,
        "QUANTIZE_CANDIDATE": candidate,
        "QUANTIZE_JUNIT": str(tmp_path / "gate.xml"),
        "QUANTIZE_VERDICT": str(tmp_path / "gate.json"),
        **extra,
    }


def _outputs(tmp_path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (tmp_path / "output.txt").read_text().splitlines())


def test_a_pass_writes_summary_outputs_junit_and_verdict(golden, tiny_model, tmp_path):
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), str(tiny_model))
    assert action.main(env) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("earlier step\n")  # appended, as GitHub expects of every step
    assert "✅ PASS" in summary and "| `core_facts acc` | pass |" in summary and "| `agreement kl` | pass |" in summary
    assert _outputs(tmp_path) == {"verdict": "pass", "exit-code": "0"}
    suite = ET.parse(tmp_path / "gate.xml").getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "3" and suite.get("failures") == "0"
    assert records.read(Verdict, tmp_path / "gate.json").verdict == "pass"


def test_a_rejection_fails_the_job_with_its_evidence(golden, tiny_model, tmp_path, capsys):
    """3-bit RTN of the tiny model moves its near-uniform distributions by a mean KL of about 1e-5: past 1e-6."""
    recipe = tmp_path / "w3.yaml"
    out = tmp_path / "w3"
    recipe.write_text(f"method: rtn\nscheme: W3A16\ngroup_size: 32\ncalibration: null\nmodel: {tiny_model}\n")
    recipe.write_text(recipe.read_text() + f"output: {out}\n")
    assert cli(["run", str(recipe), "--quiet"]) == 0
    env = _env(tmp_path, _policy(golden, "strict-kl", 1e-6), str(tiny_model), str(out))
    assert action.main(env) == 1
    assert "❌ REJECTED" in (tmp_path / "summary.md").read_text()
    assert _outputs(tmp_path) == {"verdict": "rejected", "exit-code": "1"}
    failures = ET.parse(tmp_path / "gate.xml").getroot().findall("./testcase/failure")
    assert [f.get("message") for f in failures] == ["agreement kl: regression"]


@pytest.mark.parametrize(
    "change,message",
    [
        ({"QUANTIZE_CANDIDATE": "no/such/folder"}, "neither an existing path"),
        ({"QUANTIZE_CANDIDATE": ""}, "`candidate` input is empty"),
        ({"QUANTIZE_POLICY": ""}, "`policy` input is empty"),
        ({"QUANTIZE_POLICY": "missing-policy.yaml"}, "missing-policy.yaml"),
        ({"QUANTIZE_JUNIT": "/no/such/dir/gate.xml"}, "QUANTIZE_JUNIT"),
    ],
)
def test_bad_input_is_exit_2_and_the_summary_says_what_to_fix(golden, tiny_model, tmp_path, change, message):
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), str(tiny_model)) | change
    assert action.main(env) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "could not run on this input (exit 2)" in summary and md_text(message) in summary
    assert _outputs(tmp_path) == {"verdict": "error", "exit-code": "2"}
    assert not (tmp_path / "gate.json").exists()


def test_the_junit_and_verdict_paths_replace_only_the_gates_own_files(golden, tiny_model, tmp_path, monkeypatch):
    """The action wrote its JUnit and verdict wherever the inputs said, over any file (the policy, a checkpoint's
    weights). Now such a path is exit 2 before the gate runs, the file unchanged; a second run over the first
    run's gate.xml and gate.json replaces them."""
    policy = _policy(tmp_path, "lenient", 0.5)
    shutil.copytree(golden / "golden", tmp_path / "golden")
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    before = {p: p.read_bytes() for p in (policy, cand / "model.safetensors")}
    real_gate = action.run_gate

    def no_gate(*_a: Any, **_k: Any) -> Verdict:
        raise AssertionError("the gate ran before its output paths were checked")

    monkeypatch.setattr(action, "run_gate", no_gate)
    for change, said in [
        ({"QUANTIZE_VERDICT": str(policy)}, "QUANTIZE_VERDICT"),
        ({"QUANTIZE_JUNIT": str(cand / "model.safetensors")}, "is not a JUnit file the gate wrote"),
        ({"QUANTIZE_JUNIT": str(cand / "results.xml")}, "inside the candidate checkpoint"),
        ({"QUANTIZE_JUNIT": str(tmp_path / "gate.json")}, "are one path"),
    ]:
        env = _env(tmp_path, policy, str(tiny_model), str(cand)) | change
        assert action.main(env) == 2
        assert md_text(said) in (tmp_path / "summary.md").read_text(), change
    assert {p: p.read_bytes() for p in before} == before and not (cand / "results.xml").exists()
    monkeypatch.setattr(action, "run_gate", real_gate)
    env = _env(tmp_path, policy, str(tiny_model), str(cand))
    assert action.main(env) == 0
    first = {p: p.read_bytes() for p in (tmp_path / "gate.xml", tmp_path / "gate.json")}
    (tmp_path / "gate.json").write_text((tmp_path / "gate.json").read_text().replace('"pass"', '"inconclusive"'))
    assert action.main(env) == 0
    assert {p: p.read_bytes() for p in first} == first


def test_a_trailing_newline_is_dropped_from_every_input(golden, tiny_model, tmp_path, hub, monkeypatch):
    """What a YAML `|` block leaves (`candidate: |` then the id on its own line): one trailing newline, dropped, and
    the gate runs on what the inputs name; a Hub id with it was exit 3 (huggingface_hub's validation), a path exit 2.
    (The gate itself is stopped: its scores would enter the module's cache under this test's Hub folder.)"""
    policy = _policy(golden, "lenient", 0.5)
    env = _env(tmp_path, policy, str(tiny_model), "org/tiny")
    env = {k: (v + "\n" if k.startswith("QUANTIZE_") else v) for k, v in env.items()}
    env |= {"QUANTIZE_CANDIDATE_REVISION": "\n", "QUANTIZE_CARD": "false\n"}
    ran = []

    def gate(*args: Any, **_k: Any) -> Verdict:
        ran.append(args)
        raise UsageError("stopped by the test")

    monkeypatch.setattr(action, "run_gate", gate)
    assert action.main(env) == 2 and "stopped by the test" in (tmp_path / "summary.md").read_text()
    assert ran == [(str(policy), tiny_model, hub)]


@pytest.mark.parametrize(
    "change,names",
    [
        ({"QUANTIZE_CANDIDATE": "org/tiny\nother"}, "`candidate` input"),
        ({"QUANTIZE_BASELINE": "org/tiny\t"}, "`baseline` input"),
        ({"QUANTIZE_CANDIDATE_REVISION": "main\r\nx"}, "`candidate-revision` input"),
        ({"QUANTIZE_POLICY": "gates/ci.yaml\n\n"}, "`policy` input"),
        ({"QUANTIZE_CARD": "yes"}, "`card` input is 'yes'"),
    ],
)
def test_a_control_character_in_an_input_is_exit_2_naming_it(golden, tiny_model, tmp_path, monkeypatch, change, names):
    monkeypatch.setattr(action, "run_gate", _no_gate)
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), str(tiny_model)) | change
    assert action.main(env) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert md_text(names) in summary and "could not run on this input" in summary


def _no_gate(*_a: Any, **_k: Any) -> Verdict:
    raise AssertionError("the gate ran before its inputs were checked")


def test_an_error_naming_a_path_is_escaped_in_the_summary(golden, tiny_model, tmp_path):
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), str(tiny_model))
    assert action.main(env | {"QUANTIZE_POLICY": "<img src=x onerror=alert(1)>|# x.yaml"}) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "<img" not in summary.replace("\\<img", "") and "\\<img src=x onerror=alert(1)\\>\\|\\# x.yaml" in summary


def test_a_linked_card_is_refused_before_the_gate_runs(golden, tiny_model, tmp_path, monkeypatch):
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    (tmp_path / "environ").write_text("HF_TOKEN=hf_canary_of_the_action_test\n")
    (cand / "README.md").symlink_to(tmp_path / "environ")
    monkeypatch.setattr(action, "run_gate", _no_gate)
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), str(cand), QUANTIZE_CARD="true")
    assert action.main(env) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "README.md" in summary and "symbolic link" in summary and "hf_canary" not in summary
    assert not (tmp_path / "gate.json").exists() and not (tmp_path / "gate.xml").exists()


def test_the_verdict_reaches_the_summary_when_the_card_then_fails(golden, tiny_model, tmp_path, monkeypatch, capsys):
    """The card passes its check, then its README is swapped for a link while the gate runs: the summary and stdout
    hold the verdict, then the failure; the outputs say error, with the card's exit code."""
    cand = tmp_path / "cand"
    shutil.copytree(tiny_model, cand)
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), str(cand))
    assert action.main(env) == 0
    v = records.read(Verdict, tmp_path / "gate.json")
    (tmp_path / "gate.json").unlink()
    (cand / "README.md").write_text("# Mine\n")
    (tmp_path / "environ").write_text("HF_TOKEN=hf_canary_of_the_action_test\n")

    def gate_then_swap(*_a: Any, **_k: Any) -> Verdict:
        (cand / "README.md").unlink()
        (cand / "README.md").symlink_to(tmp_path / "environ")
        return v

    monkeypatch.setattr(action, "run_gate", gate_then_swap)
    capsys.readouterr()
    assert action.main(env | {"QUANTIZE_CARD": "true"}) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert summary.index("✅ PASS") < summary.index("the verdict above stands; writing its files failed (exit 2)")
    assert "symbolic link" in summary and "hf_canary" not in summary
    assert "gate " in capsys.readouterr().out and _outputs(tmp_path) == {"verdict": "error", "exit-code": "2"}


# --- Hub model ids and blob identities ---------------------------------------------------------------


def hub_cache(root: Path, checkpoint: Path, repo: str = "org/tiny", commit: str = "c0ffee" * 6 + "beef") -> Path:
    """The layout snapshot_download leaves: models--ORG--NAME/{blobs/SHA, snapshots/COMMIT/FILE -> blob, refs/main}.
    Safetensors blobs are named by their sha256 (LFS files); others by a 40-hex git sha, as on the Hub."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snap = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    for f in sorted(checkpoint.iterdir()):
        name = sha256_file(f) if f.suffix == ".safetensors" else sha256_file(f)[:40]
        shutil.copyfile(f, repo_dir / "blobs" / name)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / name)
    return snap


@pytest.fixture
def hub(tmp_path, tiny_model, monkeypatch):
    from huggingface_hub import constants

    snap = hub_cache(tmp_path / "hub", tiny_model)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the runner restored the cache: nothing to fetch
    return snap


def test_a_hub_snapshot_is_identified_by_its_blob_names_without_reading_them(hub, monkeypatch):
    want = files.sha256_bytes(f"model.safetensors {sha256_file(hub / 'model.safetensors')}\n".encode())

    def no_reading(*_a: Any) -> str:
        raise AssertionError("a weight byte was read")

    monkeypatch.setattr(files, "sha256_file", no_reading)
    assert files.weights_sha256(hub) == want


def test_rereading_checks_blobs_against_their_names_and_keeps_the_identity(hub, monkeypatch):
    trusted = files.weights_sha256(hub)
    monkeypatch.setenv(files.REREAD, "1")
    assert files.weights_sha256(hub) == trusted
    blob = (hub / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1  # one bit of the last tensor flipped after the download
    blob.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="do not hash to its name"):
        files.weights_sha256(hub)
    monkeypatch.delenv(files.REREAD)
    assert files.weights_sha256(hub) == trusted  # trusting the name: the documented cost of not re-reading


def test_a_copied_out_checkpoint_is_the_same_identity_and_the_same_scores(hub, tiny_model):
    """The Hub snapshot of the tiny model and the folder it came from: the same bytes, one identity (its blob's
    name in the one, its bytes' sha256 in the other, the same line), so the model is scored once."""
    assert files.weights_sha256(hub) == files.weights_sha256(tiny_model)


def test_the_action_gates_a_hub_model_id(golden, tiny_model, tmp_path, hub):
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), "org/tiny")
    assert action.resolve("org/tiny", "", "candidate") == hub
    assert action.main(env) == 0, (tmp_path / "summary.md").read_text()
    v = records.read(Verdict, tmp_path / "gate.json")
    assert v.provenance.candidate.checkpoint.path == str(hub)
    assert action.main(env | {"QUANTIZE_CANDIDATE_REVISION": "v9"}) == 3  # offline: no such revision cached
    assert "failed" in (tmp_path / "summary.md").read_text()


def test_the_action_reads_hub_blobs_back_by_default(golden, tiny_model, tmp_path, hub):
    """No `reread-weights` input: the gate still reads every blob behind an identity while it scores, and a blob
    that does not hash to its name is exit 2 naming it, with no verdict."""
    blob = (hub / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1  # the blob changed after the download: its name no longer holds
    blob.write_bytes(bytes(data))
    env = _env(tmp_path, _policy(golden, "lenient", 0.5), str(tiny_model), "org/tiny")
    assert "QUANTIZE_REREAD_WEIGHTS" not in env and action.main(env) == 2
    summary = (tmp_path / "summary.md").read_text()
    assert md_text(str(blob)) in summary and sha256_file(blob) in summary  # the summary escapes Markdown
    assert _outputs(tmp_path) == {"verdict": "error", "exit-code": "2"} and not (tmp_path / "gate.json").exists()


# --- the cache key ----------------------------------------------------------------------------------------


def _key(policy: Path) -> str:
    return cache.restore_key(open_policy(policy)[1])


def test_the_cache_key_changes_when_and_only_when_what_keys_scores_changes(golden, tmp_path, monkeypatch, capsys):
    base = _key(_policy(golden, "lenient", 0.5))
    assert re.fullmatch(r"quantize-scores-[0-9a-f]{32}", base)
    assert cli(["cache-key", str(_policy(golden, "lenient", 0.5))]) == 0 and capsys.readouterr().out.strip() == base
    # not: the policy's rules, its name, where the policy lies, a comment in the suite
    assert _key(_policy(golden, "another-policy", 0.01)) == base
    elsewhere = tmp_path / "p.yaml"
    shutil.copyfile(_policy(golden, "lenient", 0.5), elsewhere)
    assert _key(elsewhere) == base
    suite = golden / "suite-4.yaml"
    commented = tmp_path / "commented.yaml"
    commented.write_text("# the same suite\n" + suite.read_text())
    pol = tmp_path / "pc.yaml"
    pol.write_text(_policy(golden, "lenient", 0.5).read_text().replace(str(suite), str(commented)))
    assert _key(pol) == base
    # yes: the suite's settings, the golden set, a pinned version
    assert _key(_policy(golden, "lenient", 0.5, batch_size=2)) != base
    other = tmp_path / "g2"
    small_golden(other, Sizes(facts=20, cloze=12, analogy=6, kv=9, prose=4, smoke=3))  # another set: 20 facts
    assert _key(_policy(other, "lenient", 0.5)) != base
    real = cache.metadata.version
    monkeypatch.setattr(cache.metadata, "version", lambda d: "9.9.9" if d == "transformers" else real(d))
    assert _key(_policy(golden, "lenient", 0.5)) != base
    monkeypatch.setattr(cache.metadata, "version", real)
    assert _key(_policy(golden, "lenient", 0.5)) == base
    monkeypatch.setattr(cache, "SCORER_REVISION", cache.SCORER_REVISION + 1)  # our scoring path changed
    assert _key(_policy(golden, "lenient", 0.5)) != base


# --- action.yml ---------------------------------------------------------------------------------------------


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str
    required: bool = False
    default: str | None = None
    deprecationMessage: str | None = None


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str
    value: str


class _Step(BaseModel):
    """A composite action's step, as GitHub's metadata syntax defines it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    id: str | None = None
    if_: str | None = Field(None, alias="if")
    uses: str | None = None
    run: str | None = None
    shell: str | None = None
    with_: dict[str, Any] | None = Field(None, alias="with")
    env: dict[str, str] | None = None
    working_directory: str | None = Field(None, alias="working-directory")
    continue_on_error: bool | None = Field(None, alias="continue-on-error")

    @model_validator(mode="after")
    def _one_kind(self) -> _Step:
        assert (self.uses is None) != (self.run is None), "a step has `uses` or `run`"
        assert self.run is None or self.shell, "a composite `run` step needs `shell`"
        return self


class _Runs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    using: Literal["composite"]
    steps: list[_Step]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    author: str | None = None
    branding: dict[str, str] | None = None
    inputs: dict[str, _Input]
    outputs: dict[str, _Output]
    runs: _Runs


def test_action_yml_is_a_valid_composite_action_wired_to_its_entry():
    text = (ROOT / "action.yml").read_text()
    meta = _Action.model_validate(yaml.safe_load(text))
    assert {"baseline", "candidate", "policy", "cache-key-extra"} <= set(meta.inputs)
    assert set(re.findall(r"inputs\.([\w-]+)", text)) <= set(meta.inputs)  # no expression names a missing input
    ids = [s.id for s in meta.runs.steps]
    for i, step in enumerate(meta.runs.steps):  # a step reads outputs of earlier steps only
        for ref in re.findall(r"steps\.([\w-]+)\.outputs", json.dumps(step.model_dump(by_alias=True))):
            assert ref in ids[:i], (step.name, ref)
    for o in meta.outputs.values():
        assert re.fullmatch(r"\$\{\{ steps\.gate\.outputs\.[\w-]+ \}\}", o.value)
    gate = next(s for s in meta.runs.steps if s.id == "gate")
    assert gate.run == "python -m quantize.flows.action"
    read = set(re.findall(r'(?:env\.get\(|_input\(env, )"(QUANTIZE_\w+)"', Path(action.__file__).read_text()))
    assert read == {k for k in gate.env if k != "QUANTIZE_REREAD_WEIGHTS"}  # every variable the entry reads, set
    assert files.REREAD == "QUANTIZE_REREAD_WEIGHTS"
    key = next(s for s in meta.runs.steps if s.id == "key")
    assert "quantize cache-key" in key.run  # the key comes from the code, not from a list of files to hash
    example = yaml.safe_load((ROOT / ".github" / "workflows" / "gate-checkpoint.example.yml").read_text())
    uses = [s.get("uses") for s in example["jobs"]["gate"]["steps"]]
    assert "./" in uses  # the example workflow runs this action


def test_a_hub_id_the_hub_refuses_is_exit_2_and_refs_may_not_lead_to_another_model(tiny_model, tmp_path, hub):
    """`org/a--b` and other ids huggingface_hub refuses passed our looser pattern and ended in exit 3
    (HFValidationError); a restored Hub cache whose refs/main leads into another model's snapshots made the action
    gate that model's files under this id (a review's repro)."""
    for bad in ("org/a--b", "org/-x", "org/x.", "org/modèle"):
        with pytest.raises(UsageError, match="is not a Hugging Face model id"):
            action.resolve(bad, "", "candidate")
    hub_cache(tmp_path / "hub", tiny_model, "org/other", commit="1" * 40)
    refs = tmp_path / "hub" / "models--org--tiny" / "refs" / "main"
    refs.write_text("../../models--org--other/snapshots/" + "1" * 40)
    with pytest.raises(UsageError, match="is not a snapshot of that model"):
        action.resolve("org/tiny", "", "candidate")
    # the snapshot folder itself a link into the other model's (normpath does not follow it)
    refs.write_text(hub.name)
    shutil.rmtree(hub)
    hub.symlink_to(tmp_path / "hub" / "models--org--other" / "snapshots" / ("1" * 40))
    with pytest.raises(UsageError, match="is not a snapshot of that model"):
        action.resolve("org/tiny", "", "candidate")
    # or one file in it linking to another model's blob
    hub.unlink()
    shutil.copytree(hub.parent.parent.parent / "models--org--other" / "snapshots" / ("1" * 40), hub, symlinks=True)
    for f in hub.iterdir():  # its own links again, as the layout has them
        if f.is_symlink():
            target = f.resolve()
            f.unlink()
            f.symlink_to(Path("..") / ".." / ".." / "models--org--other" / "blobs" / target.name)
    with pytest.raises(UsageError, match="links outside that model's folder"):
        action.resolve("org/tiny", "", "candidate")


def test_the_key_step_takes_a_plain_extra_only_and_goes_on_past_a_bad_policy(tmp_path):
    """action.yml's key step wrote `key=KEY-EXTRA` with EXTRA as given: `linux\\nkey=...` added a line of its own to
    GITHUB_OUTPUT, and so chose the cache key. A policy that does not read stopped the step with an empty summary;
    now the gate step runs and says why."""
    import os
    import subprocess

    step = next(s for s in yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"] if s.get("id") == "key")
    script = step["run"].replace("${{ runner.temp }}", str(tmp_path))
    stub = tmp_path / "bin" / "quantize"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\n[ "$2" = bad.yaml ] && { echo "bad policy" >&2; exit 2; }\necho quantize-scores-0123\n')
    stub.chmod(0o755)
    for policy, extra, code, want in (
        ("p.yaml", "linux-x64", 0, ["key=quantize-scores-0123-linux-x64"]),
        ("p.yaml", "", 0, ["key=quantize-scores-0123"]),
        ("p.yaml", "linux\nkey=quantize-scores-attacker", 2, []),
        ("p.yaml", "a b", 2, []),
        ("bad.yaml", "", 0, ["key=quantize-scores-unkeyed"]),
    ):
        out = tmp_path / "output.txt"
        out.write_text("")
        env = {
            "PATH": f"{stub.parent}:{os.environ['PATH']}",
            "POLICY": policy,
            "EXTRA": extra,
            "GITHUB_OUTPUT": str(out),
            "GITHUB_ENV": str(tmp_path / "env.txt"),
            "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        }
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], env=env, check=False)
        assert done.returncode == code, (policy, extra)
        assert [line for line in out.read_text().splitlines() if line.startswith("key=")] == want
    assert "cache-key-extra" in (tmp_path / "summary.md").read_text()
