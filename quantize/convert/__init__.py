"""Conversion, `quantize run`: a recipe (`recipe`) is planned (`plan`), compiled to a backend's modifiers
(`modifiers`), calibrated (`calibration`, `dtypes`) and run by one backend (`backends/`), then checked
(`checks`), accounted and recorded (`engine`, `provenance`, `card`)."""
