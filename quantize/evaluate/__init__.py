"""Scoring: lm-eval over a golden set with per-item records (`score`) and token-distribution agreement
against a baseline's top-k (`agreement`). It loads models and scores; it never decides (that is `gates`)."""
