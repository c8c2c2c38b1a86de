"""checkpoint/finite.py: the tensors of a safetensors checkpoint that store NaN or infinity, read from the files its
identity covers. Before it, only a GGUF's were scanned: a NaN in a safetensors weight whose effect the scored
logits do not show (an embedding row of a token no item holds) left every score finite, and a gate passed it."""

from __future__ import annotations

import json
import re

import pytest

from quantize.checkpoint import finite, ggufs
from quantize.errors import UsageError


@pytest.fixture(autouse=True)
def fresh(isolated_cache):
    ggufs._kept_scan.cache_clear()
    yield
    ggufs._kept_scan.cache_clear()


def _save(path, tensors):
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def _clean():
    import torch

    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.ones(32),
        "model.layers.0.mlp.down_proj.weight_packed": torch.full((8, 4), -1, dtype=torch.int32),
        "model.layers.0.mlp.down_proj.weight_scale": torch.rand(8, 1, generator=g).to(torch.float8_e4m3fn),
    }


@pytest.mark.parametrize("stored", sorted(finite.FLOAT_DTYPES))
def test_each_scanned_dtype_is_the_one_safetensors_stores_and_its_non_finite_values_are_found(tmp_path, stored):
    """FLOAT_DTYPES names, for each stored dtype, the torch dtype safetensors writes as it (so a file is read as
    safetensors loads it); every value of that dtype that torch reads as NaN or infinity is found (float8 E4M3 and
    E8M0 store NaN only, E5M2 infinity and NaN), and a tensor of its finite values is not."""
    import torch
    from safetensors import safe_open

    dtype = getattr(torch, finite.FLOAT_DTYPES[stored])
    every = torch.arange(256 ** min(dtype.itemsize, 2), dtype=torch.int64)  # every byte (or 16-bit) pattern
    raw = every.to(torch.uint8 if dtype.itemsize == 1 else torch.int16).view(torch.uint8)
    raw = torch.cat([raw, torch.zeros((-len(raw)) % dtype.itemsize, dtype=torch.uint8)])
    values = raw.view(dtype)
    wide = values if dtype.is_complex or dtype.itemsize > 1 else values.float()
    bad = ~torch.isfinite(wide)
    f = _save(tmp_path / "m.safetensors", {"x": values, "ok": values[~bad].clone()})
    with safe_open(str(f), "pt") as st:
        assert st.get_slice("x").get_dtype() == stored and st.get_tensor("x").dtype == dtype
    assert finite.non_finite_tensors(f) == (["x"] if bad.any() else [])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("model.embed_tokens.weight", float("nan")),  # bf16, one row a load never reads
        ("model.embed_tokens.weight", float("-inf")),
        ("model.norm.weight", float("inf")),  # f32
        ("model.layers.0.mlp.down_proj.weight_scale", float("nan")),  # a float8 scale of a quantized layer
    ],
)
def test_a_tensor_storing_nan_or_infinity_is_named_and_integers_are_not_read(tmp_path, name, value):
    """One non-finite value of a floating tensor is found and named; the packed int32 weight, whose bytes are all
    0xFF (NaN, read as float32), is not: an integer holds no NaN."""
    clean = _save(tmp_path / "clean" / "model.safetensors", _clean())
    tensors = _clean()
    tensors[name].view(-1)[-1] = value
    _save(tmp_path / "bad" / "model.safetensors", tensors)
    assert finite.non_finite_tensors(clean.parent) == []
    assert finite.non_finite_tensors(tmp_path / "bad") == [name]


def test_every_shard_the_identity_covers_is_read_and_nothing_else(tmp_path):
    """A sharded checkpoint: each shard its index names is read (a NaN in the second is found), and a stray file
    beside them that no loader reads (files.loaded_weights) is not."""
    import torch

    tensors = _clean()
    first = {k: v for k, v in tensors.items() if "layers" not in k}
    second = {k: v for k, v in tensors.items() if "layers" in k}
    second["model.layers.0.mlp.down_proj.weight_scale"] = torch.full((8, 1), float("nan")).to(torch.float8_e4m3fn)
    _save(tmp_path / "model-00001-of-00002.safetensors", first)
    _save(tmp_path / "model-00002-of-00002.safetensors", second)
    index = {"metadata": {}, "weight_map": {k: "model-00001-of-00002.safetensors" for k in first}}
    index["weight_map"] |= {k: "model-00002-of-00002.safetensors" for k in second}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    stray = dict(first)
    stray["model.norm.weight"] = torch.full((32,), float("nan"))
    _save(tmp_path / "stray.safetensors", stray)
    assert finite.non_finite_tensors(tmp_path) == ["model.layers.0.mlp.down_proj.weight_scale"]


def test_the_scan_reads_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A NaN in the last element of a tensor read in many chunks is found, as one in the first chunk is; each read
    is SCAN_ELEMENTS elements, whatever the tensor's size."""
    import torch

    monkeypatch.setattr(finite, "SCAN_ELEMENTS", 100)  # 64 × 32 = 2048 elements: 21 chunks of the embedding
    reads = []
    real = finite._finite

    def counted(torch_, path, fh, buf, start, nbytes, dtype):
        reads.append(len(buf))
        return real(torch_, path, fh, buf, start, nbytes, dtype)

    monkeypatch.setattr(finite, "_finite", counted)
    for where in (0, -1):
        tensors = _clean()
        tensors["model.embed_tokens.weight"].view(-1)[where] = torch.nan
        f = _save(tmp_path / f"{where}.safetensors", tensors)
        assert finite.non_finite_tensors(f) == ["model.embed_tokens.weight"]
    assert set(reads) == {100 * 8}


def test_the_memo_is_kept_and_a_rewritten_file_is_read_again(tmp_path, isolated_cache, monkeypatch):
    """Each file's result is kept in the identity memo on disk (another process finds it without reading the file)
    and read again once the file is written (its ctime moves), whatever its bytes."""
    import torch

    tensors = _clean()
    tensors["model.norm.weight"][3] = torch.nan
    bad = _save(tmp_path / "m" / "model.safetensors", tensors)
    assert finite.non_finite_tensors(bad.parent) == ["model.norm.weight"]
    assert len(list((isolated_cache / "identity").glob("safetensors-finite-*.json"))) == 1
    ggufs._kept_scan.cache_clear()

    def unread(path):
        raise AssertionError(f"read {path} again")

    with monkeypatch.context() as m:
        m.setattr(finite, "_scan", unread)
        assert finite.non_finite_tensors(bad.parent) == ["model.norm.weight"]  # from the memo on disk
    _save(bad, _clean())  # written again, clean
    assert finite.non_finite_tensors(bad.parent) == []
    assert len(list((isolated_cache / "identity").glob("safetensors-finite-*.json"))) == 2


def test_a_file_cut_short_while_it_is_read_is_refused(tmp_path, monkeypatch):
    """A tensor whose bytes end before its header says (the file truncated after its header was read) is a
    UsageError naming the file, not a scan that reports it clean."""
    f = _save(tmp_path / "m.safetensors", _clean())
    real = finite.read_header

    def then_cut(path):
        found = real(path)
        with open(path, "r+b") as fh:
            fh.truncate(f.stat().st_size - 10)
        return found

    monkeypatch.setattr(finite, "read_header", then_cut)
    with pytest.raises(UsageError, match=re.escape(f"{f} changed while it was read")):
        finite.non_finite_tensors(f)


def test_a_large_files_scan_is_a_progress_stage_counting_its_tensors(tmp_path, monkeypatch):
    """A file of at least SCAN_SHOWN_BYTES is scanned as a progress stage counting the floating tensors it reads;
    a smaller one shows nothing."""
    import io

    from quantize import progress

    f = _save(tmp_path / "m.safetensors", _clean())
    out = io.StringIO()
    with progress.shown(True, out, tty=False):
        assert finite.non_finite_tensors(f) == []
    assert out.getvalue() == ""
    monkeypatch.setattr(ggufs, "SCAN_SHOWN_BYTES", f.stat().st_size)
    _save(f, _clean())  # written again: scanned again
    with progress.shown(True, out, tty=False):
        assert finite.non_finite_tensors(f) == []
    lines = out.getvalue().splitlines()
    assert lines[0] == "quantize: NaN scan of m.safetensors (3 tensors) ..."  # the packed int32 is not read
    assert re.match(r"quantize: NaN scan of m\.safetensors: done, 3 tensors, ", lines[-1]), lines
