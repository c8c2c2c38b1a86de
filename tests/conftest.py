"""Shared fixtures: offline mode, and tiny seeded models built from a config (no download)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

TINY = dict(
    vocab_size=2048, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
    tie_word_embeddings=True, rms_norm_eps=1e-5,
)


def make_tiny_llama(path: Path, seed: int = 0, **overrides) -> Path:
    """A 2-layer Llama with random weights (seeded) and the default model's tokenizer, saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer_for(config.vocab_size).save_pretrained(path)
    return path


def tokenizer_for(vocab_size: int):
    """A word-level tokenizer over the most frequent words of the shipped calibration text."""
    import collections
    import json
    import re
    from importlib import resources

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    text = (resources.files("quantize") / "data" / "jargon-calibration.jsonl").read_text(encoding="utf-8")
    words = collections.Counter(w for line in text.splitlines() for w in re.findall(r"\w+|[^\w\s]", json.loads(line)["text"]))
    vocab = {"<unk>": 0, "<eos>": 1} | {w: i + 2 for i, (w, _) in enumerate(words.most_common(vocab_size - 2))}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
