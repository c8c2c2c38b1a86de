"""The worked example of docs/cost.md: decode lower bounds of a 235B-parameter MoE with 22B active per token
(the shapes of Qwen3-235B-A22B) at BF16, FP8 and NVFP4, from quantize/cost/bounds.py's own functions.

Shapes: 94 layers, hidden 4096, 64 query and 4 KV heads of 128, every layer an MoE of 128 routed experts
(moe_intermediate_size 1536, gate/up/down), top-8, no shared expert, vocabulary 151,936, untied output layer,
RMSNorm with q/k norms. Source: THUDM/slime scripts/models/qwen3-235B-A22B.sh (the Megatron arguments of the
public checkpoint); the parameter count they give, 235,093,634,560, is the one keras-hub's preset
qwen3_moe_235b_a22b_en states for Qwen/Qwen3-235B-A22B (checked below).

Formats (what each charges per weight): BF16 16 bits everywhere; FP8 8 bits for the linears of attention and
experts (per-channel scales left out: 16 bits per output row, < 0.4% more); NVFP4 4.5 bits for the same linears
(4-bit E2M1 plus one E4M3 scale per 16 weights; the per-tensor FP32 global scales left out). Embeddings, output
layer, routers and norms stay BF16 in every format, as llm-compressor's MoE recipes leave them (lm_head and the
`mlp.gate` routers ignored).

    python benchmarks/moe_cost.py            # prints the figures docs/cost.md quotes
"""

from __future__ import annotations

from quantize.cost import bounds

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 94, 4096, 64, 4, 128
EXPERTS, TOP_K, MOE_INTERMEDIATE, VOCAB = 128, 8, 1536, 151_936
PUBLISHED_PARAMETERS = 235_093_634_560  # keras-hub qwen3_moe_235b_a22b_en
HW = bounds.HARDWARE["h200"]
CONTEXT, BATCH = 4096, 32
LINEAR_BITS = {"bf16": 16.0, "fp8": 8.0, "nvfp4": 4.5}


def shapes() -> dict[str, int]:
    attention = 2 * HIDDEN * HEADS * HEAD_DIM + 2 * HIDDEN * KV_HEADS * HEAD_DIM  # q, o; k, v
    experts = EXPERTS * 3 * HIDDEN * MOE_INTERMEDIATE  # gate, up, down of each expert
    router = EXPERTS * HIDDEN
    norms = 2 * HIDDEN + 2 * HEAD_DIM  # input, post-attention; q_norm, k_norm
    return {
        "attention": LAYERS * attention,
        "routed_experts": LAYERS * experts,
        "router": LAYERS * router,
        "norm": LAYERS * norms + HIDDEN,  # + the final norm
        "embedding": VOCAB * HIDDEN,
        "lm_head": VOCAB * HIDDEN,
    }


def weights(fmt: str, p: dict[str, int]) -> bounds.Weights:
    bits = LINEAR_BITS[fmt]
    per_layer = p["routed_experts"] // LAYERS
    routed = tuple(bounds.RoutedExperts(i, EXPERTS, TOP_K, per_layer * bits / 8, per_layer) for i in range(LAYERS))
    total = (p["attention"] + p["routed_experts"]) * bits / 8 + (
        p["router"] + p["norm"] + p["embedding"] + p["lm_head"]
    ) * 2
    return bounds.Weights(total, routed)


def main() -> None:
    p = shapes()
    n = sum(p.values())
    assert n == PUBLISHED_PARAMETERS, n
    routed = weights("bf16", p).routed
    active = bounds.active_parameter_count(n, routed)
    print(f"parameters {n:,} (published {PUBLISHED_PARAMETERS:,}); routed experts {p['routed_experts']:,}")
    print(f"active parameters per token {active:,} = {n:,} - {p['routed_experts']:,} x (1 - {TOP_K}/{EXPERTS})")
    print(f"hardware {HW.name}: {HW.hbm_bytes_per_second / 1e12} TB/s, {HW.peak_dense_flops / 1e12:g} TFLOP/s dense")
    moe = bounds.moe_cost(routed, BATCH)
    print(
        f"experts read per step (uniform routing): batch 1 {moe.experts_read_share_batch1:.4f}, batch {BATCH} "
        f"{moe.experts_read_share_at_batch:.4f}; half from {moe.tokens_reading_half} tokens a step, 90% from "
        f"{moe.tokens_reading_90pct}, 99% from {moe.tokens_reading_99pct}"
    )
    for kv_bytes in (2, 1):
        kv = bounds.KVLayout(LAYERS, KV_HEADS, HEAD_DIM, kv_bytes)
        model = bounds.CostModel(active, kv, HW, CONTEXT)
        dense = bounds.CostModel(n, kv, HW, CONTEXT)  # the old pricing: every weight, every parameter
        print(
            f"\nKV cache {'BF16' if kv_bytes == 2 else 'FP8'}: {kv.bytes_per_sequence(CONTEXT) / 1e9:.3f} GB per "
            f"sequence at {CONTEXT} tokens ({2 * LAYERS * KV_HEADS * HEAD_DIM * kv_bytes:,} bytes per token)"
        )
        print(
            f"{'format':<7}{'GB stored':>10}{'b1 GB read':>11}{'b1 ms':>8}{'dense b1 ms':>12}"
            f"{f'b{BATCH} GB read':>13}{f'b{BATCH} ms':>8}{'binds':>8}{'ms/token':>9}{'cb batch':>9}"
        )
        for fmt in LINEAR_BITS:
            w = weights(fmt, p)
            row = model.format_row(w, BATCH, gamma=4, alpha=0.8, draft_cost=0.1)
            old = dense.format_row(w.total_bytes, BATCH, gamma=4, alpha=0.8, draft_cost=0.1)
            cb = model.compute_bound_batch(w, 1)
            print(
                f"{fmt:<7}{w.total_bytes / 1e9:>10.1f}{row.batch1_weight_read_bytes / 1e9:>11.2f}"
                f"{row.batch1_step_bound_ms:>8.2f}{old.batch1_step_bound_ms:>12.2f}"
                f"{row.batch_weight_read_bytes / 1e9:>13.1f}{row.batch_step_bound_ms:>8.2f}{row.batch_binding:>8}"
                f"{row.batch_step_bound_ms / BATCH:>9.3f}{cb!s:>9}"
            )
    sweep(p, active)


def sweep(p: dict[str, int], active: int) -> None:
    """NVFP4 weights, FP8 KV cache: how the step grows with the batch once every expert is read."""
    w = weights("nvfp4", p)
    model = bounds.CostModel(active, bounds.KVLayout(LAYERS, KV_HEADS, HEAD_DIM, 1), HW, CONTEXT)
    print(f"\nNVFP4, FP8 KV, {CONTEXT} tokens: batch, experts read, GB of weights read, step ms, ms per sequence")
    for b in (1, 2, 4, 8, 16, 32, 64, 128):
        share = bounds.expected_experts_read(EXPERTS, TOP_K, b) / EXPERTS
        step = 1000 * model.step_bound_s(w, b)
        print(f"{b:>5}{share:>8.3f}{w.read_bytes(b) / 1e9:>8.1f}{step:>9.2f}{step / b:>8.3f}")


if __name__ == "__main__":
    main()
