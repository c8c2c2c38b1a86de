"""quantize: recipe-driven LLM quantization with true bits-per-weight accounting and a quality gate."""

__version__ = "0.1.0"
