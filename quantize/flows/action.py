"""The entry of the reusable GitHub Action (action.yml at the repository root): resolve the two checkpoints, gate,
and put the verdict where GitHub shows it.

    python -m quantize.flows.action      (the action's gate step; tests call main(env) with a fake environment)

A composite action hands its inputs to no step by itself, so action.yml passes them as environment variables:

    QUANTIZE_POLICY              the gate policy (action.yml's default: gates/ci.yaml of the action's checkout)
    QUANTIZE_BASELINE            a checkpoint folder, a score file, or a Hugging Face model id ("org/name")
    QUANTIZE_CANDIDATE           the same kinds
    QUANTIZE_BASELINE_REVISION   a Hub revision (branch, tag, commit) for an id; empty: main
    QUANTIZE_CANDIDATE_REVISION
    QUANTIZE_JUNIT               JUnit XML path (default gate.xml)
    QUANTIZE_VERDICT             the verdict record's path (default gate.json)
    QUANTIZE_CARD                "true": also write the verdict into a candidate folder's model card

Every input is one line of text: a single trailing newline (what a YAML `|` block in a workflow leaves) is dropped;
any other control character (a newline inside, a tab, a carriage return) is exit 2 naming the input.

A model id is fetched with huggingface_hub.snapshot_download, safetensors, JSON, tokenizer and text files only
(never pickles), into the Hub cache the workflow may restore; its weights are then identified by their blob names
(quantize.checkpoint.files.weights_sha256), and the gate reads every such blob back while it scores: a blob that
does not hash to its name is exit 2 and no verdict, whatever `reread-weights` says (that input only moves the
check before the scoring). Everything after the downloads runs offline.

The JUnit and verdict paths are checked before the downloads and again before the gate scores and writes
(flows/gate.check_verdict_files): an existing file is replaced only where the gate wrote it (an earlier run's
gate.xml or gate.json), never a link or a path inside either checkpoint or the golden set.

Written, in this order: the verdict as text on stdout and in Markdown appended to $GITHUB_STEP_SUMMARY (every name
escaped: quantize/tables.py), then the JUnit file, the verdict record and the card, then `verdict=` and `exit-code=`
lines appended to $GITHUB_OUTPUT; a failure writing a file is reported after the verdict, never instead of it.
The exit code is the gate's: 0 pass, 1 rejected or inconclusive (fails closed), 2 bad input (the summary says what to
fix), 3 a failure of ours or the runner's; where writing a file fails after the verdict, `verdict=error` and that
failure's exit code."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from quantize.errors import EXIT_RUNTIME, EXIT_USAGE, RuntimeFailure, UsageError
from quantize.flows.gate import check_verdict_files, run_gate, save_verdict
from quantize.gates.render import render_markdown, render_text
from quantize.records import JUNIT_FILE, VERDICT_FILE
from quantize.report.card import check_card
from quantize.tables import md_text, printable

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # matched whole (fullmatch: `$` would allow a newline)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit, as the Hub cache names a snapshot folder
# what a checkpoint needs to be scored: weights, config, tokenizer; never a pickle
HUB_FILES = ["*.safetensors", "*.json", "tokenizer*", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def resolve(spec: str, revision: str, what: str) -> Path:
    """A side of the gate: a local folder or file as it is, else a Hub model id fetched (module docstring)."""
    if not spec:
        raise UsageError(f"the action's `{what}` input is empty; give a checkpoint folder or a Hub model id")
    if Path(spec).exists():
        return Path(spec)
    if not HUB_ID.fullmatch(spec) or ".." in spec:
        raise UsageError(
            f"the action's `{what}` input {spec!r} is neither an existing path (in the workflow's working directory) "
            "nor a Hugging Face model id like org/name; check the path, or the id's spelling"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(spec)  # huggingface_hub's own rule (our pattern is looser: `org/a--b` ended in exit 3)
    except HFValidationError as e:
        raise UsageError(
            f"the action's `{what}` input {spec!r} is not a Hugging Face model id ({str(e)[:160]}); check its spelling"
        ) from None
    try:
        return hub_snapshot(
            Path(snapshot_download(repo_id=spec, revision=revision or None, allow_patterns=HUB_FILES)),
            spec,
            revision,
            what,
        )
    except RevisionNotFoundError:
        raise UsageError(f"the Hub model {spec} has no revision {revision!r} (`{what}-revision`); check it") from None
    except RepositoryNotFoundError:
        raise UsageError(
            f"the Hub has no model {spec} that this runner may read (`{what}`); check the id, or give the job an "
            "HF_TOKEN for a private or gated model"
        ) from None


def hub_snapshot(path: Path, spec: str, revision: str, what: str) -> Path:
    """The folder snapshot_download gave for `spec`, held to the Hub cache's layout for that id:
    models--ORG--NAME/snapshots/COMMIT (40 hex digits; the commit itself where `revision` is one), links
    followed, and every link in it inside that model's folder. A restored
    Hub cache decides what an id means offline: a refs/main holding `../../models--org--other/snapshots/...` made
    the action gate another repository's files under this id's name."""
    from huggingface_hub.file_download import repo_folder_name

    real = Path(os.path.realpath(path))  # links followed: a snapshot folder linking into another model's too
    want = repo_folder_name(repo_id=spec, repo_type="model")
    commit = real.name
    if real.parent.name != "snapshots" or real.parent.parent.name != want or not COMMIT.fullmatch(commit):
        raise UsageError(
            f"the Hub cache resolves `{what}` {spec} to {path}, which is not a snapshot of that model "
            f"({want}/snapshots/COMMIT): its refs or folders were changed; clear the Hub cache and run again"
        )
    repo = real.parent.parent
    for f in sorted(real.rglob("*")):  # every link in it stays in that model's folder (its blobs)
        if f.is_symlink() and not Path(os.path.realpath(f)).is_relative_to(repo):
            raise UsageError(
                f"{f} in the Hub cache's snapshot of `{what}` {spec} links outside that model's folder ({repo}); "
                "clear the Hub cache and run again"
            )
    if COMMIT.fullmatch(revision or "") and commit != revision:
        raise UsageError(f"the Hub cache resolves `{what}` {spec}@{revision} to commit {commit}; clear the Hub cache")
    return real


def _input(env: Mapping[str, str], var: str, what: str, default: str = "") -> str:
    """The action input `what` (environment variable `var`): one line, a single trailing newline dropped (a YAML `|`
    block ends with one); any other control character is exit 2 naming the input."""
    value = env.get(var) or default
    value = value.removesuffix("\n").removesuffix("\r")
    if bad := CONTROL.search(value):
        raise UsageError(
            f"the action's `{what}` input ({var}) holds a control character ({printable(bad.group())} at position "
            f"{bad.start() + 1}: {printable(value)[:200]}); give it on one line (in YAML, `{what}: value`, or `>-` "
            "for a folded block)"
        )
    return value


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)


def _failed(env: Mapping[str, str], message: str, code: int, why: str = "") -> int:
    why = why or ("the gate could not run on this input" if code == EXIT_USAGE else "the gate failed")
    _append(env.get("GITHUB_STEP_SUMMARY"), f"### quantize gate: {why} (exit {code})\n\n{md_text(message)}\n")
    _append(env.get("GITHUB_OUTPUT"), f"verdict=error\nexit-code={code}\n")
    print(f"quantize gate: {message}", file=sys.stderr)
    return code


def run(env: Mapping[str, str]) -> int:
    junit = ("QUANTIZE_JUNIT", Path(_input(env, "QUANTIZE_JUNIT", "junit", JUNIT_FILE)))
    verdict_path = ("QUANTIZE_VERDICT", Path(_input(env, "QUANTIZE_VERDICT", "verdict", VERDICT_FILE)))
    policy = _input(env, "QUANTIZE_POLICY", "policy")
    if not policy:
        raise UsageError("the action's `policy` input is empty; give a gate policy file, e.g. gates/ci.yaml")
    check_verdict_files(policy, (), junit, verdict_path)  # before any download: no link, no file of another kind
    revision = _input(env, "QUANTIZE_BASELINE_REVISION", "baseline-revision")
    baseline = resolve(_input(env, "QUANTIZE_BASELINE", "baseline"), revision, "baseline")
    revision = _input(env, "QUANTIZE_CANDIDATE_REVISION", "candidate-revision")
    candidate = resolve(_input(env, "QUANTIZE_CANDIDATE", "candidate"), revision, "candidate")
    check_verdict_files(policy, (baseline, candidate), junit, verdict_path)  # nor a path inside either checkpoint
    card = _input(env, "QUANTIZE_CARD", "card", "false").lower()
    if card not in ("true", "false"):
        raise UsageError(f"the action's `card` input is {card!r}; give true or false")
    if card == "true":  # like the JUnit path: found before scoring, not after it
        check_card(candidate, "QUANTIZE_CARD")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # the downloads are done: scoring reads local files only
        os.environ[var] = "1"
    v = run_gate(policy, baseline, candidate)
    print(render_text(v), flush=True)  # the verdict first: a failure writing a file below hides nothing
    _append(env.get("GITHUB_STEP_SUMMARY"), render_markdown(v))
    try:
        check_verdict_files(policy, (baseline, candidate), junit, verdict_path)  # a file put there meanwhile
        save_verdict(v, junit[1], verdict_path[1], candidate if card == "true" else None)
    except (UsageError, RuntimeFailure) as e:
        return _failed(env, f"{e.says}: {e}", e.exit_code, "the verdict above stands; writing its files failed")
    _append(env.get("GITHUB_OUTPUT"), f"verdict={v.verdict}\nexit-code={v.exit_code}\n")
    return v.exit_code


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return run(env)
    except (UsageError, RuntimeFailure) as e:
        return _failed(env, f"{e.says}: {e}", e.exit_code)
    except Exception as e:  # the job's summary must say that the gate failed, whatever failed
        return _failed(env, f"failed: {type(e).__name__}: {str(e)[:500]}", EXIT_RUNTIME)


if __name__ == "__main__":
    sys.exit(main())
