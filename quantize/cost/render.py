"""`quantize cost` as text: every time it prints is labelled a lower bound; its table is tables.py's `text_table`."""

from __future__ import annotations

from quantize.cost.bounds import TokenCost
from quantize.tables import text_table


def _architecture(result: TokenCost) -> list[str]:
    """What the bounds assume of the architecture: the KV layout, and an MoE's active parameters and routing."""
    kv = result.kv_layout
    lines = []
    if "attention" in kv:
        windowed = (
            f"; {kv['windowed_layers']} of {kv['layers']} layers hold at most {kv['window']:,} tokens"
            if kv["windowed_layers"]
            else ""
        )
        kv_layers = kv.get("kv_layers", kv["layers"])
        held = f" in {kv_layers} of {kv['layers']} layers" if kv_layers != kv["layers"] else ""
        by_layer = kv.get("values_per_token_by_layer")
        values = (
            f"{', '.join(f'{v:,}' for v in by_layer)} values per token by layer"
            if by_layer
            else f"{kv['values_per_token_per_layer']:,} values per token and layer"
        )
        lines.append(
            f"  KV cache {kv['attention']}: {kv['values_formula']} = {values}{held}, {kv['bytes_per_element']:g} "
            f"byte(s) each{windowed}"
        )
        if kv.get("compressed_layers"):
            lines.append(
                f"  compressed attention in {kv['compressed_layers']} of {kv['layers']} layers: a K=V window, an "
                "entry per compress rate tokens and the tokens awaiting their window (kv_layout.layer_formulas), "
                "included above"
            )
        if kv.get("state_layers"):
            lines.append(
                f"  fixed state (constant in the context) of {kv['state_layers']} layer(s): "
                f"{kv['state_bytes_per_sequence']:,.0f} bytes per sequence ({kv['state_dtype']}), included above"
            )
        if kv.get("note"):
            lines.append(f"  note: {kv['note']}")
    if (m := result.moe) is not None:
        first = m.layers[0]
        lines += [
            f"  active parameters {result.active_parameters:,} per position ({len(m.layers)} MoE layer(s), top-"
            f"{first.top_k} of {first.experts} routed experts; compute = 2 × active parameters)",
            f"  routed experts read per step: {100 * m.experts_read_share_batch1:.1f}% at batch 1, "
            f"{100 * m.experts_read_share_at_batch:.1f}% at batch {result.batch}; 90% from {m.tokens_reading_90pct} "
            f"tokens a step, 99% from {m.tokens_reading_99pct}",
            f"  assumes {m.assumption}",
        ]
    if result.not_read is not None:
        lines.append(f"  {result.not_read.note}")
    return lines


def render(result: TokenCost) -> str:
    """Human-readable text; every time carries 'lower bound'."""
    hw, s = result.hardware, result.speculation
    lines = [
        f"Token-cost LOWER BOUNDS ({result.scope})",
        f"  hardware {hw.name}: {hw.hbm_bytes_per_second / 1e12:.2f} TB/s, "
        f"{hw.peak_dense_flops / 1e12:,.0f} TFLOP/s dense ({hw.source})",
        f"  parameters {result.parameters:,.0f}; context {result.context_tokens:,} tokens; batch "
        f"{result.batch}; "
        f"KV bytes per sequence {result.kv_bytes_per_sequence:,.0f}",
        *_architecture(result),
        "",
    ]
    rows = [
        [
            name,
            f"{r.bits_per_weight:.3f}",
            f"{r.weight_gb:.4f}",
            f"{r.weight_gib:.2f}",
            f"{r.batch1_weight_bound_ms:.3f}",
            f"{r.batch_step_bound_ms:.3f}",
            r.batch_binding,
            f"{r.verify_cost_ratio:.4f}",
            f"{r.speculative_speedup_at_batch:.4f}",
            r.verify_compute_bound_batch,
        ]
        for name, r in result.formats.items()
    ]
    head = ["format", "bits/w", "GB", "GiB", "b1 bound ms", "bN bound ms", "binds", "verify×", "spec×", "cb batch"]
    lines += ["  " + line for line in text_table(rows, head).splitlines()]
    lines += [
        "",
        "  b1 = batch-1 weight-read lower bound; bN = batch step lower bound with KV reads; verify× = cost of "
        "verifying",
        "  γ+1 positions relative to a plain step; spec× = speculative speedup with that cost; cb batch = smallest "
        "batch",
        "  at which verification is compute-bound.",
        "",
        f"  speculation (α={s.alpha}, γ={s.gamma}, c={s.draft_cost}; {s.assumptions}):",
        f"    expected tokens per target step {s.expected_tokens_per_target_step:.4f}",
        f"    speedup with free verification  {s.speedup_free_verification:.4f}×  (break-even α ≈ "
        f"{s.break_even_alpha:.3f})",
        f"    with a {s.plain_step_ms} ms plain step: iteration {s.iteration_ms:.1f} ms, average TPOT "
        f"{s.average_tpot_ms:.4f} ms (lower bounds)",
    ]
    if (p := result.projection) is not None:
        r = p.formats["projected"]
        lines += [
            "",
            f"  {p.projection}",
            f"    {r.weight_gb:.3f} GB; batch-1 bound {r.batch1_weight_bound_ms:.3f} ms; batch-{p.batch} "
            f"bound {r.batch_step_bound_ms:.3f} ms",
        ]
    if (sw := result.sweeps) is not None:
        lines += ["", "  exercises (free verification):"]
        lines += [f"    α={a.alpha}: {a.expected_tokens:.4f} tokens, {a.speedup:.4f}×" for a in sw.alpha_sweep]
        lines.append(f"    best γ in 1..8: {sw.best_gamma} ({max(g.speedup for g in sw.gamma_sweep):.4f}×)")
        lines.append(f"    slow draft c=0.5: {sw.slow_draft.speedup:.4f}×")
    return "\n".join(lines)
