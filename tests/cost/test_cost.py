"""The token-cost model reproduces every expected value of the seed worksheet, to its printed precision."""

from __future__ import annotations

import json

import pytest

from quantize.cli import main
from quantize.cost import bounds as cost
from quantize.errors import UsageError

KV = cost.KVLayout(layers=80, kv_heads=8, head_dim=128, bytes_per_element=2)
SEED = cost.HARDWARE["seed"]


@pytest.fixture(scope="module")
def worksheet():
    work = cost.Workload(context_tokens=2048, batch=32, alpha=0.8, gamma=4, draft_cost=0.1, plain_step_ms=25.0)
    return cost.token_cost(70e9, cost.FORMAT_BITS, KV, SEED, work).to_data()  # as `quantize cost --json` prints it


def test_kv_bytes(worksheet):
    assert worksheet["kv_bytes_per_sequence"] == 671_088_640


@pytest.mark.parametrize(
    "fmt,gb,b1,b32",
    [("bf16", 140.0, 46.667, 53.825), ("fp8_e4m3", 70.0, 23.333, 30.492), ("int4_g128", 36.3125, 12.104, 19.262)],
)
def test_weight_bytes_and_bounds(worksheet, fmt, gb, b1, b32):
    r = worksheet["formats"][fmt]
    assert r["weight_gb"] == pytest.approx(gb, abs=1e-9)
    assert round(r["batch1_weight_bound_ms"], 3) == b1
    assert round(r["batch_step_bound_ms"], 3) == b32


def test_gib_column(worksheet):
    assert [round(worksheet["formats"][f]["weight_gib"], 2) for f in ("bf16", "fp8_e4m3", "int4_g128")] == [
        130.39,
        65.19,
        33.82,
    ]


def test_verify_ratios(worksheet):
    f = worksheet["formats"]
    assert f["bf16"]["verify_cost_ratio"] == 1.0 and f["fp8_e4m3"]["verify_cost_ratio"] == 1.0
    assert round(f["int4_g128"]["verify_cost_ratio"], 4) == 1.1629


def test_speculation(worksheet):
    s = worksheet["speculation"]
    assert round(s["expected_tokens_per_target_step"], 4) == 3.3616
    assert round(s["speedup_free_verification"], 4) == 2.4011
    assert s["iteration_ms"] == pytest.approx(35.0)
    assert round(s["average_tpot_ms"], 4) == 10.4117
    assert round(worksheet["formats"]["int4_g128"]["speculative_speedup_at_batch"], 4) == 2.1509


def test_labelled_lower_bounds(worksheet):
    assert "lower bounds" in worksheet["scope"] and "not measurements" in worksheet["scope"]


def test_int4_gain_at_batch_32_is_279_not_4(worksheet):
    f = worksheet["formats"]
    assert round(f["bf16"]["batch_step_bound_ms"] / f["int4_g128"]["batch_step_bound_ms"], 2) == 2.79
    # at batch 1 the bound is the weight read alone: the full 16 / 4.15 = 3.86x
    assert f["bf16"]["batch1_weight_bound_ms"] / f["int4_g128"]["batch1_weight_bound_ms"] == pytest.approx(16 / 4.15)


def test_slow_speculation_and_break_even():
    assert round(cost.expected_tokens(0.2, 4), 4) == 1.2496
    assert round(cost.speculative_speedup(0.2, 4, 0.1), 2) == 0.89
    assert round(cost.break_even_alpha(4, 0.1), 3) == 0.287


def test_compute_bound_batches(worksheet):
    assert [worksheet["formats"][f]["verify_compute_bound_batch"] for f in ("bf16", "fp8_e4m3", "int4_g128")] == [
        98,
        49,
        26,
    ]


def test_one_byte_kv():
    m = cost.CostModel(70e9, cost.KVLayout(80, 8, 128, 1), SEED, 2048)
    assert round(1000 * m.step_bound_s(70e9 * 4.15 / 8, 32), 3) == 15.683


def test_exercise_sweeps():
    sw = cost.exercise_sweeps(gamma=4, draft_cost=0.1, alpha=0.8).model_dump()
    by_alpha = {a["alpha"]: a for a in sw["alpha_sweep"]}
    assert round(by_alpha[0.6]["expected_tokens"], 4) == 2.3056 and round(by_alpha[0.6]["speedup"], 2) == 1.65
    assert round(by_alpha[0.3]["speedup"], 4) == round((1 - 0.3**5) / 0.7 / 1.4, 4)
    assert round(by_alpha[0.9]["speedup"], 4) == round((1 - 0.9**5) / 0.1 / 1.4, 4)
    # by hand: γ=5: 3.6893/1.5 = 2.4596; γ=6: 3.95142/1.6 = 2.46964; γ=7: 4.1611/1.7 = 2.4477
    assert sw["best_gamma"] == 6
    assert round(max(g["speedup"] for g in sw["gamma_sweep"]), 4) == 2.4696
    assert round(sw["slow_draft"]["speedup"], 2) == 1.12


@pytest.mark.parametrize(
    "alpha,gamma,c,batch,what",
    [
        (1.0, 4, 0.1, 32, "alpha"),
        (0.8, 0, 0.1, 32, "gamma"),
        (0.8, 4, -0.1, 32, "draft cost"),
        (0.8, 4, 0.1, 0, "batch"),
    ],
)
def test_bad_inputs(alpha, gamma, c, batch, what):
    with pytest.raises(UsageError, match=what):
        cost.token_cost(70e9, cost.FORMAT_BITS, KV, SEED, cost.Workload(2048, batch, alpha, gamma, c, 25.0))


def test_cli_json_defaults_reproduce_seed(capsys):
    assert main(["cost", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_sequence"] == 671_088_640
    assert round(out["formats"]["int4_g128"]["batch_step_bound_ms"], 3) == 19.262


def test_cli_text_labels_every_time_a_lower_bound(capsys):
    assert main(["cost", "--sweep"]) == 0
    text = capsys.readouterr().out
    assert "LOWER BOUNDS" in text and "46.667" in text and "best γ" in text


def test_cli_bad_alpha_exits_2(capsys):
    assert main(["cost", "--alpha", "1.5"]) == 2
    assert "alpha" in capsys.readouterr().err


@pytest.mark.parametrize("gamma,c,verify", [(4, 0.1, 1.0), (2, 0.3, 1.0), (8, 0.05, 1.4)])
def test_break_even_alpha_is_where_the_speedup_is_one(gamma, c, verify):
    a = cost.break_even_alpha(gamma, c, verify)
    assert 0 < a < 1 and cost.speculative_speedup(a, gamma, c, verify) == pytest.approx(1.0, abs=1e-12)


def test_break_even_alpha_at_the_ends_of_its_range():
    assert cost.break_even_alpha(4, 0.0, 1.0) == 0.0  # a free draft breaks even at α = 0
    assert cost.break_even_alpha(2, 2.0, 1.0) > 1 - 1e-9  # E[tokens] <= 3 can never pay for 2 slow draft steps


def test_a_quantized_kv_cache_is_read_from_the_config():
    """llm-compressor writes kv_cache_scheme into quantization_config: an FP8 cache stores 1 byte per element,
    which the decode bounds then use (the worksheet's 1-byte KV); no scheme: 2 bytes."""
    base = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}
    assert cost.kv_layout_from_config(base).bytes_per_element == 2
    fp8 = {**base, "quantization_config": {"kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
    # the same bytes as the uniform layout the CLI's --layers/--kv-heads/--head-dim describe, at one byte
    assert cost.kv_layout_from_config(fp8).bytes_per_sequence(2048) == cost.KVLayout(80, 8, 128, 1).bytes_per_sequence(
        2048
    )
    assert cost.kv_layout_from_config(fp8).bytes_per_element == 1
    assert cost.kv_layout_from_config(fp8, bytes_per_element=2).bytes_per_element == 2  # an explicit figure wins
    bad = {**base, "quantization_config": {"kv_cache_scheme": {"num_bits": "8"}}}
    assert cost.kv_layout_from_config(bad).bytes_per_element == 2


# --- MoE, MLA and sliding-window attention, from config.json -----------------------------------------------------


def _cost_json(capsys, ckpt, *extra: str) -> dict:
    assert main(["cost", "--checkpoint", str(ckpt), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _config(ckpt) -> dict:
    return json.loads((ckpt / "config.json").read_text())


def _attention_gqa(c: dict) -> int:
    """q and o: hidden × heads × head_dim each; k and v: hidden × kv_heads × head_dim each (no biases)."""
    h, d = c["hidden_size"], c["head_dim"]
    return 2 * h * c["num_attention_heads"] * d + 2 * h * c["num_key_value_heads"] * d


def _embeddings(c: dict) -> int:
    """embed_tokens, and lm_head unless tied: vocab × hidden each; plus the final norm (hidden)."""
    return c["vocab_size"] * c["hidden_size"] * (1 if c["tie_word_embeddings"] else 2) + c["hidden_size"]


def _not_looked_up(c: dict, tokens: int) -> int:
    """The bytes (bf16) of embed_tokens a step of `tokens` tokens does not read: beside its own lm_head, a step
    looks up one row a token; tied, the output layer reads it all."""
    v, h = c["vocab_size"], c["hidden_size"]
    return 0 if c["tie_word_embeddings"] else 2 * h * (v - min(tokens, v))


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory):
    from conftest import make_tiny_arch

    root = tmp_path_factory.mktemp("arch")
    return {f: make_tiny_arch(root / f, f) for f in ("qwen3_moe", "deepseek_v3", "gemma3_text")}


def test_qwen3_moe_active_parameters_and_expert_reads(arch_models, capsys):
    """A Qwen3-MoE of 8 experts, top-2, layer 0 dense (mlp_only_layers): by hand from config.json,
    parameters = embeddings + per layer (attention + 2 norms + q/k norms) + the dense MLP (3 × hidden ×
    intermediate) + per MoE layer (router E × hidden + E experts × 3 × hidden × moe_intermediate);
    active = parameters − the routed experts + k/E of them. The old model charged every expert to every token."""
    ckpt = arch_models["qwen3_moe"]
    c = _config(ckpt)
    h, e, k = c["hidden_size"], c["num_local_experts"], c["num_experts_per_tok"]
    moe_layers = [i for i in range(c["num_hidden_layers"]) if i not in c["mlp_only_layers"]]
    assert moe_layers == [1, 2] and (e, k) == (8, 2)
    routed = len(moe_layers) * e * 3 * h * c["moe_intermediate_size"]
    total = (
        _embeddings(c)
        + c["num_hidden_layers"] * (_attention_gqa(c) + 2 * h + 2 * c["head_dim"])
        + len(c["mlp_only_layers"]) * 3 * h * c["intermediate_size"]
        + len(moe_layers) * e * h
        + routed
    )
    out = _cost_json(capsys, ckpt, "--context", "100", "--batch", "4")
    assert out["parameters"] == total
    assert out["active_parameters"] == total - routed + routed * k // e
    # GQA cache: 2 × kv_heads × head_dim values per token and layer, bf16, every layer holds all 100 tokens
    assert out["kv_bytes_per_sequence"] == c["num_hidden_layers"] * 2 * 2 * 16 * 100 * 2
    row = out["formats"]["measured"]
    routed_bytes = 2 * routed  # bf16
    assert row["batch1_weight_read_bytes"] == pytest.approx(
        row["weight_bytes"] - routed_bytes * (1 - k / e) - _not_looked_up(c, 1)
    )
    assert row["batch_weight_read_bytes"] == pytest.approx(
        row["weight_bytes"] - routed_bytes * (1 - k / e) ** 4 - _not_looked_up(c, 4)
    )  # batch 4: an expert escapes each token with probability 1 − k/E
    assert row["batch1_compute_ms"] == pytest.approx(1000 * 2 * out["active_parameters"] / SEED.peak_dense_flops)
    assert [(m["layer"], m["routed_parameters"]) for m in out["moe"]["layers"]] == [(1, routed // 2), (2, routed // 2)]
    assert "uniform routing" in out["moe"]["assumption"]


def test_deepseek_v3_mla_cache_and_shared_experts(arch_models, capsys):
    """DeepSeek-V3 caches one latent per token and layer: kv_lora_rank + qk_rope_head_dim values, shared by all
    heads, not 2 × kv_heads × head_dim. Active parameters keep the shared expert whole and k/E of the routed
    ones (layers from first_k_dense_replace on). Parameters by hand: MLA attention is q_a (hidden × q_lora),
    q_b (q_lora × heads × (nope + rope)), kv_a (hidden × (kv_lora + rope)), kv_b (kv_lora × heads × (nope + v)),
    o (heads × v × hidden), plus the q_a and kv_a norms."""
    ckpt = arch_models["deepseek_v3"]
    c = _config(ckpt)
    h, heads, e, k = c["hidden_size"], c["num_attention_heads"], c["n_routed_experts"], c["num_experts_per_tok"]
    q, kv, rope, nope, v = (
        c[x] for x in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    )
    attention = h * q + q * heads * (nope + rope) + h * (kv + rope) + kv * heads * (nope + v) + heads * v * h + q + kv
    moe_layers = list(range(c["first_k_dense_replace"], c["num_hidden_layers"]))
    routed = len(moe_layers) * e * 3 * h * c["moe_intermediate_size"]
    shared = len(moe_layers) * c["n_shared_experts"] * 3 * h * c["moe_intermediate_size"]
    router = len(moe_layers) * (e * h + e)  # the gate's weight and its e_score_correction_bias
    dense_mlp = c["first_k_dense_replace"] * 3 * h * c["intermediate_size"]
    total = _embeddings(c) + c["num_hidden_layers"] * (attention + 2 * h) + dense_mlp + routed + shared + router
    out = _cost_json(capsys, ckpt, "--context", "100")
    assert out["parameters"] == total
    assert out["active_parameters"] == total - routed + routed * k // e
    assert out["kv_bytes_per_sequence"] == c["num_hidden_layers"] * (kv + rope) * 100 * 2
    gqa = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 100 * 2  # the old, wrong charge
    assert out["kv_bytes_per_sequence"] != gqa
    assert out["kv_layout"]["attention"] == "MLA"


def test_gemma3_sliding_layers_hold_the_window(arch_models, capsys, tmp_path):
    """Gemma 3 with sliding_window 16 every other layer (layer_types: sliding, full, sliding): at 100 tokens of
    context two layers hold 16 tokens and one holds 100; below the window every layer holds the context. An FP8
    KV cache (kv_cache_scheme num_bits 8) halves the bytes. A dense model: active = all parameters."""
    import shutil

    ckpt = arch_models["gemma3_text"]
    c = _config(ckpt)
    assert c["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    per_token = 2 * c["num_key_value_heads"] * c["head_dim"]
    out = _cost_json(capsys, ckpt, "--context", "100")
    assert out["kv_bytes_per_sequence"] == per_token * (16 + 100 + 16) * 2
    assert [layer["tokens_held"] for layer in out["kv_bytes_per_layer"]] == [16, 100, 16]
    assert _cost_json(capsys, ckpt, "--context", "10")["kv_bytes_per_sequence"] == per_token * 3 * 10 * 2
    h = c["hidden_size"]
    total = _embeddings(c) + 3 * (_attention_gqa(c) + 4 * h + 2 * c["head_dim"] + 3 * h * c["intermediate_size"])
    assert out["parameters"] == out["active_parameters"] == total and "moe" not in out
    fp8 = shutil.copytree(ckpt, tmp_path / "fp8kv")
    (fp8 / "config.json").write_text(
        json.dumps({**c, "quantization_config": {"kv_cache_scheme": {"num_bits": 8, "type": "float"}}})
    )
    assert _cost_json(capsys, fp8, "--context", "100")["kv_bytes_per_sequence"] == per_token * (16 + 100 + 16)


def test_dense_llama_is_priced_as_before(tiny_model, capsys):
    """A dense Llama: every weight read at any batch, active = all parameters, KV = 2 × layers × kv_heads ×
    head_dim × context × 2 bytes: the figures of the uniform layout the old model used."""
    from quantize.checkpoint.accounting import bits_report

    out = _cost_json(capsys, tiny_model, "--context", "2048")
    r = bits_report(tiny_model)
    assert out["active_parameters"] == out["parameters"] == r.parameters and "moe" not in out
    assert out["kv_bytes_per_sequence"] == 2 * 2 * 2 * 32 * 2048 * 2
    old = cost.token_cost(
        r.parameters,
        {"measured": 8 * r.total_bytes / r.parameters},
        cost.KVLayout(2, 2, 32, 2),
        SEED,
        cost.Workload(2048),
        measured_bytes={"measured": r.total_bytes},
    ).to_data()
    for key in ("batch1_weight_bound_ms", "batch_step_bound_ms", "verify_cost_ratio", "verify_compute_bound_batch"):
        assert out["formats"]["measured"][key] == old["formats"]["measured"][key]
    assert out["formats"]["measured"]["batch_weight_read_bytes"] == r.total_bytes


def test_config_and_weights_must_agree_on_the_experts(arch_models, capsys, tmp_path):
    """config.json's MoE layers or expert count against the headers: a mismatch is refused (exit 2) naming
    both, not priced; expert tensors with no expert count in config.json likewise."""
    import shutil

    ckpt = shutil.copytree(arch_models["qwen3_moe"], tmp_path / "m")
    c = _config(ckpt)
    for bad, words in [
        ({"mlp_only_layers": []}, "layers 0, 1, 2"),
        ({"num_local_experts": 16}, "stores 8 routed experts"),
        ({"num_local_experts": None}, "declares no expert count"),
    ]:
        (ckpt / "config.json").write_text(json.dumps({**c, **bad}))
        assert main(["cost", "--checkpoint", str(ckpt)]) == 2
        assert words in capsys.readouterr().err


def test_expected_experts_read_matches_enumeration():
    """E × (1 − (1 − k/E)^T) against every routing of T tokens to k of E experts, counted."""
    import itertools

    for e, k, t in [(4, 2, 2), (5, 2, 3), (6, 1, 3)]:
        choices = list(itertools.combinations(range(e), k))
        runs = list(itertools.product(choices, repeat=t))
        mean = sum(len(set().union(*run)) for run in runs) / len(runs)
        assert cost.expected_experts_read(e, k, t) == pytest.approx(mean, abs=1e-12)


def test_tokens_to_read_share():
    # ln(0.1) / ln(1 − 8/128) = 35.68: 36 tokens a step read 90% of a 128-expert top-8 layer
    assert cost.tokens_to_read_share(128, 8, 0.9) == 36
    assert 1 - (1 - 8 / 128) ** 35 < 0.9 <= 1 - (1 - 8 / 128) ** 36
    assert cost.tokens_to_read_share(8, 8, 0.99) == 1


def test_moe_compute_bound_batch_is_the_first_compute_bound_batch():
    """The bisection finds the smallest compute-bound batch, checked against a scan, with experts read by
    uniform routing."""
    routed = tuple(cost.RoutedExperts(i, 128, 8, 4e9, 2_000_000_000) for i in range(20))
    w = cost.Weights(100e9, routed)
    m = cost.CostModel(20e9, KV, SEED, 64)
    for positions in (1, 5):
        b = m.compute_bound_batch(w, positions)
        assert b is not None and m.compute_s(b, positions) >= m.memory_s(w, b, positions)
        assert all(m.compute_s(x, positions) < m.memory_s(w, x, positions) for x in range(1, b))


def test_the_reports_decode_bounds_price_an_moe_like_cost(arch_models, capsys):
    """`quantize report`'s decode column uses the same model: a Qwen3-MoE's batch-1 bound reads k/E of its
    experts, as `quantize cost --checkpoint` does, not every stored byte."""
    from quantize.checkpoint.accounting import bits_report
    from quantize.report.collect import Entry, decode_bounds

    ckpt = arch_models["qwen3_moe"]
    r = bits_report(ckpt)
    entry = Entry(str(ckpt), "moe", "-", "-", r.total_bytes, r.parameters, 16.0, None, r.bytes_by_role, "0" * 64)
    d = decode_bounds(entry, None, SEED, batch=4, context=100)
    out = _cost_json(capsys, ckpt, "--context", "100", "--batch", "4")
    assert d.batch1_ms == pytest.approx(out["formats"]["measured"]["batch1_step_bound_ms"])
    assert d.batch_ms == pytest.approx(out["formats"]["measured"]["batch_step_bound_ms"])
    routed = r.bytes_by_part["routed_experts"]["bytes"]  # batch 1 reads k/E = 2/8 of them
    read = r.total_bytes - routed * (1 - 2 / 8) - _not_looked_up(_config(ckpt), 1) + out["kv_bytes_per_sequence"]
    assert d.batch1_ms == pytest.approx(1000 * read / SEED.hbm_bytes_per_second)


def test_cli_prices_an_moe_without_a_checkpoint(capsys):
    """--routed-params/--experts/--top-k: Qwen3-235B-A22B's shapes (docs/cost.md) give its 22.19B active
    parameters, and batch 1 reads the non-expert bytes plus k/E of the experts' at the format's bits."""
    args = ["cost", "--params", "235093634560", "--routed-params", "227096395776", "--experts", "128"]
    args += ["--top-k", "8", "--layers", "94", "--kv-heads", "4", "--head-dim", "128", "--formats", "bf16=16"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["active_parameters"] == 22_190_763_520 == 235_093_634_560 - 227_096_395_776 * 120 // 128
    assert out["formats"]["bf16"]["batch1_weight_read_bytes"] == pytest.approx(2 * 22_190_763_520)
    assert out["moe"]["tokens_reading_90pct"] == 36
    assert main(["cost", "--experts", "8"]) == 2 and "go together" in capsys.readouterr().err
    assert main(["cost", "--routed-params", "1e9", "--experts", "8", "--top-k", "9"]) == 2
    assert "--top-k (9) <= --experts (8)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--layers", "-80"], "--layers (layers) = -80"),
        (["--layers", "100000000000"], "--layers (layers) = 100000000000"),  # a figure a layer: memory without end
        (["--kv-heads", "0"], "--kv-heads (kv_heads) = 0"),
        (["--kv-bytes", "inf"], "--kv-bytes inf"),
        (["--kv-bytes", "nan"], "--kv-bytes nan"),
    ],
)
def test_a_kv_shape_that_is_no_cache_is_exit_2(flags, says, capsys):
    """`--layers -80` printed a KV cache of -671,088,640 bytes a sequence and exited 0."""
    from quantize.cli import main

    assert main(["cost", "--params", "7e9", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_workload_of_nan_or_a_shape_of_nan_is_a_usage_error():
    from quantize.errors import UsageError

    with pytest.raises(UsageError, match="context length"):
        cost.Workload(context_tokens=float("nan")).check()
    with pytest.raises(UsageError, match="plain step"):
        cost.Workload(plain_step_ms=float("inf")).check()
    with pytest.raises(UsageError, match="bytes_per_element"):
        cost.KVLayout(80, 8, 128, float("nan"))


def test_a_memo_that_is_a_fifo_or_an_infinite_profile_is_not_taken(tmp_path):
    """`--hardware local` read its memo with read_text (a FIFO in its place hung the command) and took a profile of
    infinite bandwidth (bounds of 0.000 ms, exit 0): memos are read as regular, capped files, and a profile's
    figures must be finite (one that is not is measured again)."""
    import os

    from pydantic import ValidationError

    from quantize.cache import read_memo

    fifo = tmp_path / "memo.json"
    os.mkfifo(fifo)
    assert read_memo(fifo, "profile") is None
    with pytest.raises(ValidationError):
        cost.Hardware(name="local", hbm_bytes_per_second=float("inf"), peak_dense_flops=1e12, source="memo")


BIG = "1" + "0" * 400


@pytest.mark.parametrize(
    "flags,says",
    [
        # past a float's range: OverflowError or ZeroDivisionError, exit 3 (a review's repros)
        (["--params", "7e9", "--routed-params", "1", "--experts", "8", "--top-k", "2"], "0 parameters a layer"),
        (["--draft-cost", "1e308"], "draft cost c = 1e+308"),
        (["--gamma", BIG], "gamma (draft length) must be a whole number from 1 to 1,000"),
        (["--batch", BIG], "batch must be a whole number from 1 to 10,000,000"),
        (["--context", BIG], "context length must be a whole number from 0 to"),
        (["--params", "1e308"], "at most 1e+15"),
        # accepted and ignored, exit 0
        (["--project-params", "70e9"], "give --checkpoint too"),
        (["--project-share", "0.9"], "give --project-params"),
        # named as the API's keywords, or an empty format name taken (a review)
        (["--formats", "bf16=nan"], "--formats expects name=bits pairs"),
        (["--formats", "=16"], "got '=16'"),
        # the last of two kept, silently (a review)
        (["--formats", "bf16=16,int4=4.15, bf16=8"], "--formats names 'bf16' twice (bf16=16 and bf16=8)"),
        (["--params", "nan"], "--params nan: give a finite number above 0"),
    ],
    ids=[
        "routed-0-a-layer",
        "draft-cost",
        "gamma",
        "batch",
        "context",
        "params",
        "project-alone",
        "share-alone",
        "format-nan",
        "format-unnamed",
        "format-twice",
        "params-nan",
    ],
)
def test_a_workload_past_any_model_or_a_flag_that_changes_nothing_is_exit_2(flags, says, capsys):
    assert main(["cost", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err) < 600, err


@pytest.mark.parametrize("flag", [["--params", "8e9"], ["--formats", "bf16=16"], ["--experts", "8"]])
def test_hand_figures_beside_a_checkpoint_are_refused_not_ignored(tiny_model, capsys, flag):
    """--params, --formats and the MoE flags beside --checkpoint were read by nothing: exit 0 (a review)."""
    assert main(["cost", "--checkpoint", str(tiny_model), *flag]) == 2
    assert f"{flag[0]} describe a model by hand" in capsys.readouterr().err


def test_routed_experts_that_cannot_be_are_refused():
    """E = 0 divided by zero; k > E, or experts holding more than the model, made the active count exceed the
    model or go negative (a review's API repros)."""
    for bad in [dict(experts=0, top_k=0), dict(experts=4, top_k=8)]:
        with pytest.raises(UsageError, match="routed experts of layer 0"):
            cost.RoutedExperts(0, bytes=0.0, parameters=10, **bad)
    routed = (cost.RoutedExperts(0, 8, 2, 0.0, 10**12),)
    with pytest.raises(UsageError, match="more than the model's"):
        cost.token_cost(1e9, {"bf16": 16}, KV, SEED, cost.Workload(), routed=routed)


def _embedded(folder, vocab: int, head: bool):
    """A checkpoint of an input embedding of `vocab` rows, one linear and (`head`) an output layer of its own."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    t = {"model.embed_tokens.weight": torch.zeros(vocab, 64, dtype=torch.bfloat16)}
    t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)
    if head:
        t["lm_head.weight"] = torch.zeros(vocab, 64, dtype=torch.bfloat16)
    save_file(t, str(folder / "model.safetensors"))
    cfg = {"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
    cfg |= {"hidden_size": 64, "vocab_size": vocab, "tie_word_embeddings": not head}  # shapes the weights hold
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("head", [True, False], ids=["untied", "tied"])
def test_a_decode_step_reads_a_row_of_an_embedding_table_it_only_looks_up(tmp_path, capsys, head):
    """A step reads one row per token of an input embedding beside a stored output layer (a lookup, not a
    product): every table was counted whole, twice the read of this model, and the bound was no lower bound (a
    review). A tied table is read whole by the output layer, so it counts whole."""
    table = 4096 * 64 * 2
    assert main(["cost", "--checkpoint", str(_embedded(tmp_path / "m", 4096, head)), "--json", "--batch", "8"]) == 0
    row = json.loads(capsys.readouterr().out)["formats"]["measured"]
    total = row["weight_bytes"]
    assert total == table * (2 if head else 1) + 64 * 64 * 2
    looked_up = table - table / 4096 if head else 0
    assert row["batch1_weight_read_bytes"] == pytest.approx(total - looked_up)
    assert row["batch_weight_read_bytes"] == pytest.approx(total - (table - 8 * table / 4096 if head else 0))


def test_the_api_refuses_what_the_command_line_refuses(tmp_path, tiny_model):
    """A review's API repros: experts of no parameters divided by zero (fewer parameters than experts passed),
    1e300 bits per weight overflowed, a 1e308 ms step priced an Infinity iteration, project_share without
    project_params was ignored, kv_bytes beside kv was ignored, and a batch of 0 was refused only after the
    checkpoint was read."""
    import quantize

    for params in (0, 3):
        with pytest.raises(UsageError, match="at least one per expert"):
            cost.RoutedExperts(0, 8, 2, 0.0, params)
    with pytest.raises(UsageError, match="at most 64"):
        cost.token_cost(1e9, {"x": 1e300}, KV, SEED, cost.Workload())
    with pytest.raises(UsageError, match="plain step"):
        cost.token_cost(1e9, {"bf16": 16}, KV, SEED, cost.Workload(plain_step_ms=1e308, gamma=1000, draft_cost=1000))
    with pytest.raises(UsageError, match="give `project_params` too"):
        quantize.decode_cost(tiny_model, project_share=0.5)
    with pytest.raises(UsageError, match="`project_params` 1e\\+16"):
        quantize.decode_cost(tiny_model, project_params=1e16)
    with pytest.raises(UsageError, match="batch"):
        quantize.decode_cost(tmp_path / "nothing here", workload=cost.Workload(batch=0))
    kv = cost.KVLayout(2, 2, 2, 2)
    both = quantize.decode_cost(tiny_model, kv=kv, kv_bytes=1).kv_bytes_per_sequence
    assert both == quantize.decode_cost(tiny_model, kv=cost.KVLayout(2, 2, 2, 1)).kv_bytes_per_sequence
    assert both * 2 == quantize.decode_cost(tiny_model, kv=kv).kv_bytes_per_sequence


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--params", "1e15", "--formats", "x=1e300"], "at most 64"),
        (["--plain-step-ms", "1e308", "--gamma", "1000", "--draft-cost", "1000"], "plain step"),
    ],
)
def test_numbers_past_what_the_cost_can_hold_are_exit_2(capsys, argv, says):
    assert main(["cost", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
