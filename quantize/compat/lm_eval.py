"""lm-eval's internals this project relies on (checked on 0.4.13): every private name of lm-eval used here.

- `TemplateLM._encode_pair(context, continuation)`: its own split of a request into context and continuation
  tokens; agreement must tokenize exactly as scoring does, and lm-eval has no public call for it.
- `VLLM._model_generate(requests, generate, sampling_params)`: vLLM's engine call, the one way to its prompt
  log-probabilities through lm-eval's VLLM model.
- `TemplateLM.loglikelihood`'s rule for an empty context (the prefix token as context, unless the continuation
  starts with it), restated in `encode_request` (tests/compat compares it with TemplateLM's own path).
- `task.sampler.sample(n, eval_doc, df)`: a task's few-shot draw, recorded (not changed) while a golden set is
  frozen (`recording_draws`).
- `TemplateLM._loglikelihood_tokens(requests, **kwargs)`: abstract, so every TemplateLM defines it; our lm-eval
  model (evaluate/lm.py `PrefixLM`) defines it with these parameters.
- `lm_eval.utils.env`: the Jinja environment `apply_template` renders every task template with (doc_to_text,
  doc_to_target, ...), unsandboxed: replaced by jinja2's SandboxedEnvironment before a golden set's tasks are
  handed to lm-eval (`sandbox_templates`), so a template cannot reach Python (`cycler.__init__.__globals__`).
- `lm_eval.api.registry.metric_registry`: the metrics lm-eval defines; any other name in a task's metric_list is
  looked up with HF evaluate's `load`, which imports a Python file of that name or path (`registered_metrics`).

- `lm_eval.loggers.utils.get_git_commit_hash`: the results' `git_hash`, from `git describe --always` run through
  that module's `subprocess.check_output` in the working folder, git's stderr left on ours; outside a git
  repository every scoring run printed "fatal: not a git repository". `quiet_git` hands that module, while lm-eval
  runs, a `subprocess` whose check_output sends a child's stderr to /dev/null.

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on
any); the functions below are the only callers of those names.
"""

from __future__ import annotations

import contextlib
import inspect
import subprocess
import types
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

from quantize.compat import outside
from quantize.errors import UsageError

CHECKED = ((0, 4, 13), (0, 4, 14))  # [from, to): the versions the assumptions above were read on
SIGNATURES = {  # (module, class, method) -> its parameters after self
    ("lm_eval.api.model", "TemplateLM", "_encode_pair"): ("context", "continuation"),
    ("lm_eval.api.model", "TemplateLM", "_loglikelihood_tokens"): ("requests", "kwargs"),
    ("lm_eval.api.samplers", "ContextSampler", "sample"): ("n", "eval_doc", "df", "kwargs"),
    ("lm_eval.models.vllm_causallms", "VLLM", "_model_generate"): ("requests", "generate", "sampling_params"),
}
NEEDS_VLLM = "lm_eval.models.vllm_causallms"  # importable only beside vllm: checked where it is installed


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, a method missing or with other parameters."""
    import importlib
    import importlib.util

    found = []
    if why := outside("lm-eval", version("lm_eval"), CHECKED):
        found.append(why)
    import jinja2
    import lm_eval.utils

    if not isinstance(getattr(lm_eval.utils, "env", None), jinja2.Environment):
        found.append("lm_eval.utils.env is no longer a jinja2 Environment (sandbox_templates replaces it)")
    elif "env" not in lm_eval.utils.apply_template.__code__.co_names:
        found.append("lm_eval.utils.apply_template no longer renders with the module's env (sandbox_templates)")
    if not _git_through_subprocess():
        found.append(
            "lm_eval's get_git_commit_hash no longer runs git through lm_eval.loggers.utils.subprocess.check_output "
            "(quiet_git)"
        )
    for (module, cls, method), want in SIGNATURES.items():
        if module == NEEDS_VLLM and importlib.util.find_spec("vllm") is None:
            continue
        fn = getattr(getattr(importlib.import_module(module), cls, None), method, None)
        if fn is None:
            found.append(f"{module}.{cls}.{method} is gone")
            continue
        got = tuple(p for p in inspect.signature(fn).parameters if p != "self")
        if got != want:
            found.append(f"{module}.{cls}.{method} takes {got}, checked on {want}")
    return found


def encode_pair(lm: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's own (context tokens, continuation tokens) of a request, as its scoring splits it."""
    return lm._encode_pair(context, continuation)  # noqa: SLF001  # the guarded name (module docstring)


def encode_request(lm: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) of a loglikelihood request as lm-eval's `TemplateLM.loglikelihood`
    makes them: an empty context becomes the prefix token (or the continuation's first token, when that is the
    prefix token); any other goes through lm-eval's own split (`encode_pair`)."""
    if context == "":
        cont = lm.tok_encode(continuation, add_special_tokens=False)
        return ([lm.prefix_token_id], cont) if lm.prefix_token_id != cont[0] else (cont[:1], cont[1:])
    return encode_pair(lm, context, continuation)


def prompt_logprobs(lm: Any, ids: list[list[int]], sampling_params: Any) -> list[Any]:
    """vLLM's outputs (with prompt log-probabilities) for token-id prompts, through lm-eval's VLLM model."""
    return lm._model_generate(ids, generate=True, sampling_params=sampling_params)  # noqa: SLF001  # guarded


@contextlib.contextmanager
def recording_draws(task: Any) -> Iterator[list[list[dict[str, Any]]]]:
    """Every few-shot draw of `task` while the block runs, in order (a copy of each drawn document), recorded
    around its sampler's own `sample` as an instance attribute: the class's method is untouched, and the draw is
    the library's."""
    sampler = task.sampler
    draw = sampler.sample
    drawn: list[list[dict[str, Any]]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = draw(*args, **kwargs)
        drawn.append([dict(d) for d in out])
        return out

    sampler.sample = recording
    try:
        yield drawn
    finally:
        del sampler.sample


def sandbox_templates() -> None:
    """Render every lm-eval task template in jinja2's SandboxedEnvironment from now on in this process: lm-eval's
    own (`lm_eval.utils.env`) is a plain Environment, in which a golden set's doc_to_text of
    `{{ cycler.__init__.__globals__.os.system(...) }}` ran a shell command when the set was scored (a review's
    repro). The sandbox keeps lm-eval's settings and filters (regex_replace) and refuses unsafe attributes."""
    import lm_eval.utils
    from jinja2.sandbox import SandboxedEnvironment

    plain = lm_eval.utils.env
    if isinstance(plain, SandboxedEnvironment):
        return
    env = SandboxedEnvironment(
        loader=plain.loader, undefined=plain.undefined, keep_trailing_newline=plain.keep_trailing_newline
    )
    env.filters.update({k: f for k, f in plain.filters.items() if k not in env.filters})
    lm_eval.utils.env = env


def registered_metrics() -> set[str]:
    """The metric names lm-eval defines itself; a task naming another is looked up with HF evaluate's `load`,
    which imports a Python file of that name or path (from the working folder, or anywhere)."""
    import lm_eval.api.metrics  # noqa: F401  # registers them
    from lm_eval.api.registry import metric_registry

    return set(metric_registry)


def sandboxed_metrics() -> set[str]:
    """Before a golden set's tasks go to lm-eval: templates rendered sandboxed from now on (sandbox_templates), and
    the metric names a task may use (registered_metrics), for golden/manifest.lm_eval_tasks to hold them to."""
    sandbox_templates()
    return registered_metrics()


@contextlib.contextmanager
def templates_refused(where: str) -> Iterator[None]:
    """A template that fails inside lm-eval while it builds a task's requests (jinja2's TemplateError: the sandbox's
    SecurityError, a variable the item lacks, a template that does not parse) as the UsageError it is: the golden
    set's fault, named, not a failure of ours. (golden/templates.check_templates renders each task's templates on
    its first item before a model loads and names the task and the field; this names the set, for an item after.)"""
    from jinja2.exceptions import SecurityError, TemplateError

    try:
        yield
    except SecurityError as e:
        raise UsageError(
            f"{where}: a task template tried to reach Python ({str(e)[:200]}); a golden set's templates are data "
            "rendered in a sandbox. Fix the task YAML's doc_to_text/doc_to_target/doc_to_choice"
        ) from None
    except TemplateError as e:
        raise UsageError(
            f"{where}: a task template failed on an item ({type(e).__name__}: {str(e)[:200]}). Fix the task YAML's "
            "doc_to_text/doc_to_target/doc_to_choice: a field name of the items, or a Jinja template over them"
        ) from None


def _git_through_subprocess() -> bool:
    """The evaluator's git_hash comes from lm_eval.loggers.utils.get_git_commit_hash, which calls its module's
    `subprocess.check_output` (quiet_git's assumption)."""
    import lm_eval.evaluator
    import lm_eval.loggers.utils

    fn = lm_eval.loggers.utils.get_git_commit_hash
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    return (
        getattr(lm_eval.evaluator, "get_git_commit_hash", None) is fn
        and {"subprocess", "check_output"} <= set(names)
        and getattr(lm_eval.loggers.utils, "subprocess", None) is subprocess
    )


@contextlib.contextmanager
def quiet_git() -> Iterator[None]:
    """While the block runs lm-eval, its `git describe --always` (the results' git_hash, get_git_commit_hash) says
    nothing on our stderr: lm_eval.loggers.utils's `subprocess` is one whose check_output sends a child's stderr to
    /dev/null where the call gives none. The command, its output and lm-eval's fallback where git fails are lm-eval's
    own, so the recorded git_hash is what it was; outside CHECKED, or where problems() finds the call changed,
    lm-eval is left as it is (git's line printed, nothing else wrong)."""
    import lm_eval.loggers.utils

    if outside("lm-eval", version("lm_eval"), CHECKED) or not _git_through_subprocess():
        yield
        return

    def check_output(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        return subprocess.check_output(*args, **kwargs)

    quiet = types.ModuleType(subprocess.__name__)
    quiet.__dict__.update(vars(subprocess))
    quiet.check_output = check_output  # type: ignore[attr-defined]
    lm_eval.loggers.utils.subprocess = quiet
    try:
        yield
    finally:
        lm_eval.loggers.utils.subprocess = subprocess
