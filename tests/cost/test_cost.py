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
