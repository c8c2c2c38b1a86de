"""quantize: recipe-driven LLM quantization with true bits-per-weight accounting and a quality gate."""

__version__ = "0.1.0"

from quantize.api import (  # the Python API (docs/api.md); importing it loads no heavy library
    Converted,
    agree,
    decode_cost,
    gate,
    inspect,
    plan_sweep,
    run,
    run_search,
    run_sweep,
    score,
    write_report,
)
from quantize.errors import QuantizeWarning, RuntimeFailure, UsageError

__all__ = [
    "Converted",
    "QuantizeWarning",
    "RuntimeFailure",
    "UsageError",
    "agree",
    "decode_cost",
    "gate",
    "inspect",
    "plan_sweep",
    "run",
    "run_search",
    "run_sweep",
    "score",
    "write_report",
]
