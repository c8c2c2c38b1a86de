"""The two sides of a cross-engine comparison tokenize every item alike: checked before anything is scored.

A gate whose baseline transformers scores and whose candidate llama.cpp scores (a GGUF) pairs items whose numbers
came from two tokenizers: the Hugging Face tokenizer of the baseline's folder, through lm-eval's HF wrapper, and
the GGUF's own vocabulary, through llama.cpp. Where they split a prompt differently, a paired difference measures
the tokenizers, not the weights. So before any score is computed, lm-eval builds every request of the suite's
tasks once per side with an lm-eval model that only tokenizes (`TokensLM`, wrapping each side's own scorer's
tokenization: `encode_request`'s context/continuation split, the rolling documents' tokens, a generation's prompt),
and the two sides' token ids are compared item by item (a rolling document's after the prefix token that predicts
its first), with their context windows and prefix tokens; any difference is exit 2 naming the items or the tokens.
Nothing is computed by a model: the transformers side is built on the meta device (no weights), the llama.cpp side
from the GGUF's vocabulary alone. Not compared: the end-of-text token, which ends a generation beside its stop
sequences (transformers stops at the generation config's EOS ids, llama.cpp at the GGUF's, so the ids named as EOS
may differ where both stop alike, as on the default model, whose tokenizer names <|im_start|> as EOS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lm_eval.api.model import TemplateLM

from quantize.checkpoint.files import hf_path
from quantize.checkpoint.loader import meta_model
from quantize.compat import lm_eval as lm_eval_compat
from quantize.errors import UsageError
from quantize.evaluate.engine import gguf_to_score
from quantize.evaluate.score import evaluate_suite
from quantize.evaluate.suite import OpenSuite
from quantize.golden.manifest import item_id as golden_item_id

# items named in the refusal, at most
NAMED = 5

Tokens = tuple[tuple[int, ...], ...]  # an item's requests' token ids, in lm-eval's order


class TokensLM(TemplateLM):
    """An lm-eval model that tokenizes and computes nothing: each request's tokens as `encoder` (a side's own
    lm-eval model, or the HF wrapper its scorer tokenizes with) makes them, recorded per (task, document); every
    answer is a placeholder lm-eval's metrics can digest."""

    backend = "causal"

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder
        self.tokens: dict[tuple[str, int], list[tuple[int, ...]]] = {}

    @property
    def eot_token_id(self) -> int:
        return self.encoder.eot_token_id

    @property
    def prefix_token_id(self) -> int:
        return self.encoder.prefix_token_id

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.encoder.tok_encode(string, add_special_tokens=add_special_tokens)

    def _record(self, r: Any, *parts: list[int]) -> None:
        self.tokens.setdefault((r.task_name, r.doc_id), []).extend(tuple(p) for p in parts)

    def _loglikelihood_tokens(self, requests: list[Any], **kwargs: Any) -> list[tuple[float, bool]]:
        return [(0.0, False)] * len(requests)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        for r in requests:
            self._record(r, *lm_eval_compat.encode_request(self.encoder, *r.args))
        return [(0.0, False)] * len(requests)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        # the prefix token predicts a document's first token (lm-eval's rolling windows start from it)
        for r in requests:
            self._record(r, [self.prefix_token_id], self.tok_encode(r.args[0]))
        return [0.0] * len(requests)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        for r in requests:
            self._record(r, self.tok_encode(r.args[0]))
        return [""] * len(requests)


def encoder_of(suite: OpenSuite, checkpoint: Path, trust_remote_code: bool = False) -> Any:
    """What tokenizes for `checkpoint`'s scorer: our llama.cpp model of a GGUF on its vocabulary alone, or lm-eval's
    HF wrapper (what our transformers scorer and stock HFLM tokenize with) over the folder's tokenizer and its
    model on the meta device."""
    s = suite.suite
    if (gguf := gguf_to_score(checkpoint, s)) is not None:
        from quantize.evaluate.llamacpp import LlamaCppLM

        return LlamaCppLM(gguf, max_length=s.max_length, vocab_only=True)
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_path(checkpoint), trust_remote_code=trust_remote_code)
    model = meta_model(checkpoint, trust_remote_code)
    return HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=s.max_length)


def item_tokens(suite: OpenSuite, encoder: Any) -> tuple[tuple[int, int], dict[str, dict[str, Tokens]]]:
    """((the context window, the prefix token), {task: {item id: its requests' token ids}}) as `encoder` tokenizes
    the suite's tasks, through lm-eval's own request building (no model computes anything): a rolling document's
    tokens after the prefix token that predicts its first."""
    golden = suite.golden
    lm = TokensLM(encoder)
    r = evaluate_suite(suite, {"model": lm}, suite.tasks)
    out: dict[str, dict[str, Tokens]] = {}
    for task in suite.tasks:
        key = golden.item_key(task)
        for sample in r["samples"][task]:
            item, _ = golden_item_id(sample["doc"], key)
            out.setdefault(task, {})[item] = tuple(lm.tokens.get((task, sample["doc_id"]), []))
    return (lm.max_length, lm.prefix_token_id), out


def differences(a: dict[str, dict[str, Tokens]], b: dict[str, dict[str, Tokens]]) -> dict[str, list[str]]:
    """Per task, the items whose token ids differ between two sides (or that one side lacks), in id order."""
    out = {}
    for task in sorted(set(a) | set(b)):
        ta, tb = a.get(task, {}), b.get(task, {})
        if bad := sorted(i for i in set(ta) | set(tb) if ta.get(i) != tb.get(i)):
            out[task] = bad
    return out


def check_same_tokens(
    suite: OpenSuite, baseline: Path, candidate: Path, trust_remote_code: bool = False
) -> dict[str, int]:
    """Refuse (UsageError, exit 2) a comparison whose two sides tokenize some item differently, cut the context at
    another length or start documents at another token (module docstring); returns the items compared per task."""
    (n_b, prefix_b), base = item_tokens(suite, encoder_of(suite, baseline, trust_remote_code))
    (n_c, prefix_c), cand = item_tokens(suite, encoder_of(suite, candidate, trust_remote_code))
    if n_b != n_c:
        raise UsageError(
            f"the baseline {baseline} is scored with a context window of {n_b} tokens and the candidate {candidate} "
            f"with {n_c}: set the suite's `max_length:` so both sides cut prompts alike"
        )
    if prefix_b != prefix_c:
        raise UsageError(
            f"the baseline {baseline} starts a document with token {prefix_b} and the candidate {candidate} with "
            f"{prefix_c} (the token that predicts a document's first: BOS, else EOS), so their log-likelihoods would "
            "differ by the tokenizers, not the weights. Give the candidate the baseline's special tokens (a GGUF "
            "converted from the baseline's folder carries them)"
        )
    if diff := differences(base, cand):
        named = "; ".join(
            f"{t}: {', '.join(ids[:NAMED])}{' ...' if len(ids) > NAMED else ''}" for t, ids in diff.items()
        )
        total = sum(len(v) for v in diff.values())
        raise UsageError(
            f"the baseline {baseline} and the candidate {candidate} tokenize {total} item(s) differently ({named}), "
            "so a paired comparison would measure their tokenizers, not their weights. Give the candidate the "
            "baseline's tokenizer (a GGUF converted from the baseline's folder carries its vocabulary), or gate "
            "candidates scored by one engine"
        )
    return {t: len(v) for t, v in base.items()}
