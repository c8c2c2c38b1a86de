"""Conversion, `quantize run`: a recipe (`recipe`) is planned (`plan`), calibrated (`calibration`, `dtypes`) and run
by one backend (`backends/`: each backend's class says what it can do; llm-compressor's compiles the recipe to its
modifiers, `backends/llmcompressor/modifiers`), then checked (`checks`), accounted and recorded (`engine`,
`provenance`, `card`)."""
