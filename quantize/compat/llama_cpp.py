"""llama-cpp-python's internals this project relies on (checked on 0.3.36): one private method, patched only where
asked (benchmarks/server_samples.py `--fixed`), never by `quantize` itself.

- `Llama._create_completion`: the OpenAI server's completion path. With `echo=True` 0.3.36 pairs each echoed prompt
  token i with the log-softmax of the logits at position i (which predict token i + 1), drops a leading BOS from
  the echo but not from the rows, and echoes nothing when the greedy next token ends generation: lm-eval's
  `local-completions` log-likelihoods read through it are off by one token (docs/results.md, "A real server").
  `patch_echo` recompiles the method's own source with PATCHES applied (each must match exactly once), so an
  echoed token i is scored by row i - 1, BOS kept, the end-of-generation token echoed, and the top-k taken with
  numpy instead of a Python sort of the whole vocabulary per token.

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on
any); `patch_echo` refuses to run while there is one, never half-patching another version.
"""

from __future__ import annotations

import inspect
import textwrap
from importlib.metadata import PackageNotFoundError, version

from quantize.compat import outside

DISTRIBUTION = "llama_cpp_python"
CHECKED = ((0, 3, 36), (0, 3, 37))  # [from, to): the versions PATCHES were read on

# (old, new) on the source of llama_cpp.Llama._create_completion (0.3.36, as indented in its file): the echo path only
PATCHES = [
    (  # remember the end-of-generation token that stopped the loop, so the echo can return it
        "multibyte_fix = 0\n        for token in self.generate(",
        "multibyte_fix = 0\n        _eog_token = None\n        for token in self.generate(",
    ),
    (
        "if llama_cpp.llama_vocab_is_eog(self._model.vocab, token):\n",
        "if llama_cpp.llama_vocab_is_eog(self._model.vocab, token):\n                _eog_token = token\n",
    ),
    (  # every prompt token keeps its place (BOS included), then the generated token or the one that ended it
        "all_tokens = (\n"
        "                    prompt_tokens[1 if prompt_tokens[0] == self.token_bos() else 0 :]\n"
        "                    + completion_tokens\n"
        "                )",
        "all_tokens = prompt_tokens + (\n"
        "                    completion_tokens or ([_eog_token] if _eog_token is not None else [])\n"
        "                )",
    ),
    (  # token i is predicted by the logits at position i - 1 (row 0 is a placeholder: the first has no logprob)
        "all_logprobs = Llama.logits_to_logprobs(self._scores)[token_offset:]",
        "all_logprobs = Llama.logits_to_logprobs(self._scores)\n"
        "            if echo:\n"
        "                all_logprobs = np.concatenate([np.zeros_like(all_logprobs[:1]), all_logprobs])\n"
        "            else:\n"
        "                all_logprobs = all_logprobs[token_offset:]",
    ),
    (  # an echoed BOS is a prompt token like any other
        "):\n                if token == bos_token_id:\n                    continue\n"
        "                text_offsets.append(",
        "):\n                if token == bos_token_id and not echo:\n                    continue\n"
        "                text_offsets.append(",
    ),
    (  # the top-k by numpy, not a Python sort of the whole vocabulary for every echoed token
        "sorted_logprobs = list(\n"
        "                    sorted(\n"
        "                        zip(logprobs_token, range(len(logprobs_token))), reverse=True\n"
        "                    )\n"
        "                )",
        "sorted_logprobs = [\n"
        "                    (logprobs_token[int(i)], int(i))\n"
        "                    for i in np.argsort(-logprobs_token, kind='stable')[: max(logprobs, 1)]\n"
        "                ]",
    ),
]


def _source() -> str:
    from llama_cpp import llama as module

    return inspect.getsource(module.Llama._create_completion)  # noqa: SLF001 (the method PATCHES change)


def problems() -> list[str]:
    """What no longer holds: llama-cpp-python missing or outside CHECKED, a patched line not found exactly once."""
    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:
        return [f"{DISTRIBUTION} is not installed"]
    out = [p] if (p := outside(DISTRIBUTION, installed, CHECKED)) else []
    src = _source()
    out += [
        f"Llama._create_completion holds {src.count(old)} copies of the patched line {old[:60]!r}, not 1"
        for old, _new in PATCHES
        if src.count(old) != 1
    ]
    return out


def patch_echo() -> None:
    """Replace `Llama._create_completion` by its own source with PATCHES applied, in this process only. A
    RuntimeError naming each problem where the installed version is not the one they were read on."""
    if found := problems():
        raise RuntimeError("llama-cpp-python's echo patch does not apply: " + "; ".join(found))
    from llama_cpp import llama as module

    src = _source()
    for old, new in PATCHES:
        src = src.replace(old, new)
    scope = dict(vars(module))
    exec(compile(textwrap.dedent(src), f"<patched {module.__file__}>", "exec"), scope)
    module.Llama._create_completion = scope["_create_completion"]  # noqa: SLF001
