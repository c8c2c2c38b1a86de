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

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on
any); the functions below are the only callers of those names.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

from quantize.compat import outside

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
