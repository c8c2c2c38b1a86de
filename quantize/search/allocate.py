"""Per-unit precision under a byte budget: a multiple-choice knapsack over measured damage (pure functions).

Unit u with options o has true bytes b_uo and damage d_uo (mean KL to the baseline with u alone
quantized with o; 0 for keep). Damage is taken as additive (to first order, independent perturbations
of the logits add their KL), so the allocation solves

    minimise Σ_u d_u,o(u)   subject to   F + Σ_u b_u,o(u) ≤ B

exactly by dynamic programming over bytes counted in blocks of `resolution` bytes, each option's bytes
rounded UP: an allocation the program accepts never exceeds B in true bytes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def knapsack(
    bytes_: Sequence[dict[str, int]],
    damage: Sequence[dict[str, float]],
    capacity: int,
    resolution: int = 4096,
) -> list[str] | None:
    """Options per unit minimising total damage with Σ bytes ≤ capacity; None when even the smallest
    option of every unit does not fit."""
    import numpy as np

    n = len(bytes_)
    base = [min(b.values()) for b in bytes_]
    spare = capacity - sum(base)
    if spare < 0:
        return None
    cells = spare // resolution
    inf = float("inf")
    best = np.zeros(cells + 1)  # best[c]: least damage of units so far with extra blocks ≤ c
    choice = np.zeros((n, cells + 1), dtype=np.int16)
    names = [sorted(b) for b in bytes_]
    for u in range(n):
        new = np.full(cells + 1, inf)
        for k, o in enumerate(names[u]):
            extra = math.ceil((bytes_[u][o] - base[u]) / resolution)
            if extra > cells:
                continue
            cand = np.full(cells + 1, inf)
            cand[extra:] = best[: cells + 1 - extra] + damage[u][o]
            better = cand < new
            new[better] = cand[better]
            choice[u][better] = k
        best = new
    c = int(np.argmin(best))  # least damage within the budget (fewer bytes on ties)
    out: list[str] = []
    for u in range(n - 1, -1, -1):
        o = names[u][int(choice[u][c])]
        out.append(o)
        c -= math.ceil((bytes_[u][o] - base[u]) / resolution)
    return out[::-1]


def random_allocation(bytes_: Sequence[dict[str, int]], capacity: int, base: str, up: str, seed: int) -> list[str]:
    """Every unit at `base`, then units in a seeded random order moved to `up` while the bytes fit."""
    alloc = [base] * len(bytes_)
    used = sum(b[base] for b in bytes_)
    order = list(range(len(bytes_)))
    random.Random(seed).shuffle(order)
    for u in order:
        extra = bytes_[u][up] - bytes_[u][base]
        if used + extra <= capacity:
            alloc[u], used = up, used + extra
    return alloc
