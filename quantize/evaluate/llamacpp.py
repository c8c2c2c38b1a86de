"""Our lm-eval model of a GGUF checkpoint scored in llama.cpp (`backend: llamacpp`, lm-eval's registry name
"quantize-llamacpp"; the default for a GGUF checkpoint): the engine's own numbers, not an emulation of them.

llama.cpp (through llama-cpp-python, the `gguf` extra: `make gguf-env`) computes every position's logits of a
token sequence; this model turns them into what lm-eval asks for, as quantize/evaluate/lm.py does in transformers:

    tokens         llama.cpp's own tokenizer (the GGUF's vocabulary: `Llama.tokenize`, the format's special tokens
                   parsed in text as a Hugging Face tokenizer parses them, BOS where the vocabulary adds one), and
                   lm-eval's context/continuation split (TemplateLM's `_encode_pair`, through
                   quantize/compat/lm_eval.encode_request); the prefix token is the vocabulary's BOS, else its EOS
    row            inp = (context + continuation)[-(max_length + 1):][:-1], as HFLM truncates (lm.row); P = inp's
                   tokens before the C scored ones, S = the last C
    log-likelihood Σ log_softmax(logits)[target] over S's positions (float64 on the float32 logits llama.cpp
                   returns), is_greedy when every target is its position's argmax
    recorded       each request's row and targets per item, as evaluate/lm.py records them (engine.ScoredTokens): a
                   folder and its GGUF that tokenize alike give each item one hash

One item's continuations that share P are scored from one evaluation of P: P is decoded from position 0 (the
cache cleared), then each S is decoded after it (the positions past P removed first, llama.cpp's own
`kv_cache_seq_rm`), as llama.cpp's server reuses a prompt's cache. That rewind needs a memory llama.cpp can cut
part-way, an attention-only KV cache: a recurrent or hybrid model's memory (Mamba's state, LFM2's short
convolutions, Falcon-H1's state-space layers: `llama_model_is_recurrent` / `llama_model_is_hybrid`,
quantize/compat/llama_cpp.memory_rewinds) holds one state per sequence, which llama.cpp refuses to cut (its next
decode returned -1, exit 3). For such a model every row is decoded whole from an empty memory (P + S in one
evaluation), as a fresh load would decode it. Nothing is shared between items and one
sequence is decoded at a time, so an item's numbers depend on its own tokens, the GGUF and the engine settings
alone: threads and `n_batch` (the chunk a sequence is decoded in: its positions' floats depend on where the chunks
fall, so it is fixed) are the suite's `llamacpp:` section, recorded in the provenance and the cache key with the
llama.cpp version (`engine`).

The context is as long as the rows need, never longer than max_length (which cuts the rows, as HFLM's does):
llama.cpp's KV cache and llama-cpp-python's logits array (positions × vocabulary float32, allocated whole) grow
with it, and a GGUF's own context length made them 62.6 GiB of logits for Llama 3.1's 131,072 positions (exit 3,
MemoryError, where a suite's rows are a few thousand tokens). The logits do not depend on it: the default model's
and the tiny MoE's rows of 201 and 500 tokens gave bit-identical logits with contexts of 512, 600, 2,048 and
8,192 positions (llama-cpp-python 0.3.36, the 2-core AMD EPYC; tests/evaluate/test_llamacpp.py checks it).

Document perplexity: lm-eval's rolling windows, each window a row, summed per document. Generation: greedy, one
request at a time, the argmax of the last position's logits appended until an end-of-sequence token, a stop
sequence of lm-eval's (`handle_stop_sequences`) or `max_gen_toks`, post-processed as HFLM's; the log-probability
of each token chosen, from the logits that chose it, is summed into the item's `generated_ll` (engine.ScoredTokens:
non-finite where a step's logits were, a broken GGUF's answers counted as non-finite evidence). Agreement's
logits (quantize/evaluate/agreement.py) come from the same object (`logits`): one load serves both.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from quantize.checkpoint import ggufs
from quantize.checkpoint.llama_vocab import check_vocabulary
from quantize.compat import llama_cpp as compat
from quantize.compat import lm_eval as lm_eval_compat
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate.engine import ScoredTokens
from quantize.evaluate.lm import Row, rolling_rows, row
from quantize.machine import check_loaded_build
from quantize.quiet import llama_log, llama_said

NAME = "quantize-llamacpp"
# positions of the first context (then as long as the longest row asks, up to max_length: LlamaCppLM.fit)
FIRST_CONTEXT = 512
_OPEN: weakref.WeakSet[LlamaCppLM] = weakref.WeakSet()  # closed at exit (LlamaCppLM.close)


def context_length(gguf: Path) -> int | None:
    """The context length the GGUF's header gives its architecture (`{arch}.context_length`), None without one."""
    return ggufs.context_length(ggufs.read_header(gguf))


@register_model(NAME)
class LlamaCppLM(TemplateLM):
    """A GGUF in llama.cpp, scored as the module docstring says. `pretrained`: the GGUF file; `max_length`: the
    context window (default: the GGUF's context length, as HFLM takes the config's); `vocab_only`: the vocabulary
    alone, to tokenize (evaluate/tokens.py), nothing scored."""

    backend = "causal"  # TemplateLM's _encode_pair: encode the whole string, then split

    def __init__(  # noqa: PLR0913 (lm-eval passes a suite's model_args as keywords; each is one of them)
        self,
        pretrained: str | Path,
        n_threads: int = 2,
        n_batch: int = 512,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        batch_size: int | str = 1,
        seed: int = 0,
        vocab_only: bool = False,
    ) -> None:
        super().__init__()
        import llama_cpp  # noqa: F401 (maps llama.cpp's libraries, which check_loaded_build reads)

        check_loaded_build()  # the libraries just mapped are the build its scores are keyed by (engine.llamacpp_engine)
        self.gguf = Path(pretrained)
        self._max_length = int(max_length or context_length(self.gguf) or 2048)
        self.n_threads, self.n_batch, self.max_gen_toks = int(n_threads), int(n_batch), int(max_gen_toks)
        self.batch_size = int(batch_size)  # lm-eval reads it; one sequence is decoded at a time whatever it is
        self.seed, self.vocab_only = seed, vocab_only
        check_vocabulary(self.gguf, model=not vocab_only)  # what llama.cpp aborts on is exit 2, not a SIGABRT here
        self._load(min(self._max_length, FIRST_CONTEXT))
        self.rewinds = compat.memory_rewinds(self.llm.model)  # False: every row decoded whole (module docstring)
        bos = self.llm.token_bos()
        self._eot = self.llm.token_eos()
        self._prefix = bos if bos >= 0 else self._eot
        self.scored = ScoredTokens()  # each item's tokens as scored, hashed into its score record
        _OPEN.add(self)

    def _load(self, n_ctx: int) -> None:
        """llama.cpp's model and a context of `n_ctx` positions (module docstring: the context is sized to the
        rows, not to max_length)."""
        from llama_cpp import Llama

        with llama_log() as log:  # llama.cpp's own lines (a vocabulary-only context's warning) off the terminal
            try:
                self.llm = Llama(
                    model_path=str(self.gguf),
                    n_ctx=n_ctx,
                    n_batch=self.n_batch,
                    n_ubatch=self.n_batch,
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,
                    logits_all=True,
                    seed=self.seed,
                    verbose=False,
                    vocab_only=self.vocab_only,
                )
            except (ValueError, RuntimeError) as e:
                raise UsageError(
                    f"llama.cpp could not load {self.gguf}: {e}; {llama_said(log.read_text(errors='replace'))}; check "
                    "the file with `quantize inspect`"
                ) from e
        self.n_ctx = n_ctx

    def fit(self, positions: int) -> None:
        """A context holding at least `positions` (at most max_length, which rows never exceed): llama.cpp's context
        and llama-cpp-python's logits array (positions × vocabulary floats) are allocated whole when it is made, so
        it is made again, twice as long or as the longest row asks, only when a row needs more."""
        if positions > self.n_ctx:
            self.llm.close()
            self._load(min(self._max_length, max(positions, 2 * self.n_ctx)))

    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """llama.cpp's tokens of `string`: special tokens parsed as a Hugging Face tokenizer parses them; the
        vocabulary's BOS added where it adds one unless `add_special_tokens` is False."""
        return self.llm.tokenize(string.encode("utf-8"), add_bos=add_special_tokens is not False, special=True)

    def close(self) -> None:
        """Free llama.cpp's model and context now (also at exit: llama-cpp-python's own finalizer fails once the
        interpreter has torn its module down)."""
        self.llm.close()
        _OPEN.discard(self)

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.llm.detokenize(list(tokens)).decode("utf-8", errors="replace")

    # --- log-likelihoods --------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: list[Any], **kwargs: Any) -> list[tuple[float, bool]]:
        """TemplateLM's abstract hook: (request strings, context tokens, continuation tokens) triples."""
        return self.score_rows([row(ctx, cont, self.max_length) for _, ctx, cont in requests])

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each request's continuation given its context, in request order."""
        rows = []
        for r in requests:
            ctx, cont = lm_eval_compat.encode_request(self, *r.args)
            rows.append(row(ctx, cont, self.max_length))
            self.scored.add(r, rows[-1].prefix + rows[-1].suffix, rows[-1].targets)
        return self.score_rows(rows)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood: the sum over lm-eval's rolling windows, each window a row."""
        windows = rolling_rows(self, requests, self.scored)
        sums = [0.0] * len(requests)
        for (d, _, _), (ll, _) in zip(windows, self.score_rows([r for _, _, r in windows]), strict=True):
            sums[d] += ll
        return sums

    def score_rows(self, rows: list[Row]) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) per row, in order; consecutive rows with one prefix share its evaluation
        (module docstring: within an item, since lm-eval lists an item's requests together), any other prefix is
        evaluated afresh; a model whose memory cannot be cut part-way (`rewinds` False) decodes every row whole
        from an empty memory."""
        out = []
        evaluated: tuple[int, ...] | None = None
        self.fit(max((len(r.prefix) + len(r.suffix) for r in rows), default=0))
        for r in rows:
            if not self.rewinds:
                out.append(answer(self.row_logits(r), r.targets))
                continue
            if r.prefix != evaluated:
                self.llm.reset()
                if r.prefix:
                    self.llm.eval(list(r.prefix))
                evaluated = r.prefix
            out.append(answer(self.suffix_logits(len(r.prefix), r.suffix), r.targets))
        return out

    def suffix_logits(self, at: int, suffix: Sequence[int]) -> np.ndarray:
        """The logits (C, V) at `suffix`'s positions, decoded after the first `at` positions of the cache."""
        self.llm.n_tokens = at
        self.llm.eval(list(suffix))
        return np.array(self.llm.scores[at : at + len(suffix)], dtype=np.float32)

    def row_logits(self, r: Row) -> np.ndarray:
        """The logits (C, V) at the row's suffix positions, the row decoded whole from an empty memory."""
        at = len(r.prefix)
        self.llm.reset()  # llama-cpp-python clears a recurrent or hybrid memory here (llama_memory_clear)
        self.llm.eval(list(r.prefix + r.suffix))
        return np.array(self.llm.scores[at : at + len(r.suffix)], dtype=np.float32)

    def logits(self, tokens: Sequence[int], first: int) -> np.ndarray:
        """The logits (P, V) of a whole sequence at positions first - 1 .. len - 2 (those predicting tokens
        first .. len - 1): agreement's scored positions."""
        self.fit(len(tokens))
        self.llm.reset()
        self.llm.eval(list(tokens))
        return np.array(self.llm.scores[first - 1 : len(tokens) - 1], dtype=np.float32)

    # --- generation -------------------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, one request at a time (module docstring)."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        eos = self.tok_decode([self.eot_token_id])
        out = []
        for r in requests:
            context, gen_kwargs = r.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
                raise UsageError(
                    f"task {r.task_name} samples its generations (do_sample or a temperature above 0); the llama.cpp "
                    "backend generates greedily only, so its answers would not be lm-eval's: score it in transformers"
                )
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = int(kwargs.pop("max_gen_toks"))
            prompt = self.tok_encode(context)[-max(1, self.max_length - max_gen) :]
            self.scored.add(r, prompt)
            self.fit(min(self.max_length, len(prompt) + max_gen))
            text, ll = self.greedy(prompt, max_gen, until)
            self.scored.generated(r, ll)
            out.append(postprocess_generated_text(generation=text, stop=until, think_end_token=None))
        return out

    def greedy(self, prompt: list[int], max_gen: int, until: list[str]) -> tuple[str, float]:
        """The greedy continuation of `prompt`: at most `max_gen` tokens, ended by an end-of-sequence token or once
        the text holds a stop sequence; and Σ log p of every token chosen (the end-of-sequence token included, as
        transformers' generate counts it), from the logits that chose it: NaN or infinite where a step's logits
        were not finite (`answer`)."""
        self.llm.reset()
        self.llm.eval(prompt)
        made: list[int] = []
        ll = 0.0
        while len(made) < max_gen and len(prompt) + len(made) < self.max_length:
            logits = np.asarray(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)
            tok = int(np.argmax(logits))
            ll += answer(logits[None], [tok])[0]
            if tok == self.eot_token_id:
                break
            made.append(tok)
            if any(s in self.tok_decode(made) for s in until):
                break
            self.llm.eval([tok])
        return self.tok_decode(made), ll


def answer(logits: np.ndarray, targets: Sequence[int]) -> tuple[float, bool]:
    """(Σ log p(target), every target the argmax) from the logits (C, V) predicting `targets` (log-softmax in
    float64). Non-finite logits give a non-finite log-likelihood (a regression, never a pass)."""
    if logits.shape[0] != len(targets):
        raise RuntimeFailure(f"llama.cpp returned logits for {logits.shape[0]} positions, {len(targets)} were asked")
    lg = logits.astype(np.float64)
    peak = lg.max(axis=-1, keepdims=True)
    logz = peak[:, 0] + np.log(np.exp(lg - peak).sum(axis=-1))
    want = np.asarray(targets)
    ll = float((lg[np.arange(len(want)), want] - logz).sum())
    return ll, bool((lg.argmax(axis=-1) == want).all())


@atexit.register
def _close_all() -> None:
    for lm in list(_OPEN):
        lm.close()
