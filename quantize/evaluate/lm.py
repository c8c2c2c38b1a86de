"""Our lm-eval model (`backend: quantize`, lm-eval's registry name "quantize-kv"): each distinct context computed
once, every continuation of it scored from its cached keys and values, an item's numbers independent of its batch.

lm-eval's HF backend (`HFLM`) runs context + continuation as one row for every request: a multiple-choice item
with four multi-token choices runs its context four times (its logits cache shares a context only for one-token
continuations), and each row is right-padded to the longest row of a batch that lm-eval forms across items, so
an item's numbers move with its neighbours (lm-eval #3055). This model plugs into lm-eval through its public
extension point (`lm_eval.api.registry.register_model`, a `TemplateLM` whose `loglikelihood`,
`loglikelihood_rolling` and `generate_until` are its own) and computes, per request, what HFLM computes:

    tokens         lm-eval's own: HFLM's `tok_encode`, prefix token, max length and generation-prompt encoding (an
                   HFLM over the same model serves them; nothing is computed through it), and TemplateLM's
                   context/continuation split (quantize/compat/lm_eval.encode_request)
    row            inp = (context + continuation)[-(max_length + 1):][:-1], as HFLM truncates; the continuation's
                   C tokens are predicted at inp's last C positions. P = inp[:-C] (the prefix), S = inp[-C:]
    log-likelihood Σ log_softmax(logits)[target] over those C positions (log_softmax in float32), is_greedy when
                   every target is its position's argmax

The requests are grouped by (task, document, P): one item's continuations that share a context. A group of one
row runs P + S in one forward pass (LM head on the last C positions only); a larger group runs P once (batch 1,
its keys and values kept; a distinct P is computed once per call, groups sorted by P) and its continuations'
S rows right-padded in batches of `batch_size` against a copy of that cache expanded to the batch. What a row's
numbers depend on is its own item: P (batch 1) and its item's other continuations (the padded batch), never
another item. Right padding needs no attention mask: a causal row never reads the positions after it.

Document perplexity: lm-eval's rolling windows (`lm_eval.utils.get_rolling_token_windows`,
`make_disjoint_window`, context length 1), each window a group of one, summed per document. Generation: one
request at a time (batch 1, no padding), greedy through transformers' `generate` with lm-eval's stop criteria and
post-processing, as HFLM's `generate_until` runs a batch.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from quantize.compat import lm_eval as lm_eval_compat

NAME = "quantize-kv"


class Row(NamedTuple):
    prefix: tuple[int, ...]  # P: inp's tokens before the first scored position (may be empty)
    suffix: tuple[int, ...]  # S: inp's last C tokens, whose logits predict the targets
    targets: tuple[int, ...]  # the continuation's C tokens


def row(context: Sequence[int], continuation: Sequence[int], max_length: int) -> Row:
    """A request's row as HFLM truncates it (module docstring)."""
    n = len(continuation)
    if not context or not 0 < n <= max_length:
        raise ValueError(f"a request needs a context and 1..{max_length} continuation tokens, got {len(context)}, {n}")
    inp = (list(context) + list(continuation))[-(max_length + 1) :][:-1]
    return Row(tuple(inp[: len(inp) - n]), tuple(inp[len(inp) - n :]), tuple(continuation))


@register_model(NAME)
class PrefixLM(TemplateLM):
    """A causal LM scored with each distinct context computed once (module docstring). `pretrained`: a loaded
    transformers model with its `tokenizer`, or a checkpoint folder, loaded by our loader (safetensors only,
    strict) in `dtype` on `device`."""

    def __init__(
        self,
        pretrained: Any,
        tokenizer: Any = None,
        batch_size: int | str = 16,
        max_length: int | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        from lm_eval.models.huggingface import HFLM

        if isinstance(pretrained, (str, Path)):
            from quantize.checkpoint.loader import LastModel

            pretrained, tokenizer = LastModel(trust_remote_code).get(Path(pretrained), dtype=dtype, on=device)
        self.model = pretrained
        # lm-eval's tokenization of the same model (module docstring): no forward pass runs through it
        self.hf = HFLM(pretrained=pretrained, tokenizer=tokenizer, batch_size=1, max_length=max_length)
        self.tokenizer = self.hf.tokenizer
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # the LM head on the scored positions only, where the model's forward takes it
        self.keeps = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    @property
    def eot_token_id(self) -> int:
        return self.hf.eot_token_id

    @property
    def prefix_token_id(self) -> int:
        return self.hf.prefix_token_id

    @property
    def max_length(self) -> int:
        return self.hf.max_length

    @property
    def device(self) -> Any:
        return self.model.device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.hf.tok_encode(string, add_special_tokens=add_special_tokens, **kwargs)

    def _loglikelihood_tokens(self, requests: list[Any], **kwargs: Any) -> list[tuple[float, bool]]:
        """TemplateLM's abstract hook: (request strings, context tokens, continuation tokens) triples, each its
        own group (no document to group by)."""
        rows = [row(ctx, cont, self.max_length) for _, ctx, cont in requests]
        return self.score_rows(rows, list(range(len(rows))))

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each request's continuation given its context, in request order."""
        rows = []
        for r in requests:
            ctx, cont = lm_eval_compat.encode_request(self.hf, *r.args)
            rows.append(row(ctx, cont, self.max_length))
        # one item's continuations that share a context form a group (module docstring)
        return self.score_rows(rows, [(r.task_name, r.doc_id) for r in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood: the sum over lm-eval's rolling windows, each window scored alone."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for r in requests:
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(r.args[0]),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            rows = [row(*make_disjoint_window(w), self.max_length) for w in windows]
            out.append(sum(ll for ll, _ in self.score_rows(rows, list(range(len(rows))))))
        return out

    def score_rows(self, rows: list[Row], owners: Sequence[Any]) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) per row; rows with the same owner and prefix form one group."""
        groups: dict[tuple[Any, tuple[int, ...]], list[int]] = {}
        for i, (r, owner) in enumerate(zip(rows, owners, strict=True)):
            groups.setdefault((owner, r.prefix), []).append(i)
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        cached: tuple[tuple[int, ...], Any] | None = None  # the last prefix computed and its keys and values
        for (_, prefix), idx in sorted(groups.items(), key=lambda g: g[0][1]):
            distinct = sorted({(rows[i].suffix, rows[i].targets) for i in idx})
            if len(distinct) == 1:
                got = {distinct[0]: self._whole(prefix, *distinct[0])}
            else:
                if cached is None or cached[0] != prefix:
                    cached = (prefix, self._prefix_cache(prefix))
                got = {}
                for b in range(0, len(distinct), self.batch_size):
                    part = distinct[b : b + self.batch_size]
                    got.update(zip(part, self._continuations(cached[1], len(prefix), part), strict=True))
            for i in idx:
                out[i] = got[(rows[i].suffix, rows[i].targets)]
        return out  # type: ignore[return-value]

    def _whole(self, prefix: tuple[int, ...], suffix: tuple[int, ...], targets: tuple[int, ...]) -> tuple[float, bool]:
        """A group of one: P + S in one pass, the head on S's positions."""
        with torch.no_grad():
            ids = torch.tensor([prefix + suffix], device=self.device)
            out = self.model(input_ids=ids, **({"logits_to_keep": len(suffix)} if self.keeps else {}))
        return _answers(out.logits[:, -len(suffix) :].float(), [targets])[0]  # (1, C, V)

    def _prefix_cache(self, prefix: tuple[int, ...]) -> Any:
        """P's keys and values (batch 1); None for an empty P."""
        if not prefix:
            return None
        with torch.no_grad():
            ids = torch.tensor([prefix], device=self.device)
            out = self.model(input_ids=ids, use_cache=True, **({"logits_to_keep": 1} if self.keeps else {}))
        return out.past_key_values

    def _continuations(
        self, past: Any, start: int, part: list[tuple[tuple[int, ...], tuple[int, ...]]]
    ) -> list[tuple[float, bool]]:
        """S rows of one prefix, right-padded, against a copy of its cache expanded to the batch."""
        width = max(len(s) for s, _ in part)
        ids = torch.full((len(part), width), self.pad, dtype=torch.long)
        for j, (s, _) in enumerate(part):
            ids[j, : len(s)] = torch.tensor(s)
        if past is not None:
            past = copy.deepcopy(past)  # the forward pass appends S to the cache it is given
            past.batch_repeat_interleave(len(part))
        with torch.no_grad():
            pos = torch.arange(start, start + width, device=self.device).expand(len(part), width)
            ids = ids.to(self.device)
            out = self.model(input_ids=ids, past_key_values=past, position_ids=pos, use_cache=past is not None)
        logits = out.logits.float()  # (B, width, V)
        return _answers(logits, [t for _, t in part])

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, one request at a time, as HFLM generates a batch (module docstring)."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
        from lm_eval.models.utils_hf import stop_sequences_criteria

        eos = self.hf.tok_decode(self.eot_token_id, skip_special_tokens=False)
        out = []
        for r in requests:
            context, gen_kwargs = r.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.hf.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = kwargs.pop("max_gen_toks")
            if kwargs.get("temperature", 0.0) == 0.0 and not kwargs.get("do_sample"):
                kwargs.pop("temperature", None)
                kwargs["do_sample"] = False
            ids, mask = self.hf.tok_batch_encode(
                [context], left_truncate_len=self.max_length - max_gen, truncation=self.hf.truncation
            )
            ids, mask = ids.to(self.device), mask.to(self.device)
            with torch.no_grad():
                gen = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_length=kwargs.pop("max_length", ids.shape[1] + max_gen),
                    stopping_criteria=stop_sequences_criteria(self.tokenizer, until, ids.shape[1], 1),
                    pad_token_id=self.tokenizer.pad_token_id,
                    use_cache=True,
                    **kwargs,
                )
            text = self.hf.tok_decode(gen[0, ids.shape[1] :].tolist())
            out.append(postprocess_generated_text(generation=text, stop=until, think_end_token=None))
        return out


def _answers(logits: Any, targets: list[tuple[int, ...]]) -> list[tuple[float, bool]]:
    """(Σ log p(target), every target the argmax) per row of `logits` (B, width, V), row j's targets at its first
    len(targets[j]) positions."""
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for j, t in enumerate(targets):
        lp = logp[j, : len(t)]  # (C, V)
        want = torch.tensor(t, device=lp.device)
        out.append((float(lp.gather(-1, want[:, None]).sum()), bool((lp.argmax(-1) == want).all())))
    return out
