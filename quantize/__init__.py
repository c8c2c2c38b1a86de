"""quantize: recipe-driven LLM quantization with true bits-per-weight accounting and a quality gate."""

__version__ = "0.1.0"

from quantize.api import (  # the Python API (docs/api.md); importing it loads no heavy library
    CacheKey,
    Converted,
    agree,
    agreement,
    cache_key,
    decode_cost,
    gate,
    golden_new,
    golden_verify,
    inspect,
    plan_sweep,
    run,
    run_search,
    run_sweep,
    score,
    scored,
    token_cost,
    write_report,
)
from quantize.errors import QuantizeWarning, RuntimeFailure, UsageError

__all__ = [
    "CacheKey",
    "Converted",
    "QuantizeWarning",
    "RuntimeFailure",
    "UsageError",
    "agree",
    "agreement",
    "cache_key",
    "decode_cost",
    "gate",
    "golden_new",
    "golden_verify",
    "inspect",
    "plan_sweep",
    "run",
    "run_search",
    "run_sweep",
    "score",
    "scored",
    "token_cost",
    "write_report",
]
