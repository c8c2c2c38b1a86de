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
    from quantize.models import load_model

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
