"""Our lm-eval model (quantize/evaluate/lm.py) against lm-eval's stock HFLM on a tiny seeded model in float32:
per request the same log-likelihood (|Δ| ≤ 1e-4 nats) and the same is_greedy, document perplexity and greedy
generation alike; each distinct context computed once; an item's numbers bit-identical alone, in a batch of 16
and in another stage; both ways of meeting the model (packed passes and passes of one item) and the rule that
chooses between them, on every family of tests/families.py."""

from __future__ import annotations

from typing import Any

import families
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


@pytest.mark.parametrize("pack", [True, False])
def test_loglikelihood_equals_stock_hflm_per_request(loaded, pack):
    """Multi-token choices sharing a context, contexts ending in spaces, an empty context, truncation at
    max_length: every (log-likelihood, is_greedy) equals HFLM's, packed or one item a pass, and some continuations
    are greedy (so a wrong is_greedy would show)."""
    reqs = items(loaded, 8, greedy=True)
    theirs = stock(loaded, batch_size=4, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    mine = ours(loaded, batch_size=4, max_length=24, pack=pack).loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert sum(g for _, g in mine) >= 4
    assert np.abs(np.array([ll for ll, _ in mine]) - [ll for ll, _ in theirs]).max() <= TOL
    assert len({round(ll, 3) for ll, _ in mine}) > len(reqs) // 2  # distinct answers: a mix-up would show


@pytest.mark.parametrize("pack", [True, False])
def test_each_distinct_context_is_computed_once(loaded, monkeypatch, pack):
    """A multiple-choice item's context runs once (packed: its row in a pass of contexts, several items' contexts
    side by side; else a batch-1 pass); its choices run against those keys and values, the whole input never
    again. HFLM runs context + choice once per multi-token choice."""
    from quantize.compat.lm_eval import encode_request

    lm = ours(loaded, batch_size=16, max_length=64, pack=pack)
    reqs = [r for r in items(loaded, 6, greedy=True) if r.doc_id != 3]
    calls: list[tuple[Any, bool]] = []
    forward = lm.model.forward

    def spy(input_ids=None, past_key_values=None, **kw):
        calls.append((input_ids.clone(), past_key_values is not None))
        return forward(input_ids=input_ids, past_key_values=past_key_values, **kw)

    monkeypatch.setattr(lm.model, "forward", spy)
    lm.loglikelihood(reqs, disable_tqdm=True)
    # P: the context's tokens but its last (module docstring of quantize/evaluate/lm.py)
    contexts = {tuple(encode_request(lm.hf, *r.args)[0][:-1]) for r in reqs}
    context_rows = [tuple(row.tolist()) for ids, cached in calls if not cached for row in ids]
    choice_rows = [row for ids, cached in calls if cached for row in ids]
    assert len(context_rows) == len(contexts) == 5  # one row per distinct context, over every pass
    for c in contexts:  # each context is the start of exactly one row (the rest, if any, padding)
        assert sum(r[: len(c)] == c for r in context_rows) == 1
    assert len(choice_rows) == 25  # five continuations per item
    width = max(len(lm.tok_encode(r.args[1])) for r in reqs) + 1
    assert all(len(r) <= width + 3 for r in choice_rows)  # the choices' tokens only, never the context again
    if pack:
        assert len(calls) < 2 * len(contexts)  # contexts of several items share a pass, their choices too
    else:
        assert all(len(ids) == 1 for ids, cached in calls if not cached)  # a context a pass
        assert all(len(ids) == 5 for ids, cached in calls if cached)  # an item's choices a pass


def test_items_share_passes_of_shapes_of_their_own(loaded, monkeypatch):
    """Packed, one-continuation items of other documents share a pass (the speed); every pass has the shape its
    rows determine alone (width: a row's length rounded up to QUANTUM; at most batch_size rows), so a row's
    numbers never depend on its neighbours'. Not packed, each is a pass of its own, unpadded."""
    from quantize.evaluate.lm import QUANTUM

    one = [r for r in items(loaded, 24, seed=3) if r.idx == 0 and r.doc_id != 3]
    for pack in (True, False):
        lm = ours(loaded, batch_size=16, max_length=64, pack=pack)
        passes: list[Any] = []
        forward = lm.model.forward

        def spy(input_ids=None, forward=forward, passes=passes, **kw):
            passes.append(input_ids.clone())
            return forward(input_ids=input_ids, **kw)

        monkeypatch.setattr(lm.model, "forward", spy)
        lm.loglikelihood(one, disable_tqdm=True)
        monkeypatch.undo()
        assert sum(p.shape[0] for p in passes) == len(one)  # one row per item, no filler
        if not pack:
            assert len(passes) == len(one) and all((p != lm.pad).all() for p in passes)
            continue
        assert len(passes) < len(one) // 2  # batched across items
        for p in passes:
            assert p.shape[0] <= 16 and p.shape[1] % QUANTUM == 0
            lengths = [int((r != lm.pad).nonzero().max()) + 1 for r in p]
            assert all(p.shape[1] - QUANTUM < n <= p.shape[1] for n in lengths)  # each row's own width


@pytest.mark.parametrize("pack", [True, False])
def test_an_item_has_the_same_bits_alone_in_a_batch_and_in_another_stage(loaded, pack):
    """Batch independence, bit for bit: one item scored alone, among 15 other items (batch 16), and in a later
    stage with other neighbours at another batch size."""
    mc = items(loaded, 20, seed=1)
    item = [r for r in mc if r.doc_id == 7]
    alone = ours(loaded, batch_size=16, max_length=24, pack=pack).loglikelihood(item, disable_tqdm=True)
    batch = [r for r in mc if r.doc_id < 16]
    in_batch = ours(loaded, batch_size=16, max_length=24, pack=pack).loglikelihood(batch, disable_tqdm=True)
    stage = [r for r in mc if r.doc_id >= 16] + item
    later = ours(loaded, batch_size=8, max_length=24, pack=pack).loglikelihood(stage, disable_tqdm=True)
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


def test_a_generation_records_the_log_likelihood_of_the_tokens_it_generated(loaded):
    """Each generated item's `generated_ll` (engine.ScoredTokens) is Σ log p of the tokens it generated, as a plain
    forward pass over the prompt and those tokens gives them, and its text is still stock HFLM's; a model with a
    NaN weight records NaN (a gate's regression), where before nothing was recorded and its empty answers read as
    a finite model's wrong ones."""
    import copy

    import torch
    from lm_eval.api.instance import Instance

    model, tok = loaded
    rng = np.random.default_rng(5)
    kwargs = [{"max_gen_toks": 5}, {"until": ["."], "max_gen_toks": 3}]
    gens = [
        Instance("generate_until", {}, (words(tok, rng, n), kw), 0, metadata=("t", d, 1))
        for d, (n, kw) in enumerate(zip((4, 20), kwargs, strict=True))
    ]
    lm = ours(loaded, max_length=32)
    assert lm.generate_until(gens, disable_tqdm=True) == stock(loaded, max_length=32).generate_until(gens)
    got = lm.scored.take()
    for d, kw in enumerate(kwargs):
        (prompt,) = lm.hf.tok_batch_encode([gens[d].args[0]], left_truncate_len=32 - kw["max_gen_toks"])[0]
        with torch.no_grad():
            seq = model.generate(prompt[None], max_new_tokens=kw["max_gen_toks"], do_sample=False)[0]
            lp = torch.log_softmax(model(seq[None]).logits[0].float(), dim=-1)
        n = len(prompt)
        want = float(sum(lp[i - 1, seq[i]] for i in range(n, len(seq))))
        assert got[("t", d)].generated_ll == pytest.approx(want, abs=TOL) and want < 0
    broken = copy.deepcopy(model)  # one NaN in a late MLP weight: every logit after it is NaN
    next(w for name, w in broken.named_parameters() if name.endswith("layers.1.mlp.down_proj.weight")).data[0, 0] = (
        float("nan")
    )
    lm = ours((broken, tok), max_length=32)
    lm.generate_until(gens, disable_tqdm=True)
    assert all(np.isnan(r.generated_ll) for r in lm.scored.take().values())


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


def test_every_item_gets_the_bits_it_gets_alone(loaded):
    """Packed, on the whole mix (multiple choice, greedy continuations, an empty context, truncation at
    max_length, rolling documents of several windows): scored together, every item gets exactly the floats it gets
    in a call of its own (its passes then hold its rows only, where they held other items' too)."""
    from lm_eval.api.instance import Instance

    reqs = items(loaded, 12, seed=4, greedy=True)
    docs = [Instance("loglikelihood_rolling", {}, (" ".join(r.args[0] for r in reqs[i::7]),), 0) for i in range(3)]
    lm = ours(loaded, batch_size=16, max_length=24)
    assert lm.pack  # the default model is packed on the CPU
    together = lm.loglikelihood(reqs, disable_tqdm=True)
    alone = [a for d in range(12) for a in lm.loglikelihood([r for r in reqs if r.doc_id == d], disable_tqdm=True)]
    assert alone == [a for d in range(12) for r, a in zip(reqs, together, strict=True) if r.doc_id == d]
    assert lm.loglikelihood_rolling(docs, disable_tqdm=True) == [
        lm.loglikelihood_rolling([d], disable_tqdm=True)[0] for d in docs
    ]


# model_type -> packed on the CPU: dense full attention packs; a sliding window or routed experts does not
PACKED = {
    "llama": True,
    "qwen2": True,
    "qwen3": True,
    "mistral": True,  # sliding_window None (tests/families.py)
    "phi3": True,
    "gemma2": False,
    "gemma3_text": False,
    "qwen3_moe": False,
    "mixtral": False,
    "olmoe": False,
    "deepseek_v3": False,
    "gpt_oss": False,
    "llama4_text": False,
    "ernie4_5_moe": False,
    "glm4_moe": False,
    "minimax_m2": False,
}


def test_the_rule_reads_attention_experts_and_device():
    """`packs`: every family of tests/families.py as PACKED says, no hybrid family (linear attention, Mamba,
    short convolutions beside attention); a Mistral with its sliding window, a Qwen2 that uses its window, an
    accelerator, and a config whose layer types the cost model does not know are not."""
    import families

    from quantize.evaluate.lm import packs

    assert set(PACKED) | set(families.HYBRID) == set(families.FAMILIES)
    for family, want in PACKED.items():
        assert packs(families.config(family), "cpu") is want, family
    for family in families.HYBRID:
        assert packs(families.config(family), "cpu") is False, family
    assert not packs(families.config("mistral", sliding_window=4096), "cpu")
    assert packs(families.config("qwen2", sliding_window=16), "cpu")  # use_sliding_window is off by default
    assert not packs(families.config("qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=0), "cpu")
    assert not packs(families.config("llama"), "cuda") and not packs(families.config("llama"), "meta")
    odd = families.config("llama")
    odd.layer_types = ["linear_attention"] * odd.num_hidden_layers
    assert not packs(odd, "cpu")


# DeepSeek-V3 (19 s) in `make test-slow`: qwen3_moe, mixtral and olmoe keep the routed experts in the default run.
# The hybrid families (tests/families.py HYBRID: linear attention, Mamba2, short convolutions, sparse attention,
# per-layer head sizes, chunked attention) are never packed, and share no context where a layer keeps a state
# (lm.shares_contexts: before, transformers' cache copy failed on them, or Falcon-H1 scored 0.02 nats off).
# SLOW_FAMILIES (20-120 s each beside other work) run in `make test-slow`.
HYBRIDS = sorted(set(families.HYBRID) - set(PACKED))
SLOW_FAMILIES = {"deepseek_v3", "deepseek_v32", "falcon_h1", "granitemoehybrid", "ernie4_5_moe", "gemma4_text"}


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f for f in sorted(PACKED) + HYBRIDS]
)
def test_every_family_equals_stock_hflm_and_is_batch_independent(tmp_path, family):
    """Every family of tests/families.py, with the scorer's own choice of passes: per request HFLM's numbers, and
    each item's floats the same alone as among the others. Sliding windows (Gemma 2 and 3; gpt-oss also has
    attention sinks) and routed experts (an expert's matmul sees whichever tokens are routed to it) are where
    packed passes go wrong: packed, Gemma 2 and 3, gpt-oss, OLMoE and Qwen3-MoE fail here (Mixtral, DeepSeek-V3
    and Llama 4 happened not to, at these shapes); the dense full-attention families are packed."""
    import families

    from quantize.checkpoint.loader import LastModel

    model = LastModel().get(families.build(family, tmp_path / family), dtype="float32", on="cpu")
    reqs = items(model, 8, greedy=True)
    theirs = stock(model, batch_size=4, max_length=24).loglikelihood(reqs, disable_tqdm=True)
    lm = ours(model, batch_size=16, max_length=24)
    assert lm.pack is PACKED.get(family, False)
    mine = lm.loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert np.abs(np.array([ll for ll, _ in mine]) - [ll for ll, _ in theirs]).max() <= TOL
    for d in (0, 5):
        item = [r for r in reqs if r.doc_id == d]
        assert lm.loglikelihood(item, disable_tqdm=True) == [
            a for r, a in zip(reqs, mine, strict=True) if r.doc_id == d
        ]


# compressed-tensors preset -> packed: weights alone rounded pack; rounded activations (FP8 dynamic and static, FP8
# block, W8A8, W4AFP8, NVFP4, MXFP4) take one-item passes, their rounding turning a row's width into other numbers
ROUNDS = {
    "W4A16": False,
    "W8A16": False,
    "NVFP4A16": False,
    "MXFP4A16": False,
    "FP8_DYNAMIC": True,
    "FP8": True,
    "FP8_BLOCK": True,
    "W8A8": True,
    "W4AFP8": True,
    "NVFP4": True,
    "MXFP4": True,
}


@pytest.mark.parametrize("form", ["dict", "object"])
def test_the_rule_reads_the_quantization_config(form):
    """`packs` on a dense Llama: weight-only compressed-tensors schemes (and GPTQ, AWQ) pack; a scheme that rounds
    input activations, any scheme with a kv_cache_scheme, and a quantization method the rule cannot read do not;
    config.json's dict and the object transformers holds on a loaded model alike."""
    import families
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, preset_name_to_scheme
    from transformers import CompressedTensorsConfig

    from quantize.evaluate.lm import packs

    def with_qc(scheme: str | None, kv: bool = False, **other):
        cfg = families.config("llama")
        fields: dict[str, Any] = {
            "config_groups": {"group_0": preset_name_to_scheme(scheme, ["Linear"])} if scheme else {}
        }
        if kv:
            fields["kv_cache_scheme"] = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False)
        qc = other or QuantizationConfig(**fields).model_dump()
        cfg.quantization_config = CompressedTensorsConfig(**qc) if form == "object" and not other else qc
        return cfg

    for scheme, rounds in ROUNDS.items():
        assert packs(with_qc(scheme), "cpu") is not rounds, scheme
        assert not packs(with_qc(scheme, kv=True), "cpu"), scheme
    assert not packs(with_qc(None, kv=True), "cpu")  # a quantized KV cache alone
    assert packs(with_qc(None), "cpu")  # compressed-tensors without groups: nothing rounded
    assert packs(with_qc(None, quant_method="gptq", bits=4), "cpu")
    assert packs(with_qc(None, quant_method="awq", bits=4), "cpu")
    assert not packs(with_qc(None, quant_method="bitsandbytes", load_in_8bit=True), "cpu")  # unread: not packed
    assert not packs(with_qc("W4A16", kv=True), "cuda")  # the device rule still holds


def rounding(tmp_path, tiny_model, capsys, scheme: str, method: str = "rtn"):
    """The tiny model converted to `scheme` by `quantize run` (calibrated on the tests' small set), loaded in
    float32 on the CPU."""
    from convert.test_engine import CAL, run_ok, write_recipe

    from quantize.checkpoint.loader import LastModel

    cal = CAL if scheme in ("NVFP4", "W8A8") else None
    run_ok(write_recipe(tmp_path, tiny_model, "q", method=method, scheme=scheme, calibration=cal), capsys)
    return LastModel().get(tmp_path / "out" / "q", dtype="float32", on="cpu")


@pytest.mark.parametrize(("scheme", "method"), [("FP8_DYNAMIC", "fp8"), ("NVFP4", "rtn")])
def test_an_activation_quantized_checkpoint_is_scored_one_request_a_pass(
    tmp_path, tiny_model, capsys, monkeypatch, scheme, method
):
    """The tiny model converted to FP8 dynamic (config.json's quantization_config rounds every linear's input per
    token) and to NVFP4 (loaded dequantized: the config loses its quantization_config, the modules keep their
    scheme): the scorer chooses by itself to share neither passes nor contexts, every request a whole row in a
    pass of its own, unpadded, and per request it gets what HFLM gets at batch size 1."""
    from quantize.checkpoint import qdq

    model = rounding(tmp_path, tiny_model, capsys, scheme, method)
    assert (scheme == "NVFP4") is not hasattr(model[0].config, "quantization_config")  # the two ways the rule reads
    reqs = items(model, 8, greedy=True)
    lm = ours(model, batch_size=16, max_length=24)
    assert lm.pack is False and lm.share is False
    passes: list[Any] = []
    forward = lm.model.forward

    def spy(input_ids=None, past_key_values=None, **kw):
        passes.append((input_ids.clone(), past_key_values is not None))
        return forward(input_ids=input_ids, past_key_values=past_key_values, **kw)

    with qdq.installed():  # as the scorer runs a quantized checkpoint (quantize/evaluate/score.run_lm_eval)
        theirs = stock(model, batch_size=1, max_length=24).loglikelihood(reqs, disable_tqdm=True)
        monkeypatch.setattr(lm.model, "forward", spy)
        mine = lm.loglikelihood(reqs, disable_tqdm=True)
    assert len(passes) == len({r.args for r in reqs}) and not any(cached for _, cached in passes)
    assert all(len(ids) == 1 and ids[0, -1] != lm.pad for ids, _ in passes)  # one row a pass, unpadded
    assert [g for _, g in mine] == [g for _, g in theirs] and sum(g for _, g in mine) >= 4
    assert np.abs(np.array([ll for ll, _ in mine]) - [ll for ll, _ in theirs]).max() <= TOL


def test_int8_activations_turn_a_rows_padding_into_other_numbers(tmp_path, tiny_model, capsys):
    """SmoothQuant W8A8 (int8 activations per token): packed passes (each row padded to a multiple of QUANTUM, a
    context's keys and values computed apart from its choices) move some request off HFLM's numbers at batch size 1
    (whole rows, unpadded), so the check has teeth (by how much is the CPU's: past 1e-4 nats on the 2-core AMD
    EPYC, 1.9e-6 on an Intel Xeon); the scorer's own choice, each request a whole row alone, stays within 1e-4 of
    them with the same is_greedy on every request."""
    from quantize.checkpoint import qdq

    model = rounding(tmp_path, tiny_model, capsys, "W8A8", "smoothquant")
    reqs = items(model, 16, seed=5, greedy=True)
    with qdq.installed():
        theirs = stock(model, batch_size=1, max_length=24).loglikelihood(reqs, disable_tqdm=True)
        lm = ours(model, batch_size=16, max_length=24)
        mine = lm.loglikelihood(reqs, disable_tqdm=True)
        packed = ours(model, batch_size=16, max_length=24, pack=True).loglikelihood(reqs, disable_tqdm=True)
    ref = np.array([ll for ll, _ in theirs])
    assert not lm.pack and np.abs(np.array([ll for ll, _ in packed]) - ref).max() > 0
    assert [g for _, g in mine] == [g for _, g in theirs]
    assert np.abs(np.array([ll for ll, _ in mine]) - ref).max() <= TOL
