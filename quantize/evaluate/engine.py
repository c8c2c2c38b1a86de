"""Which engine scores a checkpoint, decided before anything heavy is imported: a GGUF (checkpoint/ggufs.find) is
scored in llama.cpp (quantize/evaluate/llamacpp.py, through llama-cpp-python: the `gguf` extra, `make gguf-env`),
every other checkpoint in transformers by the suite's backend; and what our two engines record of the tokens they
scored per item (ScoredTokens), hashed into each item's score record. Light: it imports neither llama.cpp nor
lm-eval."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from quantize.checkpoint import ggufs
from quantize.errors import UsageError
from quantize.evaluate.suite import Backend, LlamaCppSettings, Suite
from quantize.io import sha256_bytes
from quantize.machine import llamacpp_build, llamacpp_variables

DISTRIBUTION = "llama_cpp_python"
INSTALL = "`make gguf-env` (llama-cpp-python 0.3.36, built from its source distribution: README, GGUF)"
# the revision of what our llama.cpp model (evaluate/llamacpp.py) computes from the engine's logits: part of
# `llamacpp_engine`, so cached scores move with it. 2: every item records the hash of the tokens it scored
# (ScoredTokens); its numbers are 1's, but the key moves, so every entry served carries the hashes. 3: a generated
# item records the log-likelihood of its greedy tokens (`generated_ll`: NaN where a step's logits were not finite,
# which a gate counts as a regression; before, a NaN model's empty answers scored as a finite model's wrong ones);
# the answers are 2's, but the key moves, so every entry served carries it
LLAMACPP_REVISION = 3


def llamacpp_version() -> str | None:
    """The installed llama-cpp-python's version, None when it is not installed (read without importing it)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def gguf_to_score(checkpoint: str | Path, suite: Suite | None = None) -> Path | None:
    """The GGUF file llama.cpp scores for `checkpoint`, None for a checkpoint transformers scores. A GGUF needs
    llama-cpp-python installed and a header that reads, of a model (a malformed file, an adapter, a projector or an
    importance matrix is refused here, before any load: ggufs.check_model); a suite asking for `backend: llamacpp`
    takes GGUF checkpoints only. Each refusal is a UsageError saying what to do."""
    gguf = ggufs.find(checkpoint)
    if gguf is None:
        if suite is not None and suite.backend is Backend.llamacpp:
            raise UsageError(
                f"{checkpoint} is not a GGUF checkpoint, and the suite's `backend: llamacpp` scores GGUF files "
                "only: convert it with a GGUF recipe (recipes/gguf-*.yaml), or score it with `backend: quantize`"
            )
        return None
    ggufs.check_model(ggufs.read_header(gguf))  # a truncated, forged or non-model file is refused first
    if llamacpp_version() is None:
        raise UsageError(
            f"{checkpoint} is a GGUF checkpoint ({gguf.name}), scored in llama.cpp, and llama-cpp-python is not "
            f"installed here: install it with {INSTALL}"
        )
    return gguf


def llamacpp_settings(suite: Suite) -> LlamaCppSettings:
    """The suite's `llamacpp:` section, or its defaults."""
    return suite.llamacpp or LlamaCppSettings()


def llamacpp_engine(suite: Suite) -> str:
    """What computes a GGUF's scores besides the file and the suite's text: our revision, llama-cpp-python's version,
    the threads, the decode chunk (`n_batch`), the build (`llamacpp_build`) and any of llama.cpp's runtime switches
    set here (`llamacpp_variables`, after "env"). Part of the cache key (cache.Runtime.engine) and the provenance."""
    s = llamacpp_settings(suite)
    ours = f"llamacpp-{LLAMACPP_REVISION} llama-cpp-python {llamacpp_version()}"
    switches = f" env {v}" if (v := llamacpp_variables()) else ""
    return f"{ours} threads {s.n_threads} n_batch {s.n_batch} build {llamacpp_build()}{switches}"


class Recorded(NamedTuple):
    """What an engine of ours recorded of one item (ScoredTokens.take)."""

    tokens_sha256: str  # the hash of its requests' token ids (`tokens_sha256`)
    # Σ over its generations of log p(each generated token | what precedes it), None where it generated nothing
    generated_ll: float | None = None


class ScoredTokens:
    """What an engine of ours (evaluate/lm.py, evaluate/llamacpp.py) scored of each item, recorded as it scores: per
    (task, document), each request's token ids as the engine fed them, in lm-eval's request order (its `idx`). A
    log-likelihood request is its row (the context as the context window cut it, then the continuation) and the
    continuation's tokens; a rolling document, each window's row and targets; a generation, the prompt's ids as cut
    to leave room for the answer. `take` gives each item's hash (`tokens_sha256`), the score file's per-item
    `tokens_sha256`: two sides whose hashes differ scored other tokens (another tokenizer, another prefix token,
    another context window cutting a long item), whatever their prompts' text (quantize/gates/gate.py
    `token_differences`). A generation also records the log-likelihood of the tokens it generated (`generated`),
    the item's `generated_ll`: greedy tokens have finite ones, so a non-finite sum says a step's logits were NaN or
    infinite (a broken checkpoint, whose answer is no answer)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, int], list[tuple[int, tuple[tuple[int, ...], ...]]]] = {}
        self.lls: dict[tuple[str, int], float] = {}

    def add(self, request: Any, *ids: Sequence[int]) -> None:
        """One request's token sequences (lm-eval's Instance: its task_name, doc_id and idx)."""
        key = (request.task_name, request.doc_id)
        self.items.setdefault(key, []).append((request.idx, tuple(tuple(int(t) for t in x) for x in ids)))

    def generated(self, request: Any, ll: float) -> None:
        """The log-likelihood of one generate_until request's generated tokens (each from the logits that chose it:
        NaN or infinite where a step's logits were not finite), summed into its item's."""
        key = (request.task_name, request.doc_id)
        self.lls[key] = self.lls.get(key, 0.0) + float(ll)

    def take(self) -> dict[tuple[str, int], Recorded]:
        """What each item recorded since the last `take` (which it forgets: an engine is kept for every stage of a
        gate): its hash and, for a generated item, the log-likelihood of what it generated."""
        out = {
            k: Recorded(tokens_sha256([ids for _, ids in sorted(v, key=lambda r: r[0])]), self.lls.get(k))
            for k, v in self.items.items()
        }
        self.items, self.lls = {}, {}
        return out


def tokens_sha256(requests: Sequence[Sequence[Sequence[int]]]) -> str:
    """The hash of one item's requests' token sequences, in request order (ScoredTokens)."""
    return sha256_bytes(json.dumps([[list(x) for x in r] for r in requests], separators=(",", ":")).encode())
