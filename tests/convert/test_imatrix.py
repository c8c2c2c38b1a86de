"""convert/imatrix.py's arithmetic, against the formula written as loops over tokens (llama-imatrix's own loops), and
its hand-over to llama.cpp's quantizer; no llama.cpp is needed but for the last test."""

from __future__ import annotations

import numpy as np
import pytest

from quantize.convert import imatrix
from quantize.errors import RuntimeFailure, UsageError


def test_a_dense_product_adds_each_columns_squares_and_counts_the_tokens():
    rng = np.random.default_rng(0)
    stats = imatrix.Stats()
    a, b = rng.normal(size=(1, 1, 20, 6)).astype(np.float32), rng.normal(size=(1, 1, 16, 6)).astype(np.float32)
    imatrix.add_dense(stats, "blk.0.attn_q.weight", a, (1, 1))
    imatrix.add_dense(stats, "blk.0.attn_q.weight", b, (1, 1))
    s = stats.by_weight["blk.0.attn_q.weight"]
    want = np.zeros(6)
    for x in (a[0, 0], b[0, 0]):
        for t in range(x.shape[0]):
            for j in range(6):
                want[j] += float(x[t, j]) ** 2
    assert np.allclose(s.sums[0], want) and s.counts.tolist() == [36]
    assert np.allclose(imatrix.importance(stats)["blk.0.attn_q.weight"], want / 36)


def test_the_sums_are_float32_running_sums_as_llama_imatrix_adds():
    """llama-imatrix adds x² to a float32 accumulator token by token: after a square of 1e8, each 1.0 is lost to
    rounding (float32 has 24 bits), where a float64 or pairwise sum would keep them. Its matrix, and so the bytes
    llama-quantize writes, are reproduced only by the same order and precision."""
    x = np.ones((1, 1, 17, 2), np.float32)
    x[0, 0, 0] = 1e4
    stats = imatrix.Stats()
    imatrix.add_dense(stats, "w", x, (1, 1))
    want = np.float32(0)
    for t in range(17):
        want = np.float32(want + np.float32(x[0, 0, t, 0] * x[0, 0, t, 0]))
    assert want == np.float32(1e8) and stats.by_weight["w"].sums[0, 0] == want
    assert float(np.sum(x[0, 0, :, 0].astype(np.float64) ** 2)) == 1e8 + 16  # what another order would give
    assert imatrix.importance(stats)["w"][0] == np.float32(want) / np.float32(17)


def test_a_3d_weight_keeps_one_row_of_sums_per_matrix():
    """src0 of ne2 = 3 matrices, activations of ne2 = 3 slices: slice i feeds matrix i (i mod ne2 of the weight)."""
    rng = np.random.default_rng(1)
    stats = imatrix.Stats()
    x = rng.normal(size=(1, 3, 16, 4)).astype(np.float32)
    imatrix.add_dense(stats, "blk.0.w", x, (3, 1))
    s = stats.by_weight["blk.0.w"]
    for m in range(3):
        assert np.allclose(s.sums[m], (x[0, m].astype(np.float64) ** 2).sum(axis=0))
    assert s.counts.tolist() == [16, 16, 16]


def test_routed_experts_count_the_tokens_each_expert_saw_and_an_unseen_one_weighs_1():
    rng = np.random.default_rng(2)
    stats = imatrix.Stats()
    tokens, chosen, experts, cols = 10, 2, 4, 5
    x = rng.normal(size=(tokens, chosen, cols)).astype(np.float32)  # one row per chosen expert
    ids = np.array([[0, 1], [1, 2], [0, 2], [1, 0], [2, 1], [0, 1], [1, 2], [2, 0], [0, 1], [1, 2]], dtype=np.int32)
    imatrix.add_experts(stats, "blk.0.ffn_up_exps.weight", x, ids, experts)
    want, count = np.zeros((experts, cols)), np.zeros(experts, dtype=int)
    for t in range(tokens):
        for k in range(chosen):
            want[ids[t, k]] += x[t, k].astype(np.float64) ** 2
            count[ids[t, k]] += 1
    s = stats.by_weight["blk.0.ffn_up_exps.weight"]
    assert np.allclose(s.sums, want) and s.counts.tolist() == count.tolist() and count[3] == 0
    values = imatrix.importance(stats)["blk.0.ffn_up_exps.weight"].reshape(experts, cols)
    assert np.allclose(values[:3], want[:3] / count[:3, None]) and (values[3] == 1).all()
    # one shared row for every chosen expert (slots = 1): each choice reads row 0
    shared = imatrix.Stats()
    imatrix.add_experts(shared, "e", x[:, :1], ids, experts)
    assert np.allclose(shared.by_weight["e"].sums[0], sum(x[t, 0].astype(np.float64) ** 2 for t in (0, 2, 3, 5, 7, 8)))


def test_an_expert_id_out_of_range_and_a_changed_shape_are_our_failures():
    stats = imatrix.Stats()
    with pytest.raises(RuntimeFailure, match="routed to expert 4 of 4"):
        imatrix.add_experts(stats, "e", np.ones((1, 1, 2), np.float32), np.array([[4]], np.int32), 4)
    imatrix.add_dense(stats, "w", np.ones((1, 1, 16, 3), np.float32), (1, 1))
    with pytest.raises(RuntimeFailure, match="first seen as"):
        imatrix.add_dense(stats, "w", np.ones((1, 1, 16, 4), np.float32), (1, 1))


def test_non_finite_activations_stop_the_run_naming_the_weight():
    x = np.ones((1, 1, 16, 3), np.float32)
    x[0, 0, 5, 1] = np.inf
    with pytest.raises(UsageError, match=r"non-finite activations into blk\.3\.ffn_down\.weight"):
        imatrix.add_dense(imatrix.Stats(), "blk.3.ffn_down.weight", x, (1, 1))


def test_a_scheduler_copys_name_is_read_as_llama_imatrix_reads_it():
    assert imatrix.weight_name("CUDA0#blk.0.attn_k.weight#0") == "blk.0.attn_k.weight"
    assert imatrix.weight_name("CPU#blk.1.ffn_up.weight") == "blk.1.ffn_up.weight"
    assert imatrix.weight_name("blk.2.ffn_gate.weight") == "blk.2.ffn_gate.weight"


def test_the_digest_covers_names_and_values():
    a = {"x": np.array([1.0, 2.0], np.float32)}
    assert imatrix.digest(a) == imatrix.digest({"x": np.array([1.0, 2.0], np.float32)})
    assert imatrix.digest(a) != imatrix.digest({"y": np.array([1.0, 2.0], np.float32)})
    assert imatrix.digest(a) != imatrix.digest({"x": np.array([1.0, 2.5], np.float32)})


def test_the_quantizers_array_ends_with_a_null_name_and_points_at_the_values():
    llama_cpp = pytest.importorskip("llama_cpp")
    values = {"blk.1.b": np.arange(3, dtype=np.float32), "blk.0.a": np.arange(2, dtype=np.float32) + 7}
    entries, keep = imatrix.quantize_param(values)
    assert isinstance(entries[0], llama_cpp.llama_model_imatrix_data) and len(entries) == 3
    assert [entries[i].name for i in range(2)] == [b"blk.0.a", b"blk.1.b"] and entries[2].name is None
    assert [entries[0].data[i] for i in range(entries[0].size)] == [7.0, 8.0]
    assert entries[1].size == 3 and keep
