"""quantize: recipe-driven LLM quantization with true bits-per-weight accounting and a quality gate."""

from importlib import metadata

from quantize import api
from quantize.api import *  # the Python API (docs/api.md), exactly api.__all__; importing it loads no heavy library
from quantize.errors import QuantizeWarning, RuntimeFailure, UsageError

try:
    __version__ = metadata.version("quantize")  # pyproject.toml's, the one place the version is written
except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [*api.__all__, "QuantizeWarning", "RuntimeFailure", "UsageError"]
