"""lm-eval's internals this project relies on (checked on 0.4.13): every private name of lm-eval used here.

- `TemplateLM._encode_pair(context, continuation)`: its own split of a request into context and continuation
  tokens; agreement must tokenize exactly as scoring does, and lm-eval has no public call for it.
- `VLLM._model_generate(requests, generate, sampling_params)`: vLLM's engine call, the one way to its prompt
  log-probabilities through lm-eval's VLLM model.
- `HFLM._loglikelihood_tokens(requests, disable_tqdm, override_bs)` and `HFLM._model_call(inps, attn_mask,
  labels)`, overridden by `lean_hflm` (below), which also relies on lm-eval's right-padding with 0 and its
  `ctx_len` arithmetic for logits that start later (tests/evaluate/test_eval.py compares its numbers with stock
  HFLM's, item by item).
- `task.sampler.sample(n, eval_doc, df)`: a task's few-shot draw, recorded (not changed) while a golden set is
  frozen (`recording_draws`).

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on
any); the functions below are the only callers of those names.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

CHECKED = ((0, 4, 13), (0, 4, 14))  # [from, to): the versions the assumptions above were read on
SIGNATURES = {  # (module, class, method) -> its parameters after self
    ("lm_eval.api.model", "TemplateLM", "_encode_pair"): ("context", "continuation"),
    ("lm_eval.models.huggingface", "HFLM", "_loglikelihood_tokens"): ("requests", "disable_tqdm", "override_bs"),
    ("lm_eval.models.huggingface", "HFLM", "_model_call"): ("inps", "attn_mask", "labels"),
    ("lm_eval.api.samplers", "ContextSampler", "sample"): ("n", "eval_doc", "df", "kwargs"),
    ("lm_eval.models.vllm_causallms", "VLLM", "_model_generate"): ("requests", "generate", "sampling_params"),
}
NEEDS_VLLM = "lm_eval.models.vllm_causallms"  # importable only beside vllm: checked where it is installed


def _release(v: str) -> tuple[int, int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in v.split("+")[0].split(".")[:3]]
    return (*parts, 0, 0, 0)[:3]  # type: ignore[return-value]


def problems() -> list[str]:
    """What no longer holds: the version outside CHECKED, a method missing or with other parameters."""
    import importlib
    import importlib.util

    found = []
    v = version("lm_eval")
    if not CHECKED[0] <= _release(v) < CHECKED[1]:
        found.append(f"lm-eval {v} is outside the checked range {CHECKED[0]}-{CHECKED[1]} (exclusive)")
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


@functools.cache
def lean_hflm() -> type:
    """lm-eval's HFLM with two changes of what is computed, none of what is scored.

    Document perplexity batched longest first: lm-eval 0.4.13's `loglikelihood_rolling` batches the documents'
    windows in document order, each batch padded to its longest window: on core/v2's prose (166 documents, 43k
    tokens) that computes 81k padded tokens, sorted 50k. This hands it the documents sorted by token count
    (descending, ties in document order) and puts the results back in request order; each document's windows,
    and what is summed, are lm-eval's own.

    Log-probabilities only where they are read: lm-eval's `_loglikelihood_tokens` takes the LM head and a
    log_softmax over the vocabulary at every position of a batch [B, L, V], then keeps each request's
    continuation, `logits[inplen - contlen : inplen]`, counted from the right of what `_model_call` returns
    (`ctx_len = inplen + (logits.shape[0] - padding_len_inp)`: lm-eval's own allowance for logits that start
    later). `_model_call` here returns the last L - s positions, s = min over the batch's rows of
    inplen - contlen (each row is found by its tokens among the requests), through transformers'
    `logits_to_keep`. For SmolLM2-135M the head (576 x 49,152) is 21% of a token's multiply-adds, and a
    multiple-choice request's continuation is a few of its tokens.

    The batches and the head's matrix shapes differ, so the numbers may differ in their last bits:
    cache.SCORER_REVISION keys it."""
    import torch
    from lm_eval.models.huggingface import HFLM

    class LeanHFLM(HFLM):
        # the batch's input rows (as token tuples) -> min inplen - contlen of the requests with that input; only
        # while _loglikelihood_tokens runs
        _starts: dict[tuple[int, ...], int] | None = None

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            lengths = [len(self.tok_encode(r.args[0])) for r in requests]
            order = sorted(range(len(requests)), key=lambda i: -lengths[i])
            done = super().loglikelihood_rolling([requests[i] for i in order], disable_tqdm=disable_tqdm)
            out = [0.0] * len(requests)
            for i, ll in zip(order, done, strict=True):
                out[i] = ll
            return out

        def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, override_bs: Any = None):
            if self.backend != "causal" or "logits_to_keep" not in inspect.signature(self.model.forward).parameters:
                return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
            starts: dict[tuple[int, ...], int] = {}
            for _, ctx, cont in requests:
                inp = tuple((ctx + cont)[-(self.max_length + 1) :][:-1])  # lm-eval's own input row
                starts[inp] = min(starts.get(inp, len(inp)), len(inp) - len(cont))
            self._starts = starts
            try:
                return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
            finally:
                self._starts = None

        def _row_start(self, row: list[int]) -> int | None:
            """The row's own start among the requests: lm-eval right-pads with 0, so its length is at least
            its last non-zero token's position + 1 (a real trailing 0 token: try the next length)."""
            n = len(row)
            while n > 0 and row[n - 1] == 0:
                n -= 1
            for m in range(max(n, 1), len(row) + 1):  # row[m:] is all 0 for every m >= n
                if (s := self._starts.get(tuple(row[:m]))) is not None:
                    return s
            return None

        def _model_call(self, inps: Any, attn_mask: Any = None, labels: Any = None) -> Any:
            if self._starts is None or attn_mask is not None or labels is not None:
                return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
            starts = [self._row_start(r) for r in inps.tolist()]
            if any(s is None for s in starts) or (s := min(starts)) <= 0:
                return super()._model_call(inps)
            with (
                torch.no_grad(),
                torch.autocast(
                    device_type=self.device.type,
                    dtype=self.mixed_precision_dtype,
                    enabled=self.mixed_precision_dtype is not None,
                ),
            ):
                return self.model(inps, logits_to_keep=inps.shape[1] - s).logits

    return LeanHFLM
