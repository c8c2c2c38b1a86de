"""Our lm-eval model (`backend: quantize`, lm-eval's registry name "quantize-kv"): each distinct context computed
once, every continuation of it scored from its cached keys and values, an item's numbers independent of its batch;
a checkpoint that rounds activations (FP8, W8A8, NVFP4, ...) scored one request a pass, as HFLM at batch size 1.

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
    recorded       each request's row (P + S) and targets, per item (engine.ScoredTokens): the hash of its tokens in
                   its score record, which a gate compares with the other side's

The requests are grouped by (task, document, P): one item's continuations that share a context. A group of one
continuation (or with an empty P) is a whole row, P + S; a larger group shares P, except in a model that rounds
activations (below), where every continuation is a whole row. How the rows meet the model depends on whether
rows of different items may share a forward pass (`packs`, below):

    packed         (dense full-attention models on the CPU, unquantized or with weights alone quantized) rows
                   of several items share a pass, and what a row's numbers depend on is fixed by the row alone:
        whole rows     right-padded to their length rounded up to QUANTUM tokens (W); the LM head on the pass's
                       last KEEP positions when they hold the row's scored ones, else on all W; rows of one
                       (W, head) shape share a pass, up to `batch_size` rows and TOKEN_BUDGET positions
        shared groups  P right-padded to a multiple of QUANTUM (Wp), its keys and values kept; its continuations
                       right-padded to a multiple of SUFFIX_QUANTUM (Ws), each reading its own P's cache rows
                       with P's padding masked out; groups of one (Wp, Ws, continuations) shape share both
                       passes, up to `batch_size` groups and TOKEN_BUDGET positions
    alone          (everything else) a whole row is one pass of its own (batch 1, the head on S's positions); a
                   shared group runs P once (batch 1, its keys and values kept; groups sorted by P, a distinct P
                   computed once per call) and its continuations right-padded in batches of `batch_size` against
                   a copy of that cache expanded to the batch. A row's numbers depend on its own item only.

Right padding needs no mask for a whole row: a causal row never reads the positions after it. In a packed pass a
row's width, head positions and mask are its own; the pass's other rows change only the matrix products' M
dimension. That an item's floats do not move with M (for M of 8 and more: a width is a multiple of 8) is
measured, not guaranteed by the kernels: on the 2-core AMD EPYC (AVX-512) and AMX Xeon hosts this project runs
on, a row gives the same bits alone, in a pass of 4 and of 16, and tests/evaluate/test_lm.py asserts it on every
run (an item alone, in a batch of 16, in another stage, and every item of a mixed call against a call of its own,
on each dense family of tests/families.py), so a machine whose kernels split the reduction by M fails there, not
in a verdict. Packing is wrong where rows interact inside the model, or where the model turns a row's width into
another answer, so `packs` refuses it there:

    sliding windows   a padded prefix's masked positions count towards the window in the cache, so a packed
                      row reads another window than HFLM's (Gemma 3: 0.57 nats off, is_greedy differing)
    routed experts    an expert's matrix product takes whichever tokens are routed to it from every row of the
                      pass, so a row's floats move with its neighbours (Qwen3-MoE, gpt-oss)
    other devices     M-independence holds on the CPU; a GPU's kernels choose by shape (an H200 in float32:
                      12-23 of 24 items' floats moved with their neighbours, docs/results.md)
    rounded           a checkpoint that quantizes activations (compressed-tensors' input or output activations:
    activations       FP8 dynamic and static, FP8 block, W8A8, W4AFP8, NVFP4, MXFP4) or its KV cache
                      (`kv_cache_scheme`): a row's padded width moves its floats by ~1e-6, and an activation
                      rounding step turns that into another value, layer after layer (FP8 dynamic on the default
                      model in float32: packed 1.29 nats from stock HFLM and 6 is_greedy flips in 300 key-value
                      items, docs/results.md "Revision 7"). A context's keys and values computed apart from its
                      continuations are other floats too, amplified alike (a tiny W8A8 model: 1.5e-3 nats), so
                      such a model shares no context: every request is a whole row, alone (batch 1, unpadded),
                      what HFLM computes at batch size 1 (tests/evaluate/test_lm.py holds it within 1e-4)

and the rule reads the transformers config and the loaded model: its `quantization_config` and the
compressed-tensors scheme on each module (`rounds_activations`: a quantization method other than
compressed-tensors, GPTQ or AWQ counts as rounding activations) and quantize/checkpoint/architecture
(`attention_layers`, `moe_spec`): nothing but weights rounded, every layer full attention and no routed experts;
a config it cannot read is not packed.

Sharing a context is refused alike (`shares_contexts`) where a layer's cache is not per-position keys and values:
a linear-attention, state-space or convolution layer's state and DeepSeek-V3.2's indexer keys cannot be copied
across a batch of continuations (transformers' hybrid caches have no `batch_repeat_interleave`; the indexer's
cache does not expand), so on those families every request is a whole row, alone, as for rounded activations.

Document perplexity: lm-eval's rolling windows (`lm_eval.utils.get_rolling_token_windows`,
`make_disjoint_window`, context length 1), each window a whole row, every document's windows in one call,
summed per document. Generation: one request at a time (batch 1, no padding), greedy through transformers'
`generate` with lm-eval's stop criteria and post-processing, as HFLM's `generate_until` runs a batch; each step's raw
logits (`output_logits`) give the log-likelihood of the generated tokens (`generated_ll`), recorded per item
(engine.ScoredTokens): NaN or infinite where a step's logits were not finite, so a broken checkpoint's empty
answers are non-finite evidence, not a finite model's wrong ones.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from quantize.checkpoint import architecture
from quantize.checkpoint.loader import LastModel
from quantize.checkpoint.rounding import rounds_activations
from quantize.compat import lm_eval as lm_eval_compat
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate.engine import ScoredTokens

NAME = "quantize-kv"
QUANTUM = 8  # packed: rows and prefixes are padded to a multiple of this many tokens
SUFFIX_QUANTUM = 4  # packed: a shared group's continuations, to a multiple of this many
KEEP = 12  # packed: a whole row's head runs on its pass's last KEEP positions when its scored ones lie there
TOKEN_BUDGET = 2048  # packed: positions a pass holds at most (rows × width), unless one row alone is wider
PACKED_DEVICES = ("cpu",)  # where an item's floats were measured not to move with the pass's rows


def packs(config: Any, device: Any, modules: Iterable[Any] = ()) -> bool:
    """Whether rows of different items may share a forward pass (module docstring): on a device of
    PACKED_DEVICES, with nothing but weights rounded (`rounds_activations` on `config` and the loaded model's
    `modules`), every layer full attention and no routed experts by `config` (a transformers config); False for
    any config quantize/checkpoint/architecture cannot read."""
    if torch.device(device).type not in PACKED_DEVICES or rounds_activations(config, modules):
        return False
    cfg = config.to_dict()
    try:
        full = all(layer.kind == "full_attention" for layer in architecture.attention_layers(cfg))
        return full and architecture.moe_spec(cfg) is None
    except UsageError:
        return False


# layer kinds (checkpoint/architecture.attention_layers) whose cache holds each position's keys and values alone, so
# a context's cache can be copied across a batch of continuations (transformers' batch_repeat_interleave): a
# recurrent, state-space or convolution layer's state, or a sparse-attention indexer's keys, cannot be so copied
SHARED_CACHE_KINDS = ("full_attention", "sliding_attention", "chunked_attention")


def shares_contexts(config: Any, modules: Iterable[Any] = ()) -> bool:
    """Whether one item's continuations may share its context's keys and values (module docstring): nothing rounds
    activations (`rounds_activations`) and every layer is attention of SHARED_CACHE_KINDS; False for any config
    quantize/checkpoint/architecture cannot read. Elsewhere every request is a whole row, alone: HFLM's numbers at
    batch size 1."""
    if rounds_activations(config, modules):
        return False
    try:
        return all(layer.kind in SHARED_CACHE_KINDS for layer in architecture.attention_layers(config.to_dict()))
    except UsageError:
        return False


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


class Whole(NamedTuple):
    tokens: tuple[int, ...]  # P + S
    n: int  # C: the scored positions, inp's last C
    targets: tuple[int, ...]


class Shared(NamedTuple):
    prefix: tuple[int, ...]
    conts: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # its distinct (S, targets), sorted


class WholeShape(NamedTuple):
    batch: int  # rows a pass at most
    width: int
    keep: int  # positions the head runs on, the last ones


class SharedShape(NamedTuple):
    groups: int  # groups a pass at most
    prefix: int  # prefix width
    suffix: int  # continuation width
    conts: int  # continuations per group


@register_model(NAME)
class PrefixLM(TemplateLM):
    """A causal LM scored with each distinct context computed once (module docstring). `pretrained`: a loaded
    transformers model with its `tokenizer`, or a checkpoint folder, loaded by our loader (safetensors only,
    strict) in `dtype` on `device`. `pack`: whether rows of different items share passes; None (the default)
    decides by `packs`. A model that rounds activations (`rounds_activations`) shares no context: each request
    is a whole row."""

    def __init__(  # noqa: PLR0913 (lm-eval passes a suite's model_args as keywords; each is one of them)
        self,
        pretrained: Any,
        tokenizer: Any = None,
        batch_size: int | str = 16,
        max_length: int | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        trust_remote_code: bool = False,
        pack: bool | None = None,
    ) -> None:
        super().__init__()
        from lm_eval.models.huggingface import HFLM

        if isinstance(pretrained, (str, Path)):
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
        self.pack = packs(self.model.config, self.model.device, self.model.modules()) if pack is None else bool(pack)
        # a model that rounds activations, or whose layers keep a state or an indexer's keys, runs every request as
        # one whole row (module docstring)
        self.share = shares_contexts(self.model.config, self.model.modules())
        self.scored = ScoredTokens()  # each item's tokens as scored, hashed into its score record

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
            self.scored.add(r, rows[-1].prefix + rows[-1].suffix, rows[-1].targets)
        # one item's continuations that share a context form a group (module docstring)
        return self.score_rows(rows, [(r.task_name, r.doc_id) for r in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood: the sum over lm-eval's rolling windows, each window scored alone."""
        windows = rolling_rows(self, requests, self.scored)
        rows, owners = [r for _, _, r in windows], [(d, w) for d, w, _ in windows]
        sums = [0.0] * len(requests)
        for (d, _), (ll, _) in zip(owners, self.score_rows(rows, owners), strict=True):
            sums[d] += ll
        return sums

    def score_rows(self, rows: list[Row], owners: Sequence[Any]) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) per row. Rows with the same owner and prefix form one group: a group of one
        continuation, or with an empty prefix, or of a model that does not `share` contexts, is whole rows; a
        larger group shares its prefix. Each whole row and each shared group gets the numbers it gets alone,
        whatever else the call holds (module docstring)."""
        groups: dict[tuple[Any, tuple[int, ...]], list[int]] = {}
        for i, (r, owner) in enumerate(zip(rows, owners, strict=True)):
            groups.setdefault((owner, r.prefix), []).append(i)
        wholes: set[Whole] = set()
        shared: set[Shared] = set()
        group_of: dict[tuple[Any, tuple[int, ...]], Shared | None] = {}
        for (owner, prefix), idx in groups.items():
            distinct = tuple(sorted({(rows[i].suffix, rows[i].targets) for i in idx}))
            if len(distinct) == 1 or not prefix or not self.share:
                wholes.update(Whole(prefix + s, len(s), t) for s, t in distinct)
                group_of[(owner, prefix)] = None
            else:
                shared.add(Shared(prefix, distinct))
                group_of[(owner, prefix)] = Shared(prefix, distinct)
        got_whole = self._score_wholes(sorted(wholes))
        got_shared = self._score_shared(sorted(shared))
        out = []
        for r, owner in zip(rows, owners, strict=True):
            g = group_of[(owner, r.prefix)]
            if g is None:
                out.append(got_whole[Whole(r.prefix + r.suffix, len(r.suffix), r.targets)])
            else:
                out.append(got_shared[g][g.conts.index((r.suffix, r.targets))])
        return out

    def _score_wholes(self, wholes: list[Whole]) -> dict[Whole, tuple[float, bool]]:
        """Packed: whole rows in passes of one shape each; alone: each row a pass of its own."""
        got: dict[Whole, tuple[float, bool]] = {}
        if not self.pack:
            for w in wholes:
                got[w] = self._wholes(WholeShape(1, len(w.tokens), w.n), [w])[0]
            return got
        for shape, part in _batches(wholes, self.whole_shape):
            got.update(zip(part, self._wholes(shape, part), strict=True))
        return got

    def _score_shared(self, shared: list[Shared]) -> dict[Shared, list[tuple[float, bool]]]:
        """Packed: shared groups in passes of one shape each; alone: each prefix a batch-1 pass, its continuations
        in batches of batch_size against its cache (sorted by prefix: a prefix two groups share runs once)."""
        got: dict[Shared, list[tuple[float, bool]]] = {}
        if self.pack:
            for shape, part in _batches(shared, self.shared_shape):
                got.update(zip(part, self._shared(shape, part), strict=True))
            return got
        cached: tuple[tuple[int, ...], Any] | None = None  # the last prefix computed and its keys and values
        for g in shared:
            if cached is None or cached[0] != g.prefix:
                cached = (g.prefix, self._prefix_cache(g.prefix))
            got[g] = []
            for b in range(0, len(g.conts), self.batch_size):
                got[g] += self._continuations(cached[1], len(g.prefix), list(g.conts[b : b + self.batch_size]))
        return got

    def whole_shape(self, w: Whole) -> WholeShape:
        """A packed whole row's pass, from the row alone: its length rounded up to QUANTUM (W), the head on the
        last KEEP positions when they hold its scored ones (else on all W), as many rows as fit TOKEN_BUDGET (at
        most batch_size)."""
        width = _width(len(w.tokens))
        keep = min(width, KEEP) if width - len(w.tokens) + w.n <= KEEP else width
        return WholeShape(_rows(self.batch_size, width), width, keep)

    def shared_shape(self, g: Shared) -> SharedShape:
        """A packed shared group's passes, from the group alone: prefix width (QUANTUM), continuation width
        (SUFFIX_QUANTUM), its number of continuations, and how many such groups a pass holds (batch_size, fewer
        where TOKEN_BUDGET says so)."""
        wp, ws = _width(len(g.prefix)), _width(max(len(s) for s, _ in g.conts), SUFFIX_QUANTUM)
        n = len(g.conts)
        return SharedShape(_rows(self.batch_size, n * (wp + ws)), wp, ws, n)

    def _wholes(self, shape: WholeShape, part: list[Whole]) -> list[tuple[float, bool]]:
        """Whole rows of one shape, right-padded to its width; the head on its last `keep` positions."""
        ids = torch.full((len(part), shape.width), self.pad, dtype=torch.long)
        for j, w in enumerate(part):
            ids[j, : len(w.tokens)] = torch.tensor(w.tokens)
        with torch.no_grad():
            logits = self.model(
                input_ids=ids.to(self.device),
                use_cache=False,
                **({"logits_to_keep": shape.keep} if self.keeps else {}),
            ).logits
        base = shape.width - logits.shape[1]  # the position of logits[:, 0]
        return [
            _answer(logits[j, len(w.tokens) - w.n - base : len(w.tokens) - base], w.targets) for j, w in enumerate(part)
        ]

    def _shared(self, shape: SharedShape, part: list[Shared]) -> list[list[tuple[float, bool]]]:
        """Packed shared groups of one shape: the prefixes right-padded in one pass (keys and values kept, the head
        on one position), then every group's continuations right-padded in one pass against its prefix's rows of
        that cache, the prefix's padding masked out."""
        wp, ws, n = shape.prefix, shape.suffix, shape.conts
        ids = torch.full((len(part), wp), self.pad, dtype=torch.long)
        for j, g in enumerate(part):
            ids[j, : len(g.prefix)] = torch.tensor(g.prefix)
        with torch.no_grad():
            past = self.model(
                input_ids=ids.to(self.device), use_cache=True, **({"logits_to_keep": 1} if self.keeps else {})
            ).past_key_values
        past.batch_repeat_interleave(n)  # row r of the continuations reads group r // n's prefix
        ids = torch.full((len(part) * n, ws), self.pad, dtype=torch.long)
        mask = torch.ones((len(part) * n, wp + ws), dtype=torch.long)
        pos = torch.empty((len(part) * n, ws), dtype=torch.long)
        for j, g in enumerate(part):
            for c, (s, _) in enumerate(g.conts):
                r = j * n + c
                ids[r, : len(s)] = torch.tensor(s)
                mask[r, len(g.prefix) : wp] = 0
                mask[r, wp + len(s) :] = 0
                pos[r] = torch.arange(len(g.prefix), len(g.prefix) + ws)
        with torch.no_grad():
            logits = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                past_key_values=past,
                position_ids=pos.to(self.device),
                use_cache=True,
            ).logits
        return [
            [_answer(logits[j * n + c, : len(s)], t) for c, (s, t) in enumerate(g.conts)] for j, g in enumerate(part)
        ]

    def _prefix_cache(self, prefix: tuple[int, ...]) -> Any:
        """Alone: P's keys and values (batch 1)."""
        with torch.no_grad():
            ids = torch.tensor([prefix], device=self.device)
            out = self.model(input_ids=ids, use_cache=True, **({"logits_to_keep": 1} if self.keeps else {}))
        return out.past_key_values

    def _continuations(
        self, past: Any, start: int, part: list[tuple[tuple[int, ...], tuple[int, ...]]]
    ) -> list[tuple[float, bool]]:
        """Alone: S rows of one prefix, right-padded, against a copy of its cache expanded to the batch."""
        width = max(len(s) for s, _ in part)
        ids = torch.full((len(part), width), self.pad, dtype=torch.long)
        for j, (s, _) in enumerate(part):
            ids[j, : len(s)] = torch.tensor(s)
        past = copy.deepcopy(past)  # the forward pass appends S to the cache it is given
        past.batch_repeat_interleave(len(part))
        with torch.no_grad():
            pos = torch.arange(start, start + width, device=self.device).expand(len(part), width)
            logits = self.model(
                input_ids=ids.to(self.device), past_key_values=past, position_ids=pos, use_cache=True
            ).logits
        return [_answer(logits[j, : len(t)], t) for j, (_, t) in enumerate(part)]

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
            self.scored.add(r, ids[0][mask[0].bool()].tolist())  # one prompt: its mask holds no padding
            ids, mask = ids.to(self.device), mask.to(self.device)
            max_length = kwargs.pop("max_length", ids.shape[1] + max_gen)
            # the raw logits of every step, to record what was generated from (generated_ll); the tokens are the same
            kwargs.update(output_logits=True, return_dict_in_generate=True)
            with torch.no_grad():
                gen = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_length=max_length,
                    stopping_criteria=stop_sequences_criteria(self.tokenizer, until, ids.shape[1], 1),
                    pad_token_id=self.tokenizer.pad_token_id,
                    use_cache=True,
                    **kwargs,
                )
            made = gen.sequences[0, ids.shape[1] :]
            self.scored.generated(r, generated_ll(gen.logits, made))
            text = self.hf.tok_decode(made.tolist())
            out.append(postprocess_generated_text(generation=text, stop=until, think_end_token=None))
        return out


def rolling_rows(lm: Any, requests: list[Any], scored: ScoredTokens | None = None) -> list[tuple[int, int, Row]]:
    """(document, window, row) of every document of `requests` (lm-eval's loglikelihood_rolling requests): lm-eval's
    rolling windows (`get_rolling_token_windows`, `make_disjoint_window`, context length 1) over `lm`'s tokens, with
    its prefix token and max length, each window a row; `scored` records each document's rows and targets."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    out = []
    for d, r in enumerate(requests):
        windows = get_rolling_token_windows(
            token_list=lm.tok_encode(r.args[0]),
            prefix_token=lm.prefix_token_id,
            max_seq_len=lm.max_length,
            context_len=1,
        )
        rows = [row(*make_disjoint_window(window), lm.max_length) for window in windows]
        out += [(d, w, x) for w, x in enumerate(rows)]
        if scored is not None:
            scored.add(r, *(seq for x in rows for seq in (x.prefix + x.suffix, x.targets)))
    return out


def _rows(batch_size: int, width: int) -> int:
    """Rows of `width` positions a pass holds: batch_size, fewer where TOKEN_BUDGET says so, at least one."""
    return max(1, min(batch_size, TOKEN_BUDGET // width))


def _batches(jobs: list[Any], shape: Any) -> Iterator[tuple[Any, list[Any]]]:
    """`jobs` (sorted) in passes of one shape each (`shape(job)`), at most the shape's batch (its first field)
    jobs a pass."""
    by_shape: dict[Any, list[Any]] = {}
    for j in jobs:
        by_shape.setdefault(shape(j), []).append(j)
    for sh, same in sorted(by_shape.items()):
        for b in range(0, len(same), sh[0]):
            yield sh, same[b : b + sh[0]]


def _width(n: int, quantum: int = QUANTUM) -> int:
    """A packed row's padded width: its length rounded up to a multiple of `quantum`, a function of the row
    alone."""
    return -(-n // quantum) * quantum


def generated_ll(logits: Sequence[Any], made: Any) -> float:
    """Σ log p(token) of the tokens `made` (T,), each from its step's raw logits (T tensors (1, V), transformers'
    `output_logits`; log_softmax in float32): finite wherever the logits are (a greedy or sampled token has a
    finite logit), NaN or infinite where a step's logits held NaN or +∞ (a broken checkpoint, its answer no
    answer: ScoredTokens)."""
    if len(logits) != len(made):
        raise RuntimeFailure(f"generate returned logits for {len(logits)} steps and {len(made)} tokens: a bug of ours")
    if not len(made):
        return 0.0
    return float(sum(torch.log_softmax(x[0].float(), dim=-1)[t] for x, t in zip(logits, made, strict=True)))


def _answer(logits: Any, targets: tuple[int, ...]) -> tuple[float, bool]:
    """(Σ log p(target), every target the argmax) from the logits (C, V) of the positions that predict them
    (log_softmax in float32)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    want = torch.tensor(targets, device=lp.device)
    return float(lp.gather(-1, want[:, None]).sum()), bool((lp.argmax(-1) == want).all())
