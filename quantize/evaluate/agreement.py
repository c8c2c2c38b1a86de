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
baseline (Leviathan et al. 2023). Prompts are tokenized as lm-eval's HF backend does (context and
continuation encoded whole, then split; rolling documents prefixed with the BOS/EOS token).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantize.evaluate.suite import Agreement
from quantize.gates.stats import clustered_se
from quantize.golden.manifest import GoldenSet, read_items


@dataclass
class Request:
    id: str
    task: str
    cluster: str
    context: str | None  # None: a rolling document, every token scored
    continuation: str


def requests(golden: GoldenSet, tasks: list[str], per_task: int) -> list[Request]:
    """The first `per_task` items of each task (manifest order is already a seeded shuffle)."""
    out = []
    for task in tasks:
        for it in read_items(golden, task)[:per_task]:
            if "choices" in it:
                out.append(Request(it["id"], task, it["cluster"], it["question"], " " + it["choices"][it["answer"]]))
            elif "context" in it:
                out.append(Request(it["id"], task, it["cluster"], it["context"], it["target"]))
            else:
                out.append(Request(it["id"], task, it["cluster"], None, it["text"]))
    return out


def encode(tok: Any, req: Request) -> tuple[list[int], int]:
    """Token ids and the index of the first scored token (lm-eval's _encode_pair / rolling prefix)."""
    if req.context is None:
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        return [prefix] + tok.encode(req.continuation, add_special_tokens=False), 1
    context, continuation = req.context, req.continuation
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False)
    n_ctx = len(tok.encode(context, add_special_tokens=False))
    return whole, n_ctx


def _log_probs(model: Any, tok: Any, reqs: list[Request], batch_size: int, max_length: int):
    """Yield (request, logp) with logp (P, V) float32: log-softmax at each scored position."""
    import torch

    enc = [encode(tok, r) for r in reqs]
    order = sorted(range(len(reqs)), key=lambda i: -len(enc[i][0]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        seqs = [enc[i][0][-max_length:] for i in idx]
        starts = [max(1, enc[i][1] - (len(enc[i][0]) - len(seqs[j]))) for j, i in enumerate(idx)]
        T = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), T), dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, : len(s)] = torch.tensor(s)
            mask[j, : len(s)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits  # (B, T, V)
        for j, i in enumerate(idx):
            # the token at position t is predicted by the logits at t − 1
            rows = logits[j, starts[j] - 1: len(seqs[j]) - 1].float()  # (P, V)
            yield reqs[i], torch.log_softmax(rows, dim=-1)


def baseline_topk(model: Any, tok: Any, reqs: list[Request], k: int, batch_size: int, max_length: int) -> dict[str, Any]:
    import numpy as np
    import torch

    ids, clusters, counts, top_idx, top_lp = [], [], [], [], []
    for req, lp in _log_probs(model, tok, reqs, batch_size, max_length):
        v, i = torch.topk(lp, k, dim=-1)  # (P, k)
        ids.append(req.id)
        clusters.append(req.cluster)
        counts.append(lp.shape[0])
        top_idx.append(i.to(torch.int32).numpy())
        top_lp.append(v.numpy().astype(np.float32))
    return {"ids": ids, "clusters": clusters, "counts": np.asarray(counts), "k": k,
            "top_idx": np.concatenate(top_idx), "top_logp": np.concatenate(top_lp)}


def compare(model: Any, tok: Any, reqs: list[Request], base: dict[str, Any], batch_size: int, max_length: int
            ) -> dict[str, Any]:
    """Per-position KL lower bound, top-1 agreement and Σ min(p, q) against the stored baseline."""
    import numpy as np
    import torch

    offsets = dict(zip(base["ids"], np.cumsum(np.concatenate([[0], base["counts"][:-1]]))))
    counts = dict(zip(base["ids"], base["counts"]))
    kl, top1, smin, clusters, items = [], [], [], [], []
    for req, lq in _log_probs(model, tok, reqs, batch_size, max_length):
        o, n = int(offsets[req.id]), int(counts[req.id])
        if lq.shape[0] != n:
            raise ValueError(f"item {req.id}: {lq.shape[0]} scored positions, the baseline stored {n}; "
                             "the tokenizers differ, so agreement cannot be computed")
        bi = torch.from_numpy(base["top_idx"][o:o + n].astype(np.int64))  # (P, k)
        lp = torch.from_numpy(base["top_logp"][o:o + n])  # (P, k)
        p = lp.exp()
        r = (1 - p.sum(-1)).clamp_min(0)  # (P,)
        lq_k = lq.gather(-1, bi)  # (P, k)
        q_k = lq_k.exp()
        q_rest = (1 - q_k.sum(-1)).clamp_min(1e-12)
        kl_pos = (p * (lp - lq_k)).sum(-1) + torch.where(r > 0, r * (r.clamp_min(1e-12).log() - q_rest.log()), torch.zeros_like(r))
        kl.extend(kl_pos.clamp_min(0).tolist())
        top1.extend((lq.argmax(-1) == bi[:, 0]).float().tolist())
        smin.extend((torch.minimum(p, q_k).sum(-1) + torch.minimum(r, q_rest)).tolist())
        clusters.extend([req.cluster] * n)
        items.append(req.id)
    n = len(kl)
    mean_kl = sum(kl) / n
    return {
        "positions": n,
        "items": len(items),
        "clusters": len(set(clusters)),
        "kl_mean": mean_kl,
        "kl_se": clustered_se(kl, clusters),
        "kl_p99": float(np.quantile(kl, 0.99)),
        "top1": sum(top1) / n,
        "top1_se": clustered_se(top1, clusters),
        "sum_min": sum(smin) / n,
        "sum_min_se": clustered_se(smin, clusters),
        "note": "KL over the baseline's top-k plus one tail bucket: a lower bound of the full KL; "
                "Σ min(p, q) likewise an upper bound (the acceptance rate as a draft for the baseline)",
    }


def save_baseline(path: Path, base: dict[str, Any]) -> None:
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, ids=np.asarray(base["ids"]), clusters=np.asarray(base["clusters"]), counts=base["counts"],
                        k=np.asarray(base["k"]), top_idx=base["top_idx"], top_logp=base["top_logp"])
    tmp.replace(path)


def load_baseline(path: Path) -> dict[str, Any]:
    import numpy as np

    z = np.load(path)
    return {"ids": [str(x) for x in z["ids"]], "clusters": [str(x) for x in z["clusters"]], "counts": z["counts"],
            "k": int(z["k"]), "top_idx": z["top_idx"], "top_logp": z["top_logp"]}


def cache_paths(golden: GoldenSet, settings: Agreement, base_sha: str, cand_sha: str) -> tuple[Path, Path]:
    """Where the baseline's top-k and a candidate's comparison are cached: keyed by both checkpoints,
    the agreement settings and the golden manifest."""
    from quantize.models import cache_dir

    tasks = settings.tasks or golden.tasks
    key = hashlib.sha256(json.dumps([sorted(tasks), settings.per_task, settings.top_k, golden.manifest_sha256]).encode()
                         ).hexdigest()[:16]
    folder = cache_dir() / "agreement"
    return folder / f"base-{base_sha[:16]}-{key}.npz", folder / f"cmp-{base_sha[:16]}-{cand_sha[:16]}-{key}.json"
