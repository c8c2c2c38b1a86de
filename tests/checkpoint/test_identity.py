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
    def refuse(_path):
        raise AssertionError("the weights were read again")

    monkeypatch.setattr(files, "sha256_file", refuse)


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
    files.store_weights_hash(named, "0" * 64)  # what a cache written elsewhere could hold
    monkeypatch.undo()
    monkeypatch.setenv("QUANTIZE_CACHE", str(ckpt.parent / "cache"))
    assert files.lookup_weights_hash(named) is None
    assert files.weights_sha256(ckpt) != "0" * 64
    # a memo whose content is not a sha256 is ignored, and the hash computed
    path = files._weights_memo_path(named)
    path.write_text('{"weights_sha256": "not a hash"}')
    files._sha256_of_files.cache_clear()
    assert files.lookup_weights_hash(named) is None and len(files.weights_sha256(ckpt)) == 64


# --- the Hub-blob shortcut: only inside a real Hub cache layout --------------------------------------------------


def _blob_layout(root, ckpt, repo="models--org--name"):
    """root/repo/{blobs/<sha256 of the weights>, snapshots/REV/model.safetensors -> ../../blobs/<sha256>}."""
    weights = ckpt / "model.safetensors"
    sha = files.sha256_file(weights)
    blobs = root / repo / "blobs"
    blobs.mkdir(parents=True)
    shutil.copyfile(weights, blobs / sha)
    snap = root / repo / "snapshots" / "rev"
    snap.mkdir(parents=True)
    for f in ckpt.iterdir():
        if f.suffix != ".safetensors":
            shutil.copyfile(f, snap / f.name)
    (snap / "model.safetensors").symlink_to(os.path.join("..", "..", "blobs", sha))
    return snap, sha


def test_a_true_snapshot_is_named_by_its_blob(ckpt, tmp_path):
    snap, sha = _blob_layout(tmp_path / "hub", ckpt)
    assert files.hub_blob_sha256(snap / "model.safetensors") == sha
    assert files.weights_sha256(snap) == files.sha256_bytes(f"model.safetensors {sha}\n".encode())


def test_the_same_files_as_a_folder_and_as_a_hub_snapshot_have_one_identity(ckpt, tmp_path):
    """One identity whatever the layout: the snapshot's lines come from its blob's name (nothing read), the folder's
    from its bytes, and they are the same lines; before, the folder's hash was one stream of names and bytes, so the
    same model was scored twice."""
    snap, sha = _blob_layout(tmp_path / "hub", ckpt)
    assert files.hub_blobs(snap) == [(snap / "model.safetensors", sha)]  # named by its blob
    assert files.hub_blobs(ckpt) == []  # hashed from its bytes
    assert (
        files.weights_sha256(ckpt)
        == files.weights_sha256(snap)
        == files.sha256_bytes(f"model.safetensors {sha}\n".encode())
    )
    assert files.identity_sha256(ckpt) == files.identity_sha256(snap)


def test_a_memo_of_the_earlier_weights_hash_is_not_taken(ckpt):
    """A memo written under the first weights hash (names and bytes as one stream) holds another number: its key
    names the version, so it is never found for the lines the hash is now."""
    named = [(f.name, f) for f in files.safetensors_files(ckpt)]
    st = [
        [n, str(p), *(lambda s: (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns))(p.stat())]
        for n, p in named
    ]
    old = cache.memo_path("identity", "", {"files": st})
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text('{"weights_sha256": "' + "1" * 64 + '"}')
    assert files.lookup_weights_hash(named) is None and files.weights_sha256(ckpt) != "1" * 64


def test_a_plain_folder_linking_into_a_nested_blobs_folder_is_identified_by_its_bytes(ckpt, tmp_path):
    """A plain folder whose weights link into some nested models--*/blobs took the blob's name as its weights'
    sha256 unread: a blob holding other bytes under a borrowed name borrowed an identity."""
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in ckpt.iterdir():
        if f.suffix != ".safetensors":
            shutil.copyfile(f, plain / f.name)
    blobs = plain / "nested" / "models--x--y" / "blobs"
    blobs.mkdir(parents=True)
    borrowed = "ab" * 32  # a name claiming any identity
    shutil.copyfile(ckpt / "model.safetensors", blobs / borrowed)
    (plain / "model.safetensors").symlink_to(blobs / borrowed)
    assert files.hub_blob_sha256(plain / "model.safetensors") is None
    assert files.weights_sha256(plain) == files.weights_sha256(ckpt)  # the same bytes as read: the same hash


def test_a_snapshot_linking_into_another_repo_or_through_a_linked_blobs_folder_is_hashed(ckpt, tmp_path):
    """One step, inside the same models--ORG--NAME folder: a blob of another repo's folder, or a blobs folder that
    is itself a link elsewhere, is not the layout the name vouches for."""
    snap, sha = _blob_layout(tmp_path / "hub", ckpt)
    other, _ = _blob_layout(tmp_path / "hub", ckpt, "models--org--other")
    link = other / "model.safetensors"
    link.unlink()
    link.symlink_to(os.path.join("..", "..", "..", "models--org--name", "blobs", sha))  # another repo's blob
    assert link.resolve() == (snap / "model.safetensors").resolve()
    assert files.hub_blob_sha256(link) is None
    moved = snap.parent.parent / "store"  # still inside the repo folder (a link out of it is refused anyway)
    (snap.parent.parent / "blobs").rename(moved)
    (snap.parent.parent / "blobs").symlink_to(moved)
    assert (snap / "model.safetensors").is_file() and files.hub_blob_sha256(snap / "model.safetensors") is None
    assert files.weights_sha256(snap) == files.weights_sha256(ckpt)


def test_a_blob_whose_name_lies_is_named_with_both_hashes(ckpt, tmp_path):
    snap, sha = _blob_layout(tmp_path / "hub", ckpt)
    blob = snap.parent.parent / "blobs" / sha
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    actual = files.sha256_file(blob)
    check = files.BlobCheck([snap, ckpt])  # the plain folder has no blob to check
    assert [name for _, name in check.blobs] == [sha]
    with pytest.raises(files.UsageError) as e:
        check.wait()
    assert str(blob) in str(e.value) and sha in str(e.value) and actual in str(e.value)
    assert files.BlobCheck([ckpt]).blobs == []
