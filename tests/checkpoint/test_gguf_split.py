"""A GGUF split into several files (checkpoint/ggufs.py: read_header's _joined, find, weights_sha256): read as the one
model llama.cpp loads from its first part, every part in its identity, and every set llama.cpp would refuse to load
refused first (exit 2, naming the part, from the headers alone). That llama.cpp loads and refuses the same sets is
checked against the library itself in tests/evaluate/test_llamacpp.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, Keys
from gguf.gguf_writer import SHARD_NAME_FORMAT

from quantize.checkpoint import files, ggufs
from quantize.checkpoint.accounting import bits_report
from quantize.cli import main
from quantize.errors import UsageError
from quantize.io import sha256_bytes, sha256_file

from test_gguf import accounted, llama

SPLIT = Keys.Split


def split_llama(folder: Path, per_file: int = 5) -> list[Path]:
    """test_gguf's llama GGUF written by the gguf package's own writer, at most `per_file` tensors a file: its
    parts, first to last."""
    folder.mkdir(parents=True, exist_ok=True)
    real = GGUFWriter.__init__

    def splitting(self, path, arch, **kw):
        real(self, path, arch, **{**kw, "split_max_tensors": per_file})

    GGUFWriter.__init__ = splitting
    try:
        llama(folder / "m.gguf")
    finally:
        GGUFWriter.__init__ = real
    parts = sorted(folder.glob("m-*-of-*.gguf"))
    assert len(parts) > 1 and not (folder / "m.gguf").exists()
    return parts


def forged(folder: Path, names: list[list[str]], nos=None, counts=None, total=None, name="f") -> list[Path]:
    """Parts written by hand, each holding the F32 tensors `names[i]` and the split keys given (default: what the
    gguf writer would write), named NAME-0000i-of-0000n.gguf in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(names)
    paths = []
    for i, held in enumerate(names):
        path = folder / SHARD_NAME_FORMAT.format(name, i + 1, n)
        w = GGUFWriter(str(path), "llama")
        if (no := (nos or list(range(n)))[i]) is not None:
            w.add_uint16(SPLIT.LLM_KV_SPLIT_NO, no)
        w.add_uint16(SPLIT.LLM_KV_SPLIT_COUNT, (counts or [n] * n)[i])
        if i == 0:
            w.add_int32(SPLIT.LLM_KV_SPLIT_TENSORS_COUNT, sum(map(len, names)) if total is None else total)
        for t in held:
            w.add_tensor(t, np.ones(4, np.float32), raw_dtype=GGMLQuantizationType.F32)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    return paths


def test_a_split_gguf_is_read_as_the_one_model_llama_cpp_loads(tmp_path):
    """Every tensor of every part, accounted as the same model written in one file is, every byte of the parts
    accounted for; a folder of the parts is that checkpoint, found by its first part. Before: the first part
    alone, a third of the model, with nothing said of the rest."""
    whole = bits_report(llama(tmp_path / "whole.gguf"))
    parts = split_llama(tmp_path / "split")
    assert ggufs.find(tmp_path / "split") == parts[0]
    h = ggufs.read_header(parts[0])
    assert h.files == tuple(parts) and h.path == parts[0]
    for r in (bits_report(parts[0]), bits_report(tmp_path / "split")):
        assert r.files == [p.name for p in parts]
        assert (r.total_bytes, r.parameters, r.ggml_types) == (whole.total_bytes, whole.parameters, whole.ggml_types)
        assert r.bytes_by_part == whole.bytes_by_part and r.expert_layers == whole.expert_layers
        assert accounted(r) == r.file_bytes == sum(p.stat().st_size for p in parts)


def test_every_part_is_in_a_split_ggufs_identity(tmp_path):
    """The weights hash is the line "NAME SHA256" of each part, in load order (one file: its one line, as before, so
    scores cached for a single GGUF keep their key); a byte changed in the last part changes it. Before: the first
    part alone was hashed, so a NaN in a later part kept the clean model's cached scores (and a gate's PASS)."""
    folder = tmp_path / "split"
    parts = split_llama(folder)
    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in parts)
    assert ggufs.weights_sha256(folder) == ggufs.weights_sha256(parts[0]) == sha256_bytes(lines.encode())
    assert files.weights_sha256(folder) == ggufs.weights_sha256(folder)
    before = files.identity_sha256(folder)
    with parts[-1].open("r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    assert files.identity_sha256(folder) != before
    (tmp_path / "one").mkdir()
    one = llama(tmp_path / "one" / "m.gguf")
    assert ggufs.weights_sha256(one) == sha256_bytes(f"m.gguf {sha256_file(one)}\n".encode())


def _first_missing(folder: Path) -> Path:
    split_llama(folder)[0].unlink()
    return folder


def _later_part_named(folder: Path) -> Path:
    return split_llama(folder)[1]


def _part_missing(folder: Path) -> Path:
    parts = split_llama(folder)
    parts[-1].unlink()
    return folder


def _first_renamed(folder: Path) -> Path:
    parts = split_llama(folder)
    return parts[0].rename(folder / "model.gguf")


def _parts_swapped(folder: Path) -> Path:
    parts = split_llama(folder)
    parts[2].replace(parts[1])  # the third part under the second's name
    return parts[0]


def _count_disagrees(folder: Path) -> Path:
    return forged(folder, [["a.weight"], ["b.weight"]], counts=[2, 3])[0]


def _twice(folder: Path) -> Path:
    return forged(folder, [["a.weight", "b.weight"], ["b.weight"]])[0]


def _tensor_count(folder: Path) -> Path:
    return forged(folder, [["a.weight"], ["b.weight"]], total=3)[0]


def _no_index(folder: Path) -> Path:
    return forged(folder, [["a.weight"], ["b.weight"]], nos=[None, 1])[0]


def _fifo(folder: Path) -> Path:
    parts = split_llama(folder)
    parts[1].unlink()
    os.mkfifo(parts[1])
    return parts[0]


def _linked_outside(folder: Path) -> Path:
    parts = split_llama(folder)
    outside = folder.parent / "elsewhere.gguf"
    parts[1].rename(outside)
    parts[1].symlink_to(outside)
    return folder


REFUSED = {
    "a later part named": (_later_part_named, "is part 2 of a GGUF split into 3 files"),
    "a part missing": (_part_missing, "part 3, m-00003-of-00003.gguf, is not beside it"),
    "the first part missing": (_first_missing, "not its first part, m-00001-of-00003.gguf"),
    "the first part renamed": (_first_renamed, "its name does not end in '-00001-of-00003.gguf'"),
    "a part under another's name": (_parts_swapped, "header says split.no 2 and split.count 3 (expected 1 and 3)"),
    "a part's count disagrees": (_count_disagrees, "header says split.no 1 and split.count 3 (expected 1 and 2)"),
    "a tensor in two parts": (_twice, "tensor 'b.weight' is in both f-00001-of-00002.gguf and f-00002-of-00002"),
    "the declared tensor count": (_tensor_count, "split.tensors.count is 3, but its 2 parts hold 2 tensors"),
    "no index in the first part": (_no_index, "declares split.count 2 and split.no None"),
    "a part that is a FIFO": (_fifo, "is not a regular file"),
    "a part linked outside the folder": (_linked_outside, "links outside the checkpoint folder"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_split_llama_cpp_would_not_load_is_exit_2_naming_the_part(tmp_path, capsys, monkeypatch, case):
    monkeypatch.delenv(ggufs.ALLOW_SYMLINKS, raising=False)
    make, says = REFUSED[case]
    path = make(tmp_path / "m")
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    with pytest.raises(UsageError):  # and so for every stage's identity (eval, gate, agree)
        files.identity_sha256(path)


def test_a_folder_holds_one_split_gguf_and_nothing_else(tmp_path, capsys):
    """The parts of one split GGUF make a folder one checkpoint; another GGUF beside them, or the parts of two, is
    several models, refused naming them."""
    folder = tmp_path / "m"
    split_llama(folder)
    llama(folder / "other.gguf")
    assert main(["inspect", str(folder)]) == 2
    assert "4 GGUF files" in capsys.readouterr().err
    (folder / "other.gguf").unlink()
    forged(folder, [["a.weight"], ["b.weight"]])
    with pytest.raises(UsageError, match="5 GGUF files"):
        ggufs.find(folder)
