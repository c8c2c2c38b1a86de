"""Our lm-eval model (quantize/evaluate/lm.py) against lm-eval's stock HFLM on a tiny seeded model in float32:
per request the same log-likelihood (|Δ| ≤ 1e-4 nats) and the same is_greedy, document perplexity and greedy
generation alike; each distinct context computed once; an item's numbers bit-identical alone, in a batch of 16
and in another stage."""

from __future__ import annotations

import numpy as np
import pytest

TOL = 1e-4  # nats per request (issue 45)


@pytest.fixture(scope="module")
def loaded(tiny_model):
    from quantize.checkpoint.loader import LastModel

    return LastModel().get(tiny_model, dtype="float32", on="cpu")


def stock(loaded, **kw):
    from lm_eval.models.huggingface import HFLM

    model, tok = loaded
    return HFLM(pretrained=model, tokenizer=tok, **kw)


def ours(loaded, **kw):
    from quantize.evaluate.lm import PrefixLM

    model, tok = loaded
    return PrefixLM(pretrained=model, tokenizer=tok, **kw)


def words(tok, rng, n: int) -> str:
    vocab = sorted(tok.get_vocab(), key=tok.get_vocab().get)[2:300]
    return " ".join(rng.choice(vocab, n))


def items(loaded, n: int, seed: int = 0, greedy: bool = False) -> list:
    """`n` multiple-choice items (4 choices of 1-4 words; some contexts end in a space, one is empty, some are
    longer than max_length 24); `greedy`: per item a fifth continuation, the model's own greedy one."""
    from lm_eval.api.instance import Instance

    _, tok = loaded
    rng = np.random.default_rng(seed)
    out, hf = [], stock(loaded, batch_size=1, max_length=24)
    for d in range(n):
        ctx = "" if d == 3 else words(tok, rng, int(rng.integers(2, 30))) + (" " if d % 4 == 0 else "")
        conts = [" " + words(tok, rng, int(rng.integers(1, 5))) for _ in range(4)]
        if ctx and greedy:
            gen = Instance("generate_until", {}, (ctx, {"until": ["\n"], "max_gen_toks": 2}), 0)
            conts.append(" " + hf.generate_until([gen], disable_tqdm=True)[0].strip())
        out += [Instance("loglikelihood", {}, (ctx, c), i, metadata=("t", d, 1)) for i, c in enumerate(conts)]
    return out


def test_loglikelihood_equals_stock_hflm_per_request(loaded):
    """Multi-token choices sharing a context, contexts ending in spaces, an empty context, truncation at
    max_length: every (log-likelihood, is_greedy) equals HFLM's, and some continuations are greedy (so a wrong
    is_greedy would show)."""
    reqs = items(loaded, 8, greedy=True)
    theirs = stock(loaded, batch_size=4, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    mine = ours(loaded, batch_size=4, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert sum(g for _, g in mine) >= 4
    assert np.abs(np.array([ll for ll, _ in mine]) - [ll for ll, _ in theirs]).max() <= TOL
    assert len({round(ll, 3) for ll, _ in mine}) > len(reqs) // 2  # distinct answers: a mix-up would show


def test_each_distinct_context_is_computed_once(loaded, monkeypatch):
    """A multiple-choice item's context runs once (batch 1); its choices run as one batch against its cache, the
    whole input never again. HFLM runs context + choice once per multi-token choice."""
    lm = ours(loaded, batch_size=16, max_length=64)
    reqs = [r for r in items(loaded, 6, greedy=True) if r.doc_id != 3]
    calls: list[tuple[int, int, bool]] = []
    forward = lm.model.forward

    def spy(input_ids=None, past_key_values=None, **kw):
        calls.append((input_ids.shape[0], input_ids.shape[1], past_key_values is not None))
        return forward(input_ids=input_ids, past_key_values=past_key_values, **kw)

    monkeypatch.setattr(lm.model, "forward", spy)
    lm.loglikelihood(reqs, disable_tqdm=True)
    contexts = {r.args[0] for r in reqs}
    prefixes = [c for c in calls if c[0] == 1 and not c[2]]
    choices = [c for c in calls if c[2]]
    assert len(prefixes) == len(contexts) == 5 and len(choices) == 5  # one context pass, one choice batch each
    assert all(b == 5 for b, _, _ in choices)  # the item's five continuations in one batch
    width = max(len(lm.tok_encode(r.args[1])) for r in reqs) + 1
    assert all(t <= width for _, t, _ in choices)  # the choices' tokens only, never the context again


def test_an_item_has_the_same_bits_alone_in_a_batch_and_in_another_stage(loaded):
    """Batch independence, bit for bit: one item scored alone, among 15 other items (batch 16), and in a later
    stage with other neighbours at another batch size."""
    mc = items(loaded, 20, seed=1)
    item = [r for r in mc if r.doc_id == 7]
    alone = ours(loaded, batch_size=16, max_length=24).loglikelihood(item, disable_tqdm=True)
    batch = [r for r in mc if r.doc_id < 16]
    in_batch = ours(loaded, batch_size=16, max_length=24).loglikelihood(batch, disable_tqdm=True)
    stage = [r for r in mc if r.doc_id >= 16] + item
    later = ours(loaded, batch_size=8, max_length=24).loglikelihood(stage, disable_tqdm=True)
    got_batch = [a for r, a in zip(batch, in_batch, strict=True) if r.doc_id == 7]
    got_later = [a for r, a in zip(stage, later, strict=True) if r.doc_id == 7]
    assert alone == got_batch == got_later  # exact equality of the floats, not approx
    assert len({ll for ll, _ in in_batch}) > len(batch) // 2  # the neighbours are other items, not copies


def test_two_items_with_one_context_are_scored_as_their_own_groups(loaded):
    """Two items (documents) whose contexts are the same text: each item's numbers are the ones it gets alone."""
    from lm_eval.api.instance import Instance

    def item(doc: int, conts: list[str]) -> list:
        ctx = "one two three"
        return [Instance("loglikelihood", {}, (ctx, c), i, metadata=("t", doc, 1)) for i, c in enumerate(conts)]

    a, b = item(0, [" a", " b c"]), item(1, [" d e f", " g"])
    lm = ours(loaded, batch_size=16)
    both = lm.loglikelihood(a + b, disable_tqdm=True)
    assert both == lm.loglikelihood(a, disable_tqdm=True) + lm.loglikelihood(b, disable_tqdm=True)


def test_document_perplexity_and_generation_equal_stock_hflm(loaded):
    """Rolling windows (a document longer than max_length) and greedy generation with stop sequences: HFLM's
    numbers and strings."""
    from lm_eval.api.instance import Instance

    _, tok = loaded
    rng = np.random.default_rng(2)
    docs = [Instance("loglikelihood_rolling", {}, (words(tok, rng, n),), i) for i, n in enumerate((1, 5, 30, 90))]
    theirs = stock(loaded, batch_size=4, max_length=32).loglikelihood_rolling(docs, disable_tqdm=True)
    mine = ours(loaded, batch_size=4, max_length=32).loglikelihood_rolling(docs, disable_tqdm=True)
    assert np.abs(np.array(mine) - theirs).max() <= TOL and len(set(mine)) == len(docs)
    kwargs = [{"until": ["\n"], "max_gen_toks": 6}, {"until": ["."], "max_gen_toks": 3}, {"max_gen_toks": 4}]
    prompts = [words(tok, rng, n) for n in (3, 12, 40)]
    gens = [Instance("generate_until", {}, (p, kw), 0) for p, kw in zip(prompts, kwargs, strict=True)]
    theirs_g = stock(loaded, batch_size=4, max_length=32).generate_until(gens, disable_tqdm=True)
    assert ours(loaded, batch_size=4, max_length=32).generate_until(gens, disable_tqdm=True) == theirs_g
    assert all(theirs_g)


def test_it_is_lm_evals_registered_model():
    """lm-eval finds it by name through its public registry (`--model quantize-kv`)."""
    from lm_eval.api.model import LM
    from lm_eval.api.registry import get_model

    from quantize.evaluate.lm import NAME, PrefixLM

    assert get_model(NAME) is PrefixLM and issubclass(PrefixLM, LM)


def test_a_suite_chooses_the_scorer_and_the_cache_key_says_which(tmp_path, tiny_model):
    """`backend: hf` scores through lm-eval's stock HFLM, the default through ours; their cache keys differ and
    name the scorer (ours with its revision)."""
    from lm_eval.models.huggingface import HFLM

    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate import cache
    from quantize.evaluate.lm import PrefixLM
    from quantize.evaluate.score import lm_eval_model
    from quantize.evaluate.suite import Backend, Suite

    from conftest import small_golden, suite_file

    assert Suite(golden="g").backend is Backend.quantize
    models = LastModel()
    assert type(lm_eval_model(Suite(golden="g"), tiny_model, "cpu", models)["model"]) is PrefixLM
    assert type(lm_eval_model(Suite(golden="g", backend="hf"), tiny_model, "cpu", models)["model"]) is HFLM
    from quantize.evaluate.suite import open_suite

    golden = small_golden(tmp_path)
    ours_s = open_suite(suite_file(tmp_path / "a.yaml", golden))
    hf_s = open_suite(suite_file(tmp_path / "b.yaml", golden, extra="backend: hf\n"))
    assert cache.scorer_id(ours_s) == f"quantize-{cache.SCORER_REVISION}" and cache.scorer_id(hf_s) == "hf"
    run = cache.Runtime("cpu", "float32")
    assert cache.score_key(ours_s, "x" * 64, run) != cache.score_key(hf_s, "x" * 64, run)


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "qwen3_moe"])
def test_other_families_equal_stock_hflm_and_are_batch_independent(tmp_path, family):
    """Sliding windows (Gemma 3; gpt-oss alternates sliding and full layers and has attention sinks) and routed
    experts (Qwen3-MoE, gpt-oss: an expert's matmul sees whichever tokens are routed to it) are where a scorer
    that packs rows differently from HFLM goes wrong: per request HFLM's numbers, and each item's floats the
    same alone as among the others."""
    import families

    from quantize.checkpoint.loader import LastModel

    model = LastModel().get(families.build(family, tmp_path / family), dtype="float32", on="cpu")
    reqs = items(model, 8, greedy=True)
    theirs = stock(model, batch_size=4, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    lm = ours(model, batch_size=16, max_length=24)
    mine = lm.loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert np.abs(np.array([ll for ll, _ in mine]) - [ll for ll, _ in theirs]).max() <= TOL
    for d in (0, 5):
        item = [r for r in reqs if r.doc_id == d]
        assert lm.loglikelihood(item, disable_tqdm=True) == [
            a for r, a in zip(reqs, mine, strict=True) if r.doc_id == d
        ]
