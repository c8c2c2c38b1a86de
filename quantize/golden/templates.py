"""A golden set's task templates rendered on each task's first item, before a model loads.

lm-eval renders a task's templates (TEMPLATE_FIELDS: a value that is not a field of the document is a Jinja
template) while it builds the task, after the model was loaded: a template that reached for Python, named a
variable the items lack (`{{ nope }}`) or did not parse ended the run in exit 3 after the load, and `golden verify`
passed it (a review). `check_templates` renders each with lm-eval's own `apply_template`, in the sandbox scoring
uses (compat/lm_eval.sandbox_templates), on the task's first item, and refuses the first that fails: exit 2 naming
the set, the task and the field. `golden verify` and scoring (evaluate/score.run_lm_eval, before the model loads)
both run it.
"""

from __future__ import annotations

import json
from typing import Any

from quantize.compat.lm_eval import sandbox_templates
from quantize.errors import UsageError
from quantize.golden.manifest import HINT, GoldenSet, read_items, task_config

# the task settings lm-eval's ConfigurableTask renders with lm_eval.utils.apply_template where they name no field of
# the document (doc_to_text, doc_to_target, doc_to_choice, doc_to_prefix, and the description in fewshot_context)
TEMPLATE_FIELDS = ("description", "doc_to_text", "doc_to_target", "doc_to_choice", "gen_prefix")


def first_item(golden: GoldenSet, task: str) -> dict[str, Any]:
    """The first item of a verified task (verify: a JSON object per line, at least one)."""
    if items := read_items(golden, task, limit=1):
        return items[0]
    raise UsageError(f"{golden.path / golden.entry(task).data} holds no items; {HINT}")


def check_templates(golden: GoldenSet, tasks: list[str] | None = None) -> None:
    """Every template of the set's tasks (`tasks`: these only) rendered on the task's first item as lm-eval renders
    it (module docstring); the first that fails is a UsageError naming the set, the task and the field."""
    sandbox_templates()
    from lm_eval.utils import apply_template

    for task in tasks if tasks is not None else golden.tasks:
        cfg = task_config(golden.path, f"tasks/{task}.yaml")
        doc = first_item(golden, task)
        for field in TEMPLATE_FIELDS:
            spec = cfg.get(field) if isinstance(cfg, dict) else None
            if not isinstance(spec, str) or spec in doc:
                continue
            try:
                apply_template(spec, doc)
            except Exception as e:  # any error the template raises on an item is the set's (items._doc_to too)
                raise UsageError(_refusal(golden, task, field, spec, doc, e)) from None


def _refusal(golden: GoldenSet, task: str, field: str, spec: str, doc: dict[str, Any], e: Exception) -> str:
    from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError

    shown = json.dumps(spec)[:120]
    if isinstance(e, SecurityError):
        why = f"tried to reach Python ({str(e)[:160]}); a golden set's templates are data rendered in a sandbox"
    elif isinstance(e, TemplateSyntaxError):
        why = f"is not a Jinja template that parses ({str(e)[:160]})"
    elif isinstance(e, UndefinedError):
        why = f"names what the item does not hold ({str(e)[:160]}; the item's fields: {', '.join(sorted(doc))})"
    else:
        why = f"fails ({type(e).__name__}: {str(e)[:160]})"
    return (
        f"golden set {golden.path}: task {task}'s {field} {shown}, rendered on the task's first item as lm-eval "
        f"renders it, {why}. Fix {field} in tasks/{task}.yaml: a field name of the items, or a Jinja template over "
        "them (in a new version folder: a version is immutable)"
    )
