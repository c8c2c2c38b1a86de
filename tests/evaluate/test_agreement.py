"""The agreement scorer: KL, top-1 and Σ min(p, q) on hand-computed distributions (the tail bucket
included), the bounds they promise, and per-item log-likelihoods equal to lm-eval's own."""

from __future__ import annotations

import math

import pytest
import torch

from quantize.evaluate.agreement import Request, Scorer, position_metrics


def metrics(p: list[float], q: list[float], same_top1: bool) -> tuple[float, float, float]:
    """position_metrics on one position whose baseline top-k probabilities are p; q: the candidate's on those tokens."""
    kl, t1, smin = position_metrics(torch.tensor([p]).log(), torch.tensor([q]).log(), torch.tensor([same_top1]))
    return float(kl[0]), float(t1[0]), float(smin[0])


def test_hand_example_with_a_tail_bucket():
    # p = (0.5, 0.3) + tail 0.2; q = (0.4, 0.5) + tail 0.1
    kl, t1, smin = metrics([0.5, 0.3], [0.4, 0.5], same_top1=False)
    by_hand = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.5) + 0.2 * math.log(0.2 / 0.1)
    assert kl == pytest.approx(by_hand, rel=1e-5) and by_hand == pytest.approx(0.0969, abs=1e-4)
    assert smin == pytest.approx(0.4 + 0.3 + 0.1, rel=1e-6)
    assert t1 == 0.0


def test_the_tail_term_counts():
    """Same top-k mass ratio, different tails: only the r·log(r/q_rest) term tells them apart."""
    kl_a, _, _ = metrics([0.5, 0.3], [0.5, 0.3], True)  # tails 0.2 vs 0.2
    kl_b, _, smin_b = metrics([0.5, 0.3], [0.5, 0.45], True)  # tails 0.2 vs 0.05
    assert kl_a == pytest.approx(0.0, abs=1e-6)
    assert kl_b == pytest.approx(0.3 * math.log(0.3 / 0.45) + 0.2 * math.log(0.2 / 0.05), rel=1e-5)
    assert smin_b == pytest.approx(0.5 + 0.3 + 0.05, rel=1e-6)


def test_identical_distributions():
    kl, t1, smin = metrics([0.7, 0.2], [0.7, 0.2], True)
    assert kl == pytest.approx(0.0, abs=1e-6) and t1 == 1.0 and smin == pytest.approx(1.0, rel=1e-6)


def test_top_k_kl_is_a_lower_bound_and_sum_min_an_upper_bound():
    """Against the full distributions over four tokens (log-sum inequality)."""
    p = [0.5, 0.3, 0.15, 0.05]
    q = [0.4, 0.5, 0.02, 0.08]
    kl_full = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    smin_full = sum(min(a, b) for a, b in zip(p, q, strict=True))
    kl, _, smin = metrics(p[:2], q[:2], False)
    assert kl <= kl_full + 1e-9 and smin >= smin_full - 1e-9
    assert kl < kl_full  # strictly: the two tail tokens move in opposite directions


@pytest.fixture(scope="module")
def scorer(tiny_model):
    from quantize.checkpoint.loader import load_model

    model, tok = load_model(tiny_model, dtype=torch.float32)
    return Scorer(model, tok, batch_size=2, max_length=512)


REQUESTS = [
    Request("a", "t", "c", "The hacker wrote", " a program"),
    Request("b", "t", "c", "A kludge is  ", "ugly but it works"),  # trailing spaces move to the continuation
    Request("c", "t", "c", "Q: what is a bug?\nA:", " an error in a program"),
    Request("d", "t", "c", None, "The program ran and the user was happy. Then it crashed."),
]


def test_log_likelihoods_equal_lm_evals_for_the_same_requests(scorer):
    """Our positions and tokens are lm-eval's: per item, the sum of the gold tokens' log-probabilities
    equals lm-eval's loglikelihood (or loglikelihood_rolling) on the same model."""
    from lm_eval.api.instance import Instance

    ours = {}
    for req, target, logp in scorer.log_probs(REQUESTS):
        ours[req.id] = float(logp.gather(-1, target[:, None]).sum())
    ctx = [r for r in REQUESTS if r.context is not None]
    theirs = scorer.lm.loglikelihood(
        [Instance("loglikelihood", {}, (r.context, r.continuation), i) for i, r in enumerate(ctx)], disable_tqdm=True
    )
    for r, (ll, _) in zip(ctx, theirs, strict=True):
        assert ours[r.id] == pytest.approx(ll, abs=1e-3), r.id
    (rolling,) = scorer.lm.loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (REQUESTS[3].continuation,), 0)], disable_tqdm=True
    )
    assert ours["d"] == pytest.approx(rolling, abs=1e-3)
    assert len(set(ours.values())) == 4  # four different items, four different values


def full_log_probs(scorer, req):
    """The reference: one sequence alone, the head over every position, sliced at the scored ones."""
    ids, start = scorer.encode(req)
    with torch.no_grad():
        logits = scorer.model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits[start - 1 : len(ids) - 1].float(), dim=-1)


class HeadRows:
    """Counts the hidden states each call of a model's head is applied to (a forward hook on its output embeddings,
    registered after any the scorer adds, so it sees what the head computed)."""

    def __init__(self, model) -> None:
        self.calls: list[int] = []
        self.hook = model.get_output_embeddings().register_forward_hook(self)

    def __call__(self, _module, _args, out) -> None:
        self.calls.append(out.shape[:-1].numel())


@pytest.mark.parametrize("head_bytes", [None, 1])  # the default budget; one sequence per forward
def test_log_probs_apply_the_head_at_the_scored_positions_only(scorer, head_bytes, monkeypatch):
    """The head sees the scored positions and nothing else (the full logits were batch × length × vocabulary),
    and each position's log-probabilities are the full computation's, with the same top-k tokens, however the
    batches are cut."""
    if head_bytes is not None:
        monkeypatch.setattr(scorer, "head_bytes", head_bytes)
    counted = HeadRows(scorer.model)
    try:
        got = list(scorer.log_probs(REQUESTS))
    finally:
        counted.hook.remove()
    positions = [lp.shape[0] for _, _, lp in got]
    assert sum(counted.calls) == sum(positions)
    # two requests per forward (batch_size 2) by default; one each when the budget holds less than two
    assert len(counted.calls) == (2 if head_bytes is None else len(REQUESTS))
    assert sorted(r.id for r, _, _ in got) == sorted(r.id for r in REQUESTS)
    for req, _, lp in got:
        ref = full_log_probs(scorer, req)
        assert lp.shape == ref.shape and lp.shape[1] == scorer.model.config.vocab_size
        assert torch.allclose(lp, ref, atol=1e-5), req.id
        assert torch.equal(torch.topk(lp, 5).indices, torch.topk(ref, 5).indices), req.id


def test_top_k_and_agreement_reduce_a_few_positions_at_a_time_to_the_same_numbers(scorer, other_scorer, monkeypatch):
    """topk and at take the log-softmax ROWS positions at a time: the same top-k, log-probabilities and agreement
    as over each item's whole (P, V) at once."""
    from quantize.evaluate import agreement
    from quantize.evaluate.agreement import baseline_topk, compare

    whole = baseline_topk(scorer, REQUESTS, 5)
    whole_cmp = compare(other_scorer, REQUESTS, whole)
    monkeypatch.setattr(agreement, "ROWS", 3)
    assert max(whole.counts) > 3  # more than one chunk for some item
    part = baseline_topk(scorer, REQUESTS, 5)
    assert part.ids == whole.ids and (part.top_idx == whole.top_idx).all()
    assert part.top_logp == pytest.approx(whole.top_logp, abs=1e-6)
    for key, value in compare(other_scorer, REQUESTS, whole).items():
        assert value == pytest.approx(whole_cmp[key], abs=1e-6), key


def test_a_head_outside_the_output_embeddings_is_sliced_and_anything_else_named(scorer, monkeypatch):
    """A model whose logits do not come from its output-embeddings module still gets the scored positions' values
    (from its full logits); one that applies that module twice cannot be read, and says so (exit 3)."""
    from quantize.errors import RuntimeFailure

    want = {r.id: lp for r, _, lp in scorer.log_probs(REQUESTS)}
    monkeypatch.setattr(scorer.model, "get_output_embeddings", lambda: None)
    for r, _, lp in scorer.log_probs(REQUESTS):
        assert torch.allclose(lp, want[r.id], atol=1e-5), r.id
    monkeypatch.undo()
    model = scorer.model
    forward = type(model).forward

    def twice(self, *args, **kwargs):  # the head applied again after the forward's own logits
        out = forward(self, *args, **kwargs)
        self.get_output_embeddings()(torch.zeros(1, 1, self.config.hidden_size))
        return out

    monkeypatch.setattr(type(model), "forward", twice)
    with pytest.raises(RuntimeFailure, match="scored positions"):
        list(scorer.log_probs(REQUESTS))


def test_unknown_candidate_tokens_join_the_tail():
    """vLLM reports only the candidate's own top-k: a baseline top-k token it did not report moves into the tail
    bucket on both sides. By hand for p = (0.5, 0.3) + 0.2, q = (0.4, ?) + ..., with q's second token unknown:
    partition {tok 1}, rest: p (0.5, 0.5), q (0.4, 0.6)."""
    lp, lq = torch.tensor([[0.5, 0.3]]).log(), torch.tensor([[0.4, 0.5]]).log()
    known = torch.tensor([[True, False]])
    kl, _, smin = position_metrics(lp, lq, torch.tensor([True]), known)
    assert float(kl[0]) == pytest.approx(0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6), rel=1e-5)
    assert float(smin[0]) == pytest.approx(0.4 + 0.5, rel=1e-6)
    # coarser partition: never more KL, never less Σ min than with every token known
    kl_all, _, smin_all = position_metrics(lp, lq, torch.tensor([True]), torch.ones_like(known))
    assert float(kl[0]) <= float(kl_all[0]) and float(smin[0]) >= float(smin_all[0])


class FakeVLLM:
    """lm-eval's vLLM model as VLLMScorer uses it, over an HF model: `_model_generate` returns, per request,
    prompt_logprobs as vLLM does (None, then per token its top-k log-probabilities plus the token itself, as
    objects with `.logprob`); tokenization is the HF wrapper's."""

    def __init__(self, scorer: Scorer, k: int) -> None:
        self.hf, self.k = scorer, k
        self.prefix_token_id = scorer.lm.prefix_token_id
        self.tok_encode, self._encode_pair = scorer.lm.tok_encode, scorer.lm._encode_pair
        self.calls = 0

    def _model_generate(self, requests, generate, sampling_params):
        from types import SimpleNamespace

        assert generate and sampling_params == "params"
        self.calls += 1
        out = []
        for ids in requests:
            with torch.no_grad():
                lp = torch.log_softmax(self.hf.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            rows = [None]
            for t in range(1, len(ids)):
                v, i = torch.topk(lp[t - 1], self.k)
                d = {int(a): SimpleNamespace(logprob=float(b)) for a, b in zip(i, v, strict=True)}
                d.setdefault(ids[t], SimpleNamespace(logprob=float(lp[t - 1, ids[t]])))
                rows.append(d)
            out.append(SimpleNamespace(prompt_logprobs=rows))
        return out


@pytest.fixture(scope="module")
def other_scorer(tiny_model):
    """The tiny model with its weights perturbed: a candidate whose distributions differ."""
    from quantize.checkpoint.loader import load_model

    model, tok = load_model(tiny_model, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.std() * torch.randn(p.shape, generator=g))
    return Scorer(model, tok, batch_size=2, max_length=512)


def test_vllm_prompt_logprobs_give_the_hf_baseline_top_k_and_agreement(scorer, other_scorer):
    """One code path for both engines: the baseline's top-k from vLLM-style prompt log-probabilities equals the
    HF scorer's; a candidate that reports every token gives the HF agreement exactly, one that reports only its
    top-k gives a KL no larger, a Σ min no smaller and the same top-1 agreement."""
    from quantize.evaluate.agreement import VLLMScorer, baseline_topk, compare

    k, vocab = 5, scorer.model.config.vocab_size
    base_hf = baseline_topk(scorer, REQUESTS, k)
    base_v = baseline_topk(VLLMScorer(FakeVLLM(scorer, k), k, "params"), REQUESTS, k)

    def by_id(b):  # the HF scorer batches by length, so items come in another order
        return {i: (b.top_idx[b.rows(i)], b.top_logp[b.rows(i)]) for i in b.ids}

    hf_items, v_items = by_id(base_hf), by_id(base_v)
    assert sorted(hf_items) == sorted(v_items) == sorted(r.id for r in REQUESTS)
    for i, (idx, logp) in hf_items.items():
        assert (v_items[i][0] == idx).mean() > 0.99  # ties may order differently
        assert v_items[i][1] == pytest.approx(logp, abs=1e-5)
    hf = compare(other_scorer, REQUESTS, base_hf)
    full = compare(VLLMScorer(FakeVLLM(other_scorer, vocab), vocab, "params"), REQUESTS, base_hf)
    for key in ("kl_mean", "top1", "sum_min"):
        assert full[key] == pytest.approx(hf[key], abs=1e-5), key
    fake = FakeVLLM(other_scorer, 2)
    sparse = compare(VLLMScorer(fake, 2, "params"), REQUESTS, base_hf)
    assert fake.calls == 1  # every request in one engine call
    assert sparse["kl_mean"] <= hf["kl_mean"] + 1e-9 and sparse["sum_min"] >= hf["sum_min"] - 1e-9
    assert sparse["top1"] == pytest.approx(hf["top1"]) and 0 < hf["top1"] < 1 and hf["kl_mean"] > 1e-4
