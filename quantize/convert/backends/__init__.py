"""The backends that load, quantize and save a model (`Backend`, one module each). The engine calls the
protocol and never names a backend."""
