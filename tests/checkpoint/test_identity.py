"""A folder's weights hash is remembered in the cache for later processes on this machine (a sweep's workers hash a
checkpoint once), and only while the very same files are there: a rewrite, another boot or a memo written elsewhere
is never taken."""

from __future__ import annotations

import os
import shutil

import pytest

from quantize import cache
from quantize.checkpoint import files


@pytest.fixture
def ckpt(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    files._sha256_of_files.cache_clear()  # each test starts as a new process would
    yield shutil.copytree(tiny_model, tmp_path / "ckpt")
    files._sha256_of_files.cache_clear()


def _no_reading(monkeypatch):
    def refuse(_named):
        raise AssertionError("the weights were read again")

    monkeypatch.setattr(files, "sha256_named_files", refuse)


def test_a_later_process_finds_the_hash_without_reading_the_weights(ckpt, monkeypatch):
    first = files.weights_sha256(ckpt)
    files._sha256_of_files.cache_clear()  # a new process: its own memo is empty
    _no_reading(monkeypatch)
    assert files.weights_sha256(ckpt) == first


def test_a_rewritten_file_is_hashed_again_even_with_its_old_size_and_mtime(ckpt):
    first = files.weights_sha256(ckpt)
    f = ckpt / "model.safetensors"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # one byte of the last tensor: same size
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back; ctime cannot be
    files._sha256_of_files.cache_clear()
    assert files.weights_sha256(ckpt) != first


def test_another_boot_or_a_planted_memo_is_not_taken(ckpt, monkeypatch):
    named = [(f.name, f) for f in files.safetensors_files(ckpt)]
    monkeypatch.setattr(cache, "boot_id", lambda: "another-boot")
    cache.store_weights_hash(named, "0" * 64)  # what a cache written elsewhere could hold
    monkeypatch.undo()
    monkeypatch.setenv("QUANTIZE_CACHE", str(ckpt.parent / "cache"))
    assert cache.lookup_weights_hash(named) is None
    assert files.weights_sha256(ckpt) != "0" * 64
    # a memo whose content is not a sha256 is ignored, and the hash computed
    path = cache._weights_memo_path(named)
    path.write_text('{"weights_sha256": "not a hash"}')
    files._sha256_of_files.cache_clear()
    assert cache.lookup_weights_hash(named) is None and len(files.weights_sha256(ckpt)) == 64
