"""Few-shot prompts pinned per item, and the prompt check that closes every `golden freeze`.

lm-eval draws a task's few-shot examples from one random sequence per task (`Random(fewshot_random_seed)`, 1234 by
default), advanced once per document in document order. A run over a subset of the documents (lm-eval's `samples=`,
which the sequential gate uses) draws other examples for the same item, so a candidate scored in stages would
see other prompts than its baseline's full run. Freezing therefore replays lm-eval's own full run once, with the
task's own code: the sampler seeded as `simple_evaluate` seeds it, every document's requests built in order
(`Task.build_all_requests`), and keeps, per item,

    golden_context   the prompt before the item's own question: the description and the drawn examples, exactly
                     as lm-eval rendered them (its delimiters, its n + 1 draw when the shot split is the scored one)
    golden_shots     the ids of the drawn examples (data/<task>.fewshot.jsonl holds them, in first-use order)

The frozen task is zero-shot with `description: golden_context`, so lm-eval renders `golden_context + question`,
the full run's prompt, whatever subset is scored. A zero-shot task is frozen as it is.

`prompts` gives every document's contexts as lm-eval builds them; `check_prompts` compares the written set's with
the original task's, item by item, before the version folder is renamed into place.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize.compat.lm_eval import recording_draws, sandboxed_metrics, templates_refused
from quantize.errors import RuntimeFailure, UsageError
from quantize.golden.items import CONTEXT_FIELD, SHOTS_FIELD  # noqa: F401 - the pins' fields (items.py checks them)
from quantize.golden.manifest import lm_eval_tasks, verify

LM_EVAL_FEWSHOT_SEED = 1234  # simple_evaluate's default fewshot_random_seed


def requests(task: Any, samples: list[int] | None = None) -> dict[int, list[tuple[Any, ...]]]:
    """Every scored document's requests, each one's arguments as lm-eval passes them to the model (context and
    continuation; context and generation settings; a rolling document), in lm-eval's order, by the document's
    index in the task's evaluation documents, as lm-eval builds them in a run without a chat template.
    `samples`: only these documents (lm-eval's `samples=`; it renumbers them from 0)."""
    task.build_all_requests(rank=0, world_size=1, samples=samples, cache_requests=False)
    index = sorted(samples) if samples else None
    out: dict[int, list[tuple[Any, ...]]] = {}
    for inst in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
        doc = index[inst.doc_id] if index else inst.doc_id
        out.setdefault(doc, []).append(inst.args)  # what lm-eval's samples record
    return out


def prompts(task: Any, samples: list[int] | None = None) -> dict[int, list[str]]:
    """Every scored document's request contexts (one per request: a multiple-input task has one per choice),
    by the document's index in the task's evaluation documents (`requests`)."""
    return {doc: [args[0] for args in reqs] for doc, reqs in requests(task, samples).items()}


@dataclass
class Pinned:
    """A few-shot task's pins: per document its context prefix and shot ids, and the shots in first-use order."""

    contexts: list[str]
    shot_ids: list[list[str]]
    shots: list[dict[str, Any]]
    full_run: dict[int, list[str]]  # the original task's prompts in a full run, for check_prompts


def _own_question(task: Any) -> dict[int, list[str]]:
    """Each document's contexts without description or shots: the part of the prompt the item itself makes."""
    saved = task.config.num_fewshot, task.config.description
    task.set_config("num_fewshot", 0)
    task.set_config("description", None)
    try:
        return prompts(task)
    finally:
        task.set_config("num_fewshot", saved[0])
        task.set_config("description", saved[1])


def pin_shots(task: Any, seed: int) -> Pinned:
    """Replay lm-eval's full run of a few-shot task (module docstring) and cut each prompt into the part before
    the item's question (its pin) and the question; a prompt that does not end with its own question (a chat
    template, a multiple-input task whose choices' prefixes differ) cannot be pinned and is refused."""
    name = task.config.task
    task.set_fewshot_seed(seed)
    with recording_draws(task) as drawn:
        full = prompts(task)
    if len(drawn) != len(full):
        raise UsageError(
            f"task {name}: lm-eval drew few-shot examples {len(drawn)} times for {len(full)} documents, so they "
            "cannot be pinned per item; freeze it with `num_fewshot: 0`"
        )
    own = _own_question(task)
    contexts, shot_ids, shots, seen = [], [], [], {}
    for doc in sorted(full):
        cuts = {c[: len(c) - len(q)] for c, q in zip(full[doc], own[doc], strict=True) if c.endswith(q)}
        if len(cuts) != 1 or len(full[doc]) != len(own[doc]):
            raise UsageError(
                f"task {name}: the prompt of document {doc} does not end with the document's own question, so its "
                "few-shot examples cannot be pinned; freeze it with `num_fewshot: 0`"
            )
        contexts.append(cuts.pop())
        ids = []
        for shot in drawn[doc]:
            key = json.dumps(shot, sort_keys=True, default=str)
            if key not in seen:
                seen[key] = f"{name}-fewshot-{len(shots):05d}"
                shots.append(shot)
            ids.append(seen[key])
        shot_ids.append(ids)
    return Pinned(contexts, shot_ids, shots, full)


def check_prompts(written: Path, originals: dict[str, dict[int, list[str]]], id_field: dict[str, str]) -> None:
    """The written set, loaded through lm-eval as the scorer loads it, gives every item the prompt the original
    task gave it in a full run; the first difference is an error naming the task and the item."""
    from lm_eval.tasks import TaskManager, get_task_dict

    golden = verify(written)
    with tempfile.TemporaryDirectory(prefix="quantize-prompts-") as tmp:
        include = lm_eval_tasks(golden, Path(tmp), None, sandboxed_metrics())
        with templates_refused(f"golden set {written}"):
            loaded = get_task_dict(sorted(originals), TaskManager(include_path=str(include), include_defaults=False))
        for name, want in originals.items():
            task = loaded[name]
            task.set_fewshot_seed(LM_EVAL_FEWSHOT_SEED)
            got = prompts(task)
            docs = list(task.eval_docs)
            for doc in sorted(want):
                if got.get(doc) != want[doc]:
                    item = docs[doc][id_field[name]] if doc < len(docs) else doc
                    mine = (got.get(doc) or ["(none)"])[0]
                    raise RuntimeFailure(  # the freeze's own fault, not the user's input: exit 3
                        f"task {name}: the frozen item {item} would be scored on another prompt than the original "
                        f"task gives it (frozen {mine[-120:]!r}, original {want[doc][0][-120:]!r}); nothing was "
                        "written. Please report it with the task's YAML"
                    )
