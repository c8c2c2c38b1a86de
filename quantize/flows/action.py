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

A model id is fetched with huggingface_hub.snapshot_download, safetensors, JSON, tokenizer and text files only
(never pickles), into the Hub cache the workflow may restore; its weights are then identified by their blob names
(quantize.checkpoint.files.weights_sha256), and the gate reads every such blob back while it scores: a blob that
does not hash to its name is exit 2 and no verdict, whatever `reread-weights` says (that input only moves the
check before the scoring). Everything after the downloads runs offline.

Written: the verdict in Markdown appended to $GITHUB_STEP_SUMMARY, `verdict=` and `exit-code=` lines appended to
$GITHUB_OUTPUT, the JUnit file and the verdict record. The exit code is the gate's: 0 pass, 1 rejected or
inconclusive (fails closed), 2 bad input (the summary says what to fix), 3 a failure of ours or the runner's.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from quantize.errors import EXIT_RUNTIME, EXIT_USAGE, RuntimeFailure, UsageError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what a checkpoint needs to be scored: weights, config, tokenizer; never a pickle
HUB_FILES = ["*.safetensors", "*.json", "tokenizer*", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def resolve(spec: str, revision: str, what: str) -> Path:
    """A side of the gate: a local folder or file as it is, else a Hub model id fetched (module docstring)."""
    if not spec:
        raise UsageError(f"the action's `{what}` input is empty; give a checkpoint folder or a Hub model id")
    if Path(spec).exists():
        return Path(spec)
    if not HUB_ID.match(spec) or ".." in spec:
        raise UsageError(
            f"the action's `{what}` input {spec!r} is neither an existing path (in the workflow's working directory) "
            "nor a Hugging Face model id like org/name; check the path, or the id's spelling"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        return Path(snapshot_download(repo_id=spec, revision=revision or None, allow_patterns=HUB_FILES))
    except RevisionNotFoundError:
        raise UsageError(f"the Hub model {spec} has no revision {revision!r} (`{what}-revision`); check it") from None
    except RepositoryNotFoundError:
        raise UsageError(
            f"the Hub has no model {spec} that this runner may read (`{what}`); check the id, or give the job an "
            "HF_TOKEN for a private or gated model"
        ) from None


def _append(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)


def _failed(env: Mapping[str, str], message: str, code: int) -> int:
    why = "the gate could not run on this input" if code == EXIT_USAGE else "the gate failed"
    _append(env.get("GITHUB_STEP_SUMMARY"), f"### quantize gate: {why} (exit {code})\n\n{message}\n")
    _append(env.get("GITHUB_OUTPUT"), f"verdict=error\nexit-code={code}\n")
    print(f"quantize gate: {message}", file=sys.stderr)
    return code


def run(env: Mapping[str, str]) -> int:
    from quantize.flows.gate import run_gate, save_verdict
    from quantize.gates.render import render_markdown, render_text
    from quantize.io import check_writable

    junit, verdict_path = (
        Path(env.get("QUANTIZE_JUNIT") or "gate.xml"),
        Path(env.get("QUANTIZE_VERDICT") or "gate.json"),
    )
    check_writable(junit, "QUANTIZE_JUNIT")
    check_writable(verdict_path, "QUANTIZE_VERDICT")
    policy = env.get("QUANTIZE_POLICY", "")
    if not policy:
        raise UsageError("the action's `policy` input is empty; give a gate policy file, e.g. gates/ci.yaml")
    baseline = resolve(env.get("QUANTIZE_BASELINE", ""), env.get("QUANTIZE_BASELINE_REVISION", ""), "baseline")
    candidate = resolve(env.get("QUANTIZE_CANDIDATE", ""), env.get("QUANTIZE_CANDIDATE_REVISION", ""), "candidate")
    card = env.get("QUANTIZE_CARD", "false").lower() == "true"
    if card and not candidate.is_dir():
        raise UsageError(f"QUANTIZE_CARD writes the candidate's model card, and {candidate} is no checkpoint folder")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # the downloads are done: scoring reads local files only
        os.environ[var] = "1"
    v = run_gate(policy, baseline, candidate)
    save_verdict(v, junit, verdict_path, candidate if card else None)
    _append(env.get("GITHUB_STEP_SUMMARY"), render_markdown(v))
    _append(env.get("GITHUB_OUTPUT"), f"verdict={v.verdict}\nexit-code={v.exit_code}\n")
    print(render_text(v))
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
