"""Every file a user names on the command line is read the one safe way (quantize/io.py): a FIFO, a device, a
folder, a file over its kind's cap or bytes that are not UTF-8 are exit 2 naming the file, fast, never a hang, an
out-of-memory or a traceback. Run as subprocesses under a deadline and a memory limit, so that a reader that
blocks on a FIFO or reads /dev/zero fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from conftest import ROOT

DEADLINE_S = 60  # a hang is what is tested; a run that answers takes about a second
MEMORY = 3 * 2**30  # /dev/zero read whole would pass this in a few seconds


def cli(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    # the repository first, then whatever path the run already has (packages installed beside, not in, the venv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.run(
            [sys.executable, "-m", "quantize.cli", *argv],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            preexec_fn=limit,
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"quantize {' '.join(argv)} did not answer in {DEADLINE_S} s (it blocked reading)")


def refused(proc: subprocess.CompletedProcess, *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for e in expected:
        assert e in proc.stderr, proc.stderr


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return path


def test_golden_new_from_a_fifo_is_refused(tmp_path, fifo):
    refused(
        cli("golden", "new", str(tmp_path / "faq" / "v1"), "--from", str(fifo), "--type", "multiple_choice"),
        "--from",
        "not a regular file",
    )
    assert not (tmp_path / "faq").exists()


def test_golden_new_from_dev_zero_is_refused(tmp_path):
    refused(
        cli("golden", "new", str(tmp_path / "faq" / "v1"), "--from", "/dev/zero", "--type", "perplexity"),
        "/dev/zero",
        "not a regular file",
    )


def test_card_verdict_from_a_fifo_or_dev_zero_is_refused(tmp_path, fifo):
    for source in (str(fifo), "/dev/zero"):
        refused(cli("card", str(tmp_path), "--verdict", source), "gate verdict", source, "not a regular file")


def test_a_verdict_over_its_cap_is_refused_before_reading(tmp_path):
    big = tmp_path / "verdict.json"
    with big.open("wb") as fh:
        fh.truncate(2**30)  # sparse: a gigabyte on paper, nothing on disk
    refused(cli("card", str(tmp_path), "--verdict", str(big)), "1,073,741,824 bytes; at most 67,108,864")


def test_a_sweep_file_that_is_a_fifo_is_refused(fifo):
    refused(cli("sweep", str(fifo)), "sweep file", "not a regular file")


def test_golden_verify_with_a_fifo_manifest_is_refused(tmp_path):
    root = tmp_path / "set" / "v1"
    root.mkdir(parents=True)
    os.mkfifo(root / "MANIFEST.json")
    refused(cli("golden", "verify", str(root)), "golden-set manifest", "not a regular file")


def test_a_checkpoint_config_over_its_cap_is_refused_before_reading(tmp_path):
    from quantize.checkpoint.files import read_config
    from quantize.errors import UsageError

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with (ckpt / "config.json").open("wb") as fh:
        fh.truncate(2**30)
    with pytest.raises(UsageError, match=r"config.json is 1,073,741,824 bytes; at most 67,108,864"):
        read_config(ckpt)


def test_golden_new_names_a_bad_byte_by_line_and_column(tmp_path):
    src = tmp_path / "items.jsonl"
    src.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff byte"}\n')
    refused(
        cli("golden", "new", str(tmp_path / "faq" / "v1"), "--from", str(src), "--type", "perplexity"),
        "line 2 is not UTF-8 text: byte 0xff at column 15",
    )


def test_a_calibration_jsonl_is_read_line_by_line(tmp_path):
    """The reader the conversion uses: strict UTF-8 by line, a FIFO refused (it was read whole, or blocked)."""
    from quantize.convert.calibration import read_documents
    from quantize.errors import UsageError

    good = tmp_path / "cal.jsonl"
    good.write_text(json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert read_documents(str(good)) == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "one"}\n{"text": "\xc3("}\n')
    with pytest.raises(UsageError, match="line 2 is not UTF-8"):
        read_documents(str(bad))
