"""The one way to read a file a user names (quantize/io.read_user_file): regular files only, size-capped, links
refused where asked, strict UTF-8 with the bad byte's line and column."""

import json
import os

import pytest

from quantize.errors import UsageError
from quantize.io import decode_text, read_user_file, read_user_text

from conftest import ROOT


def test_a_regular_file_is_read_whole(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_bytes(b"x: 1\n")
    assert read_user_file(f, "recipe file", 100) == b"x: 1\n"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        read_user_file(fifo, "recipe file", 100)


def test_a_device_that_never_ends_is_refused():
    with pytest.raises(UsageError, match="not a regular file"):
        read_user_file("/dev/zero", "verdict file", 100)


def test_a_folder_and_a_missing_file_are_refused(tmp_path):
    with pytest.raises(UsageError, match="folder"):
        read_user_file(tmp_path, "policy file", 100)
    with pytest.raises(UsageError, match="does not exist"):
        read_user_file(tmp_path / "nope", "policy file", 100)


def test_the_size_cap_holds_before_reading(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"a" * 101)
    with pytest.raises(UsageError, match="101 bytes; at most 100"):
        read_user_file(f, "suite file", 100)
    assert read_user_file(f, "suite file", 101) == b"a" * 101


def test_a_link_is_followed_only_where_allowed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"HF_TOKEN=hf_x")
    link = tmp_path / "README.md"
    link.symlink_to(secret)
    assert read_user_file(link, "card", 100) == b"HF_TOKEN=hf_x"
    with pytest.raises(UsageError, match="symbolic link"):
        read_user_file(link, "card", 100, follow_links=False)


def test_strict_decoding_names_line_and_column():
    with pytest.raises(UsageError, match=r"line 2, column 3"):
        decode_text(b"ok\nab\xffc\n", "golden items")
    with pytest.raises(UsageError, match="not UTF-8"):
        decode_text("\ud800".encode("utf-8", "surrogatepass"), "recipe")
    assert decode_text("é\n".encode(), "x") == "é\n"


def test_read_user_text_decodes(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"\xc3")
    with pytest.raises(UsageError, match="t.txt is not UTF-8"):
        read_user_text(f, "calibration file", 10)


def test_user_lines_hash_count_and_bound_each_line(tmp_path):
    from quantize.io import sha256_file, sha256_user_file, user_lines

    f = tmp_path / "items.jsonl"
    f.write_bytes(b'{"a": 1}\n\n{"b": 2}')  # an empty line, and a last line without its newline
    with user_lines(f, "golden data file", 100, 10) as lines:
        assert list(lines) == [(1, b'{"a": 1}'), (2, b""), (3, b'{"b": 2}')]
    assert lines.newlines == 2 and lines.hexdigest() == sha256_file(f) == sha256_user_file(f, "x", 100)
    f.write_bytes(b"short\n" + b"x" * 11 + b"\n")
    with pytest.raises(UsageError, match="line 2 is over the 10-byte limit"), user_lines(f, "items", 100, 10) as lines:
        list(lines)
    with pytest.raises(UsageError, match="18 bytes; at most 8"), user_lines(f, "items", 8, 100) as lines:
        list(lines)


def test_a_large_line_is_read_in_pieces(tmp_path):
    """A line over the 64 KiB pieces `UserLines` reads comes back whole, and the hash covers every piece."""
    from quantize.io import sha256_file, user_lines

    f = tmp_path / "long.jsonl"
    f.write_bytes(b"a" * 200_000 + b"\nb\n")
    with user_lines(f, "items", 10**6, 300_000) as lines:
        assert [len(body) for _, body in lines] == [200_000, 1]
    assert lines.hexdigest() == sha256_file(f)


def test_a_fifo_is_never_hashed(tmp_path):
    from quantize.io import sha256_user_file

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UsageError, match="not a regular file"):
        sha256_user_file(tmp_path / "pipe", "golden source file", 100)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-16-le"])
def test_json_a_user_names_is_utf_8_or_refused(tmp_path, encoding):
    """json.loads(bytes) detects UTF-16 and UTF-32 itself: a verdict re-encoded was published by `card`, a
    manifest re-encoded verified, while the tools that read the same files as text (transformers' config.json
    reader, the Hub) read UTF-8 (a review)."""
    import shutil

    from quantize import records
    from quantize.checkpoint.files import read_json_object
    from quantize.golden.manifest import verify
    from quantize.records import Verdict

    f = tmp_path / "x.json"
    f.write_bytes(json.dumps({"a": 1}).encode(encoding))
    with pytest.raises(UsageError, match="not valid JSON"):
        read_json_object(f, "re-save it")
    with pytest.raises(UsageError, match="not valid JSON"):
        records.read(Verdict, f)
    root = tmp_path / "core" / "v1"
    shutil.copytree(ROOT / "golden" / "core" / "v1", root)
    manifest = root / "MANIFEST.json"
    manifest.write_bytes(manifest.read_text(encoding="utf-8").encode(encoding))
    with pytest.raises(UsageError, match="not JSON"):
        verify(root)


def test_the_cache_folder_is_absolute_whatever_quantize_cache_says(tmp_path, monkeypatch, capsys):
    """A relative QUANTIZE_CACHE (or a `~` a quoted value keeps) named another folder from every working folder, and
    `quantize model path` printed it as given (a review)."""
    from pathlib import Path

    from quantize.cache import cache_dir
    from quantize.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTIZE_CACHE", "rel/cache")
    assert cache_dir() == tmp_path / "rel" / "cache"
    assert main(["model", "path"]) == 0
    assert Path(capsys.readouterr().out.strip()).is_absolute()
    monkeypatch.setenv("QUANTIZE_CACHE", "~/qc")
    assert cache_dir() == Path.home() / "qc"
    monkeypatch.setenv("QUANTIZE_CACHE", "~no-such-user-here/qc")
    with pytest.raises(UsageError, match="QUANTIZE_CACHE = .*names no home folder"):
        cache_dir()
