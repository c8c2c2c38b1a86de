"""Token-distribution agreement between a candidate and its baseline on the golden prompts.

lm-eval scores answers; this scorer compares whole next-token distributions. For the baseline it
stores, at every scored position (the positions that predict the gold continuation, or every
token of a prose document), the top-k log-probabilities p_1..p_k and the remaining mass
r = 1 − Σ p_i. For a candidate with full distribution q at the same positions:

    KL_topk(p‖q) = Σ_i p_i log(p_i / q_i) + r log(r / q_rest),  q_rest = 1 − Σ_i q_i
    top-1 agreement = [argmax q = argmax p]
    Σ min(p, q) ≈ Σ_i min(p_i, q_i) + min(r, q_rest)

Grouping the tail into one bucket can only lose divergence (log-sum inequality), so KL_topk is a
LOWER BOUND of the full KL; by the same grouping the Σ min estimate is an UPPER BOUND of the true
Σ min(p, q), the acceptance rate α this checkpoint would have as a speculative draft for its
baseline (Leviathan et al. 2023). Prompts are tokenized by lm-eval's own HF model wrapper
(`_encode_pair` for context/continuation, the prefix token for rolling documents), so the scored
positions are the ones lm-eval scores.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize import progress
from quantize.cache import checked_bytes, claimed, seal
from quantize.checkpoint import qdq
from quantize.checkpoint.files import check_identity, identity_sha256
from quantize.checkpoint.loader import LastModel, usable_device
from quantize.compat import lm_eval as lm_eval_compat
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate import cache
from quantize.evaluate.engine import gguf_to_score
from quantize.evaluate.score import check_threads, llamacpp_lm, runtime, vllm_lm
from quantize.evaluate.suite import Backend, OpenSuite
from quantize.golden.manifest import GoldenSet, lm_eval_tasks
from quantize.golden.manifest import item_id as golden_item_id
from quantize.io import atomic_file
from quantize.records import AgreementResult
from quantize.stats import clustered_se

BASELINE_SCHEMA_VERSION = 1
NOTE = (
    "KL over the baseline's top-k plus one tail bucket: a lower bound of the full KL; "
    "Σ min(p, q) likewise an upper bound (the acceptance rate as a draft for the baseline)"
)


@dataclass
class Request:
    id: str
    task: str
    cluster: str
    context: str | None  # None: a rolling document, its last max_length tokens scored
    continuation: str


def requests(golden: GoldenSet, tasks: list[str], per_task: int) -> list[Request]:
    """The first `per_task` items of each task (manifest order is already a seeded shuffle), as lm-eval
    builds them: its prompt (few-shot examples included) and the gold continuation. A multiple-choice
    item contributes its gold choice, a generation item its reference answer (teacher-forced), a
    rolling document its tokens (the scorer keeps a document's last max_length tokens)."""
    import tempfile

    from lm_eval.tasks import TaskManager, get_task_dict

    with tempfile.TemporaryDirectory(prefix="quantize-tasks-") as tmp:
        include = lm_eval_tasks(golden, Path(tmp), None, lm_eval_compat.sandboxed_metrics())
        with lm_eval_compat.templates_refused(f"golden set {golden.path}"):  # every render of a template below
            loaded = get_task_dict(tasks, TaskManager(include_path=str(include), include_defaults=False))
            out = [r for task in tasks for r in _task_requests(golden, task, loaded[task], per_task)]
    return out


def _task_requests(golden: GoldenSet, task: str, t: Any, per_task: int) -> list[Request]:
    """One task's requests (`requests`), its first `per_task` items as lm-eval builds them."""
    out = []
    t.build_all_requests(limit=per_task, rank=0, world_size=1)
    key = golden.item_key(task)
    for inst in t.instances:
        item, cluster = golden_item_id(inst.doc, key)
        if inst.request_type == "loglikelihood_rolling":
            out.append(Request(item, task, cluster, None, inst.arguments[0]))
            continue
        if inst.request_type == "generate_until":
            target = t.doc_to_target(inst.doc)
            target = target[0] if isinstance(target, list) else target
            out.append(Request(item, task, cluster, inst.arguments[0], t.config.target_delimiter + str(target)))
            continue
        if t.OUTPUT_TYPE == "multiple_choice":
            gold = t.doc_to_target(inst.doc)
            if isinstance(gold, str):
                gold = t.doc_to_choice(inst.doc).index(gold)
            if inst.idx != gold:
                continue
        out.append(Request(item, task, cluster, *inst.arguments[:2]))
    return out


# What one forward pass may hold of the head's output: float32 logits of the scored positions only, a batch cut
# where its positions would pass this (one sequence's positions at least). 64 MiB: 341 positions of SmolLM2's
# 49,152-token vocabulary, where a batch of 16 documents of 600 tokens held 1.9 GB of logits at every position.
HEAD_BYTES = 64 * 2**20
# Positions reduced to their top-k or gathered at once (a (ROWS, V) float32 log-softmax at a time, not (P, V)).
ROWS = 64


class Scorer:
    """A loaded model behind lm-eval's HF wrapper: lm-eval's tokenization, our forward passes. The candidate's
    full distribution is known, so every baseline top-k token's log-probability is exact. The head is applied to
    the scored positions only, so memory follows the positions scored, not batch × length × vocabulary."""

    head_bytes = HEAD_BYTES

    def __init__(self, model: Any, tok: Any, batch_size: int, max_length: int | None) -> None:
        """max_length: the suite's; None: the model's, as lm-eval's HF wrapper finds it for scoring (one rule for
        both: the config's context length, else lm-eval's default)."""
        from lm_eval.models.huggingface import HFLM

        self.lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, max_length=max_length)
        self.model, self.batch_size, self.max_length = model, batch_size, self.lm.max_length

    def encode(self, req: Request) -> tuple[list[int], int]:
        """Token ids and the index of the first scored token."""
        return encode(self.lm, req)

    def batches(self, spans: list[tuple[list[int], int]]) -> list[list[int]]:
        """Indices of `spans` ((token ids, first scored index) each), longest first, in batches of at most
        batch_size whose scored positions fit head_bytes of float32 logits (a longer sequence alone)."""
        cap = max(1, self.head_bytes // (4 * self.model.config.get_text_config().vocab_size))
        out: list[list[int]] = []
        rows = 0
        for i in sorted(range(len(spans)), key=lambda i: -len(spans[i][0])):
            n = len(spans[i][0]) - spans[i][1]
            if not out or len(out[-1]) == self.batch_size or rows + n > cap:
                out.append([])
                rows = 0
            out[-1].append(i)
            rows += n
        return out

    def log_probs(self, reqs: list[Request]):
        """Yield (request, target ids (P,), logp (P, V) float32): log-softmax at each scored position."""
        import torch

        for req, target, logits in self.logits(reqs):
            yield req, target, torch.log_softmax(logits.float().cpu(), dim=-1)

    def logits(self, reqs: list[Request]):
        """Yield (request, target ids (P,), logits (P, V)): the head's output at each scored position, in the model's
        dtype and on its device (a view of the forward's output)."""
        import torch

        spans = []
        for r in reqs:
            ids, start = self.encode(r)
            seq = ids[-self.max_length :]
            spans.append((seq, max(1, start - (len(ids) - len(seq)))))
        tok = self.lm.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        for idx in self.batches(spans):
            T = max(len(spans[i][0]) for i in idx)
            ids = torch.full((len(idx), T), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), T), dtype=torch.long)
            rows, cols = [], []
            for j, i in enumerate(idx):
                seq, start = spans[i]
                ids[j, : len(seq)] = torch.tensor(seq)
                mask[j, : len(seq)] = 1
                # the token at position t is predicted by the logits at t − 1
                rows += [j] * (len(seq) - start)
                cols += range(start - 1, len(seq) - 1)
            logits = self.scored_logits(ids, mask, torch.tensor(rows, dtype=torch.long), torch.tensor(cols))
            at = 0
            for i in idx:
                seq, start = spans[i]
                n = len(seq) - start
                yield reqs[i], torch.tensor(seq[start:]), logits[at : at + n]
                at += n

    def scored_logits(self, ids: Any, mask: Any, rows: Any, cols: Any) -> Any:
        """The logits (N, V) at positions (rows[n], cols[n]) of one forward pass over ids (B, T). The head sees only
        those hidden states: a pre-hook on the model's output embeddings gathers them into a batch of one, (1, N,
        H), so what follows the head (a softcap, a scale: elementwise) applies to them alone. A model whose head is
        not that module has its full logits sliced instead; any other use of the head is our failure, named."""
        import torch

        on = self.model.device
        rows, cols = rows.to(on), cols.to(on)
        seen: list[tuple[int, ...]] = []

        def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            seen.append(tuple(args[0].shape) if args else ())
            if len(seen) > 1 or not args or tuple(args[0].shape[:2]) != tuple(ids.shape):
                return None
            return (args[0][rows, cols].unsqueeze(0), *args[1:])

        head = self.model.get_output_embeddings()
        hook = head.register_forward_pre_hook(gather) if isinstance(head, torch.nn.Module) else None
        try:
            with torch.no_grad(), qdq.installed():
                logits = self.model(input_ids=ids.to(on), attention_mask=mask.to(on)).logits
        finally:
            if hook is not None:
                hook.remove()
        if len(seen) == 1 and tuple(logits.shape[:2]) == (1, len(rows)):
            return logits[0]
        if not seen and tuple(logits.shape[:2]) == tuple(ids.shape):
            return logits[rows, cols]
        raise RuntimeFailure(
            f"{type(self.model).__name__}: its output embeddings saw hidden states {seen} and it returned logits "
            f"{tuple(logits.shape)} for input {tuple(ids.shape)}; agreement cannot find the scored positions' logits"
        )

    def topk(self, reqs: list[Request], k: int):
        """Yield (request, token ids (P, k), log-probabilities (P, k)) of the k most likely tokens per position."""
        import torch

        for req, _, logits in self.logits(reqs):
            top = [torch.topk(lp, k, dim=-1) for _, lp in chunked_log_softmax(logits)]
            yield req, torch.cat([t.indices for t in top]), torch.cat([t.values for t in top])

    def at(self, reqs: list[Request], top_idx: dict[str, Any]):
        """Yield (request, lq_k (P, k), known (P, k), argmax (P,)): the candidate's log-probabilities of the
        baseline's top-k tokens `top_idx[req.id]` (P, k), all known, and its most likely token per position."""
        import torch

        for req, _, logits in self.logits(reqs):
            bi = top_idx[req.id]
            check_positions(req, logits.shape[0], bi.shape[0])
            lq = [(lp.gather(-1, bi[a : a + ROWS]), lp.argmax(-1)) for a, lp in chunked_log_softmax(logits)]
            lq_k, argmax = torch.cat([g for g, _ in lq]), torch.cat([m for _, m in lq])
            yield req, lq_k, torch.ones_like(bi, dtype=torch.bool), argmax


def chunked_log_softmax(logits: Any):
    """Yield (a, the float32 log-softmax of positions a..a + ROWS of `logits` (P, V) on the CPU), a = 0, ROWS, ...
    (one empty chunk where P = 0)."""
    import torch

    for a in range(0, max(1, logits.shape[0]), ROWS):
        yield a, torch.log_softmax(logits[a : a + ROWS].float().cpu(), dim=-1)


def encode(lm: Any, req: Request) -> tuple[list[int], int]:
    """Token ids and the index of the first scored token, by an lm-eval model's own tokenization (any
    TemplateLM: `_encode_pair` for context/continuation, the prefix token for rolling documents)."""
    if req.context is None:
        return [lm.prefix_token_id] + lm.tok_encode(req.continuation), 1
    # lm-eval has no public call for its own context/continuation split, which must match its scoring exactly
    context, continuation = lm_eval_compat.encode_pair(lm, req.context, req.continuation)
    return context + continuation, len(context)


def check_positions(req: Request, got: int, stored: int) -> None:
    if got != stored:
        raise ValueError(
            f"item {req.id}: {got} scored positions, the baseline stored {stored}; "
            "the tokenizers differ, so agreement cannot be computed"
        )


class VLLMScorer:
    """Agreement through lm-eval's vLLM model (`lm_eval.models.vllm_causallms.VLLM`, the engine the suite's
    `backend: vllm` scores with; one load serves both). vLLM returns prompt log-probabilities, per position
    the `k` most likely tokens and the prompt's own token, never the whole distribution:

        baseline top-k     exact (the k most likely of each position)
        candidate          q_i for the baseline top-k tokens it also returned ("known"); the others fall into
                           the tail bucket with the mass beyond the top-k (position_metrics), which coarsens the
                           partition: KL stays a lower bound and Σ min an upper bound (log-sum inequality)

    `sampling_params`: vLLM's SamplingParams for a prompt-only pass (built here when None)."""

    def __init__(self, lm: Any, k: int, sampling_params: Any = None) -> None:
        if sampling_params is None:
            from vllm import SamplingParams

            sampling_params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=k, detokenize=False)
        self.lm, self.k, self.params = lm, k, sampling_params

    def _rows(self, reqs: list[Request]):
        """Yield (request, per scored position {token id: log-probability})."""
        enc = [encode(self.lm, r) for r in reqs]
        # prompt log-probabilities need vLLM's engine call, which lm-eval's VLLM model keeps private
        outs = lm_eval_compat.prompt_logprobs(self.lm, [ids for ids, _ in enc], self.params)
        for req, (_, start), out in zip(reqs, enc, outs, strict=True):
            # prompt_logprobs[t]: the distribution that predicted token t (None for the first token)
            yield req, [{t: float(getattr(x, "logprob", x)) for t, x in d.items()} for d in out.prompt_logprobs[start:]]

    def topk(self, reqs: list[Request], k: int):
        import torch

        if k > self.k:
            raise UsageError(f"agreement top_k {k} is more than the {self.k} log-probabilities asked of vLLM")
        for req, rows in self._rows(reqs):
            best = [sorted(r.items(), key=lambda kv: -kv[1])[:k] for r in rows]  # the prompt token may be extra
            if any(len(b) < k for b in best):
                raise RuntimeFailure(f"item {req.id}: vLLM returned fewer than {k} log-probabilities at a position")
            yield (
                req,
                torch.tensor([[t for t, _ in b] for b in best], dtype=torch.int64),
                torch.tensor([[v for _, v in b] for b in best], dtype=torch.float32),
            )

    def at(self, reqs: list[Request], top_idx: dict[str, Any]):
        import torch

        for req, rows in self._rows(reqs):
            bi = top_idx[req.id]
            check_positions(req, len(rows), bi.shape[0])
            known = torch.tensor([[int(t) in r for t in b.tolist()] for r, b in zip(rows, bi, strict=True)])
            lq = torch.tensor([[r.get(int(t), 0.0) for t in b.tolist()] for r, b in zip(rows, bi, strict=True)])
            top1 = torch.tensor([max(r, key=r.__getitem__) for r in rows], dtype=torch.int64)
            yield req, lq.float(), known, top1


class LlamaCppScorer:
    """Agreement through our llama.cpp model of a GGUF (evaluate/llamacpp.py, the one that scores it: one load
    serves both): its tokenization and the engine's full-vocabulary logits at the scored positions, so every
    baseline top-k token's log-probability is exact, as in `Scorer`."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    def logits(self, reqs: list[Request]):
        """Yield (request, logits (P, V) as a float32 tensor) at each request's scored positions, the sequence cut
        to its last max_length tokens as `Scorer.logits` cuts it."""
        import torch

        for r in reqs:
            ids, start = encode(self.lm, r)
            seq = ids[-self.lm.max_length :]
            yield r, torch.from_numpy(self.lm.logits(seq, max(1, start - (len(ids) - len(seq)))))

    def topk(self, reqs: list[Request], k: int):
        import torch

        for req, logits in self.logits(reqs):
            top = [torch.topk(lp, k, dim=-1) for _, lp in chunked_log_softmax(logits)]
            yield req, torch.cat([t.indices for t in top]), torch.cat([t.values for t in top])

    def at(self, reqs: list[Request], top_idx: dict[str, Any]):
        import torch

        for req, logits in self.logits(reqs):
            bi = top_idx[req.id]
            check_positions(req, logits.shape[0], bi.shape[0])
            lq = [(lp.gather(-1, bi[a : a + ROWS]), lp.argmax(-1)) for a, lp in chunked_log_softmax(logits)]
            lq_k, argmax = torch.cat([g for g, _ in lq]), torch.cat([m for _, m in lq])
            yield req, lq_k, torch.ones_like(bi, dtype=torch.bool), argmax


def position_metrics(lp: Any, lq_k: Any, same_top1: Any, known: Any = None) -> tuple[Any, Any, Any]:
    """Per-position KL lower bound, top-1 agreement and Σ min(p, q) from the baseline's top-k.

    lp: (P, k) baseline log-probabilities of its top-k tokens; lq_k: (P, k) the candidate's
    log-probabilities of the same tokens; same_top1: (P,) whether the candidate's argmax is the
    baseline's; known: (P, k) which of lq_k the candidate reported (default all; vLLM reports its own
    top-k only). The tail is one bucket: every token not both in the top-k and known,
    r = 1 − Σ_known p, q_rest = 1 − Σ_known q."""
    import torch

    if known is None:
        known = torch.ones_like(lp, dtype=torch.bool)
    p = torch.where(known, lp.exp(), torch.zeros_like(lp))
    q_k = torch.where(known, lq_k.exp(), torch.zeros_like(lq_k))
    r = (1 - p.sum(-1)).clamp_min(0)  # (P,)
    q_rest = (1 - q_k.sum(-1)).clamp_min(1e-12)
    tail = torch.where(r > 0, r * (r.clamp_min(1e-12).log() - q_rest.log()), torch.zeros_like(r))
    kl = (torch.where(known, p * (lp - lq_k), torch.zeros_like(lp)).sum(-1) + tail).clamp_min(0)
    smin = torch.minimum(p, q_k).sum(-1) + torch.minimum(r, q_rest)
    return kl, same_top1.float(), smin


@dataclass(frozen=True)
class BaselineTopK:
    """The baseline's top-k at every agreement position, item after item: P = Σ counts positions in all.

    ids, clusters   one per item, in the order stored
    counts          (items,) positions per item
    top_idx         (P, k) int32 token ids of the k most likely tokens, most likely first
    top_logp        (P, k) float32 their log-probabilities

    Saved as .npz (arrays, not a JSON record) with its own schema_version; `load` refuses a file it cannot read
    as a UsageError naming it."""

    ids: list[str]
    clusters: list[str]
    counts: Any
    k: int
    top_idx: Any
    top_logp: Any

    @functools.cached_property
    def _slices(self) -> dict[str, slice]:
        ends = [int(x) for x in self.counts.cumsum()]
        return {i: slice(e - int(n), e) for i, n, e in zip(self.ids, self.counts, ends, strict=True)}

    def rows(self, item_id: str) -> slice:
        """The rows of `top_idx`/`top_logp` that belong to one item."""
        return self._slices[item_id]

    def save(self, path: Path) -> None:
        import numpy as np

        with atomic_file(path) as tmp:
            np.savez_compressed(
                tmp,
                schema_version=np.asarray(BASELINE_SCHEMA_VERSION),
                ids=np.asarray(self.ids),
                clusters=np.asarray(self.clusters),
                counts=self.counts,
                k=np.asarray(self.k),
                top_idx=self.top_idx,
                top_logp=self.top_logp,
            )


def baseline_topk(
    scorer: Scorer | VLLMScorer | LlamaCppScorer, reqs: list[Request], k: int, st: progress.Stage | None = None
) -> BaselineTopK:
    """`st`: the progress stage advanced per item."""
    import numpy as np
    import torch

    ids, clusters, counts, top_idx, top_lp = [], [], [], [], []
    for req, i, v in progress.counted(st, scorer.topk(reqs, k)):  # (P, k) each
        ids.append(req.id)
        clusters.append(req.cluster)
        counts.append(v.shape[0])
        top_idx.append(i.to(torch.int32).numpy())
        top_lp.append(v.numpy().astype(np.float32))
    return BaselineTopK(ids, clusters, np.asarray(counts), k, np.concatenate(top_idx), np.concatenate(top_lp))


def item_metrics(scorer: Scorer | VLLMScorer | LlamaCppScorer, reqs: list[Request], base: BaselineTopK):
    """Yield (request, KL lower bound (P,), top-1 agreement (P,), Σ min(p, q) (P,)) at each of its scored
    positions, against the stored baseline (position_metrics); one scorer call, so one batch plan."""
    import numpy as np
    import torch

    top_idx = {r.id: torch.from_numpy(base.top_idx[base.rows(r.id)].astype(np.int64)) for r in reqs}  # (P, k) per item
    for req, lq_k, known, argmax in scorer.at(reqs, top_idx):
        lp = torch.from_numpy(base.top_logp[base.rows(req.id)])  # (P, k)
        yield req, *position_metrics(lp, lq_k, argmax == top_idx[req.id][:, 0], known)


def summarize(rows: list[tuple[Request, Any, Any, Any]]) -> dict[str, Any]:
    """Mean KL lower bound, top-1 agreement and Σ min(p, q) over every position of these items (item_metrics),
    SEs clustered by the items' clusters."""
    import numpy as np

    kl, top1, smin, clusters = [], [], [], []
    for req, k_pos, t_pos, s_pos in rows:
        kl.extend(k_pos.tolist())
        top1.extend(t_pos.tolist())
        smin.extend(s_pos.tolist())
        clusters.extend([req.cluster] * len(k_pos))
    n = len(kl)
    return {
        "positions": n,
        "items": len(rows),
        "clusters": len(set(clusters)),
        "kl_mean": sum(kl) / n,
        "kl_se": clustered_se(kl, clusters),
        "kl_p99": float(np.quantile(kl, 0.99)),
        "top1": sum(top1) / n,
        "top1_se": clustered_se(top1, clusters),
        "sum_min": sum(smin) / n,
        "sum_min_se": clustered_se(smin, clusters),
        "note": NOTE,
    }


def compare(
    scorer: Scorer | VLLMScorer | LlamaCppScorer,
    reqs: list[Request],
    base: BaselineTopK,
    st: progress.Stage | None = None,
) -> dict[str, Any]:
    """Mean KL lower bound, top-1 agreement and Σ min(p, q) against the stored baseline, SEs
    clustered by the items' clusters; `st`: the progress stage advanced per item."""
    return summarize(list(progress.counted(st, item_metrics(scorer, reqs, base))))


REBUILD_TOPK = "delete it, and the next `quantize gate` (or `quantize agree`) computes it again"


def load_baseline(path: Path, raw: bytes | None = None) -> BaselineTopK:
    """A cached baseline top-k (`raw`: its bytes, already read and checked against their digest); a file numpy
    cannot read, or that lacks an array, is the cache's to rebuild (exit 2 naming the file), never a crash."""
    import io
    import zipfile

    import numpy as np

    try:
        z = np.load(io.BytesIO(raw) if raw is not None else path, allow_pickle=False)
        # efcadec stored the same arrays without a version: read as version 1
        version = int(z["schema_version"]) if "schema_version" in z.files else BASELINE_SCHEMA_VERSION
        if version != BASELINE_SCHEMA_VERSION:
            raise UsageError(
                f"{path} holds a baseline top-k of schema_version {version}; this quantize reads "
                f"{BASELINE_SCHEMA_VERSION}: {REBUILD_TOPK}"
            )
        out = BaselineTopK(
            [str(x) for x in z["ids"]],
            [str(x) for x in z["clusters"]],
            z["counts"],
            int(z["k"]),
            z["top_idx"],
            z["top_logp"],
        )
    except UsageError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError) as e:
        raise UsageError(
            f"cached baseline top-k {path} cannot be read ({type(e).__name__}: {str(e)[:120]}); {REBUILD_TOPK}"
        ) from None
    if len(out.ids) != len(out.clusters) or out.top_idx.shape != out.top_logp.shape or len(out.ids) != len(out.counts):
        raise UsageError(
            f"cached baseline top-k {path} is inconsistent (ids, clusters or top-k arrays differ "
            f"in length); {REBUILD_TOPK}"
        )
    return out


def _scorer(suite: OpenSuite, checkpoint: Path, models: LastModel) -> Scorer | VLLMScorer | LlamaCppScorer:
    """The model lm-eval scores with, as an agreement scorer (the same object: one load per checkpoint)."""
    s = suite.suite
    if (gguf := gguf_to_score(checkpoint, s)) is not None:
        return LlamaCppScorer(llamacpp_lm(s, gguf, models))
    on = usable_device(s.device, f"suite {suite.path}: `device:`")
    if s.backend is Backend.vllm:
        return VLLMScorer(vllm_lm(s, checkpoint, on, models), s.agreement.top_k)
    model, tok = models.get(checkpoint, dtype=s.model_dtype(on), on=on)  # as lm-eval scores it
    return Scorer(model, tok, s.batch_size, s.max_length)


def agreement_requests(suite: OpenSuite) -> list[Request]:
    return requests(suite.golden, suite.agreement_tasks, suite.suite.agreement.per_task)


def baseline_topk_cached(
    suite: OpenSuite,
    baseline: Path,
    base_id: str,
    models: LastModel,
    reqs: list[Request] | None = None,
    before_store: Callable[[], None] | None = None,
) -> BaselineTopK:
    """The baseline's top-k at the agreement positions: from the cache, or computed and cached (`before_store`
    is called first, and may raise: the identity's check, api.agreement)."""
    run = runtime(suite, models.trust_remote_code, baseline)
    path = cache.baseline_topk_path(suite, base_id, run)
    if (raw := checked_bytes(path, REBUILD_TOPK, "baseline top-k")) is not None:  # beside its digest only
        return load_baseline(path, raw)
    reqs = reqs or agreement_requests(suite)
    scorer = _scorer(suite, baseline, models)
    with progress.stage(f"baseline top-k of {baseline.name}", len(reqs)) as st:
        base = baseline_topk(scorer, reqs, suite.suite.agreement.top_k, st)
    check_identity(baseline, base_id)  # what loaded and was measured is what the identity names
    check_threads(baseline, run)
    if before_store is not None:
        before_store()
    base.save(path)
    seal(path)
    return base


def agreement_scores(  # noqa: PLR0913  # identities and a model a gate already has, each optional
    suite: OpenSuite,
    baseline: Path,
    candidate: Path,
    base_id: str | None = None,
    cand_id: str | None = None,
    trust_remote_code: bool = False,
    models: LastModel | None = None,
    before_store: Callable[[], None] | None = None,
) -> AgreementResult:
    """The candidate's agreement with the baseline (cached; the baseline's top-k is cached apart).
    The checkpoint identities are computed when not given (a gate passes the ones its scores carry);
    `models` reuses a model the caller already loaded (a gate scores the candidate, then measures it);
    `before_store` is called before anything measured is cached under those identities, and may raise (their
    Hub blob names checked: api.agreement)."""
    models = models or LastModel(trust_remote_code)
    base_id = base_id or identity_sha256(baseline)
    cand_id = cand_id or identity_sha256(candidate)
    # both sides' runtimes key the comparison (a GGUF on either side: its llama.cpp engine)
    runs = runtime(suite, models.trust_remote_code, candidate), runtime(suite, models.trust_remote_code, baseline)
    if (found := cache.lookup_agreement(suite, base_id, cand_id, *runs)) is not None:
        progress.note("read from the cache")
        return found
    with claimed(cache.agreement_path(suite, base_id, cand_id, *runs)):
        if (found := cache.lookup_agreement(suite, base_id, cand_id, *runs)) is not None:
            return found
        result = measure_agreement(suite, baseline, candidate, (base_id, cand_id), models, before_store)
        check_threads(candidate, runs[0])
        if before_store is not None:
            before_store()
        cache.store_agreement(suite, result, *runs)
        return result


def measure_agreement(
    suite: OpenSuite,
    baseline: Path,
    candidate: Path,
    ids: tuple[str, str],
    models: LastModel,
    before_store: Callable[[], None] | None = None,
) -> AgreementResult:
    """The candidate's agreement measured now, no comparison read from the cache or written to it (the baseline's
    top-k is: cached); ids: the baseline's and the candidate's identities."""
    reqs = agreement_requests(suite)
    base = baseline_topk_cached(suite, baseline, ids[0], models, reqs, before_store)
    a = suite.suite.agreement
    scorer = _scorer(suite, candidate, models)
    with progress.stage(f"agreement of {candidate.name}", len(reqs)) as st:
        measured = compare(scorer, reqs, base, st)
    check_identity(candidate, ids[1])  # what loaded and was measured is what the identity names
    return AgreementResult(
        **measured,
        baseline_identity=ids[0],
        candidate_identity=ids[1],
        top_k=a.top_k,
        per_task=a.per_task,
        tasks=suite.agreement_tasks,
    )


class StagedAgreement:
    """A candidate's agreement in stages, for a sequential gate (quantize/gates/sequential.py): `look(k)` is the
    agreement on the first n = ⌈t_k · per_task⌉ agreement items of each task (t_k = looks[k]; manifest order, a
    seeded shuffle), scoring only the items no earlier look scored, in one scorer call per look (so the looks fix
    the batches). Never read from or written to the cache: the agreement a gate decides on depends on its schedule
    alone, not on what `quantize agree` left behind. `calls`: the items each look scored."""

    def __init__(
        self,
        suite: OpenSuite,
        baseline: Path,
        candidate: Path,
        ids: tuple[str, str],
        models: LastModel,
        looks: list[float],
    ) -> None:
        """ids: the baseline's and the candidate's checkpoint identities."""
        self.suite, self.candidate, self.models, self.looks = suite, candidate, models, looks
        self.base_id, self.cand_id = ids
        self.reqs = agreement_requests(suite)
        self.base = baseline_topk_cached(suite, baseline, self.base_id, models, self.reqs)
        self.by_task: dict[str, list[Request]] = {}
        for r in self.reqs:
            self.by_task.setdefault(r.task, []).append(r)
        self.rows: dict[str, tuple[Request, Any, Any, Any]] = {}
        self.scorer: Scorer | VLLMScorer | LlamaCppScorer | None = None  # the candidate's, loaded at the first look
        self.calls: list[int] = []
        self.seconds = 0.0  # spent scoring the candidate's agreement items (its load included)

    def look(self, k: int) -> AgreementResult:
        """The agreement at look k (0-based)."""
        a = self.suite.suite.agreement
        n = max(1, math.ceil(self.looks[k] * a.per_task - 1e-9))
        wanted = [r for rs in self.by_task.values() for r in rs[:n]]
        new = [r for r in wanted if r.id not in self.rows]
        if new:
            t0 = time.perf_counter()
            self.calls.append(len(new))
            if self.scorer is None:
                self.scorer = _scorer(self.suite, self.candidate, self.models)
            with progress.stage(f"agreement of {self.candidate.name}: {len(new)} new items", len(new)) as st:
                self.rows.update(
                    {row[0].id: row for row in progress.counted(st, item_metrics(self.scorer, new, self.base))}
                )
            check_identity(self.candidate, self.cand_id)  # what loaded and was measured is what the identity names
            self.seconds += time.perf_counter() - t0
        return AgreementResult(
            **summarize([self.rows[r.id] for r in wanted]),
            baseline_identity=self.base_id,
            candidate_identity=self.cand_id,
            top_k=a.top_k,
            per_task=n,
            tasks=self.suite.agreement_tasks,
        )
