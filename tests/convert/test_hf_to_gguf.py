"""A gguf recipe whose `model:` is a safetensors checkpoint: llama.cpp's own converter writes its 16-bit GGUF first
(convert/hf_to_gguf.py). The staging of what the converter reads needs nothing; the conversions need llama-cpp-python
with the converter unpacked beside it (`make gguf-env`) and the default model's GGUF (SmolLM2's vocabulary, rebuilt
as SmolLM2's own tokenizer files: tests/gguf_models.smollm2_tokenizer_files), and are skipped without them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from quantize import records
from quantize.checkpoint.files import SAFE_INDEX, identity_files, identity_view
from quantize.cli import main
from quantize.compat import llama_cpp as compat
from quantize.convert import hf_to_gguf
from quantize.records import RunRecord

from conftest import make_tiny_llama

SMOLLM2_VOCAB = 49152


def recipe(tmp_path: Path, model: Path, type_name: str, **more) -> Path:
    p = tmp_path / f"{type_name}.yaml"
    p.write_text(
        yaml.safe_dump({"method": "gguf", "type": type_name, "model": str(model), "output": str(tmp_path / "out")})
    )
    if more:
        p.write_text(yaml.safe_dump(yaml.safe_load(p.read_text()) | more))
    return p


def with_smollm2_tokenizer(folder: Path, vocabulary: Path) -> Path:
    from gguf_models import smollm2_tokenizer_files

    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            f.unlink()
    return smollm2_tokenizer_files(vocabulary, folder)


# --- what the converter reads: no converter needed ----------------------------------------------------------------


def test_the_converter_sees_exactly_what_the_identity_covers(tmp_path):
    src = make_tiny_llama(tmp_path / "sharded")
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, src / shard, metadata={"format": "pt"})
    (src / SAFE_INDEX).write_text(json.dumps({"weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    (src / "notes.txt").write_text("read by no loader")
    (src / "model-stray.gguf").write_text("x")
    staged = identity_view(src, tmp_path / "staged")
    expected = {*identity_files(src), SAFE_INDEX, *shards}
    assert {p.name for p in staged.iterdir()} == expected
    assert all((staged / n).is_symlink() and (staged / n).resolve() == (src / n).resolve() for n in expected)

    single = make_tiny_llama(tmp_path / "single")
    staged = identity_view(single, tmp_path / "staged-single")
    assert (staged / "model.safetensors").resolve() == (single / "model.safetensors").resolve()
    assert {p.name for p in staged.iterdir()} == {*identity_files(single), "model.safetensors"}


def test_the_converters_child_runs_no_code_of_the_checkpoint(tmp_path):
    """llama.cpp's converter loads several families' tokenizers with trust_remote_code=True: a tokenizer_config.json
    whose auto_map names the folder's own module would run it. The child holds every such load to False. The
    control (transformers as the converter calls it) runs the module, so the fixture would catch a hold that fails."""
    import os
    import sys

    folder = make_tiny_llama(tmp_path / "remote")
    ran = tmp_path / "ran"
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(
        f"open({str(ran)!r}, 'w').write('ran')\nfrom transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
    )
    load = f"transformers.AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    held = "import transformers; from quantize.convert.hf_to_gguf import _no_remote_code; "
    held += f"_no_remote_code(transformers.AutoTokenizer); {load}"
    subprocess.run([sys.executable, "-c", held], env=env, check=True, capture_output=True)
    assert not ran.exists()
    subprocess.run([sys.executable, "-c", f"import transformers; {load}"], env=env, check=True, capture_output=True)
    assert ran.exists()


# --- llama.cpp's converter ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converter():
    pytest.importorskip("llama_cpp")
    if found := compat.converter_problems():
        pytest.skip(f"llama.cpp's converter is not usable here ({'; '.join(found)}): `make gguf-env`")


@pytest.fixture(scope="module")
def checkpoint(converter, smollm2, tmp_path_factory) -> Path:
    """A 2-layer Llama in bfloat16 with SmolLM2's tokenizer files."""
    folder = make_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-smollm2", vocab_size=SMOLLM2_VOCAB)
    return with_smollm2_tokenizer(folder, smollm2)


def test_a_checkpoint_becomes_a_gguf_that_computes_as_transformers_does(checkpoint, smollm2, tmp_path, capsys):
    import llama_cpp
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    assert main(["run", str(recipe(tmp_path, checkpoint, "BF16")), "--quiet"]) == 0, capsys.readouterr().err
    record = records.read(RunRecord, tmp_path / "out" / "quantize.json")
    g = record.engine.gguf
    assert g.source_file_type == "safetensors" and g.intermediate == "MOSTLY_BF16"
    assert "convert_hf_to_gguf.py" in g.converter and "0.3.36" in g.converter
    assert record.source_model.path == str(checkpoint)
    written, original = (GGUFReader(p).fields for p in (tmp_path / "out" / "model.gguf", smollm2))
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        assert written[key].contents() == original[key].contents(), key

    ids = [1, 17, 500, 1234, 40000, 77, 9000, 2, 31]
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(str(tmp_path / "out" / "model.gguf"), logits_all=True, n_ctx=64, verbose=False)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)])
    finally:
        llm.close()
    # bfloat16 weights in both; llama.cpp rounds activations for its bf16 products: 0.0036 of logits up to 1.4 seen
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_the_converters_peak_memory_is_the_runs_where_higher(checkpoint, tmp_path):
    peak = hf_to_gguf.write(checkpoint, tmp_path / "x.gguf", tmp_path)
    assert peak > 100 * 2**20  # a Python process that imported torch and transformers
    (tmp_path / "x.gguf").unlink()
    assert "peak resident bytes" in (tmp_path / "converter.log").read_text()


def test_an_importance_matrix_is_computed_on_the_converted_gguf(checkpoint, tmp_path, capsys):
    r = recipe(tmp_path, checkpoint, "Q4_K_M", calibration={"samples": 4, "seq_len": 64})
    assert main(["run", str(r), "--quiet"]) == 0, capsys.readouterr().err
    g = records.read(RunRecord, tmp_path / "out" / "quantize.json").engine.gguf
    assert g.imatrix is not None and g.imatrix.computed_on == "the converted MOSTLY_BF16 GGUF"
    assert g.imatrix.tokens == 4 * 64 and g.source_file_type == "safetensors"


@pytest.mark.parametrize(
    "case,says",
    [
        ("word-level tokenizer", "BPE pre-tokenizer was not recognized"),
        ("unknown architecture", "Model FooForCausalLM is not supported"),
    ],
)
def test_what_the_converter_cannot_write_is_exit_2_before_a_weight_is_read(converter, tmp_path, capsys, case, says):
    folder = make_tiny_llama(tmp_path / "hf")  # the tests' word-level tokenizer, which llama.cpp does not know
    if case == "unknown architecture":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"architectures": ["FooForCausalLM"]}))
    assert main(["run", str(recipe(tmp_path, folder, "Q8_0"))]) == 2
    err = capsys.readouterr().err
    assert says in err and "convert_hf_to_gguf.py" in err and "Traceback" not in err
    assert "run: convert-hf" not in err and not (tmp_path / "out").exists()


def test_a_vocabulary_llama_cpp_aborts_on_is_exit_2_naming_the_gguf_to_use(converter, default_folder, tmp_path, capsys):
    # the prepared default folder's tokenizer.json is transformers' GGUF loader's: the converter writes it as a
    # SentencePiece vocabulary with no byte tokens, on which llama.cpp's tokenizer aborts
    assert main(["run", str(recipe(tmp_path, default_folder, "Q8_0"))]) == 2
    err = capsys.readouterr().err
    assert "SIGABRT" in err and "set `model:` to the GGUF it came from" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_changed_while_the_converter_read_it_is_refused(checkpoint, tmp_path, monkeypatch, capsys):
    import shutil

    folder = tmp_path / "moving"
    shutil.copytree(checkpoint, folder)
    run = subprocess.run

    def and_then_rewrite(*args, **kwargs):
        done = run(*args, **kwargs)
        (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}))
        return done

    monkeypatch.setattr(hf_to_gguf.subprocess, "run", and_then_rewrite)
    assert main(["run", str(recipe(tmp_path, folder, "Q8_0"))]) == 2
    err = capsys.readouterr().err
    assert "changed while it was being read" in err and not (tmp_path / "out").exists()


def test_the_converters_guard_names_what_is_missing_or_of_another_version(converter, tmp_path, monkeypatch):
    monkeypatch.setattr(compat, "converter_home", lambda: tmp_path / "llama.cpp")
    assert "is not unpacked in" in compat.converter_problems()[0]
    home = tmp_path / "llama.cpp"
    for d in ("conversion", "gguf-py/gguf"):
        (home / d).mkdir(parents=True)
    (home / compat.CONVERTER).write_text('parser.add_argument("--vocab-only")\n')
    (home / compat.CONVERTER_STAMP).write_text("0.3.35\n")
    found = " | ".join(compat.converter_problems())
    assert "came from llama-cpp-python 0.3.35" in found and "outside the checked range" in found
    assert "has no --outtype option" in found and "has no --outfile option" in found
    # a module the converter imports, missing (sentencepiece: Llama's set_vocab imports it before trying BPE)
    monkeypatch.setattr(compat, "CONVERTER_IMPORTS", ("sentencepiece", "no_such_module_here"))
    assert "no_such_module_here, which convert_hf_to_gguf.py imports, is not installed" in compat.converter_problems()
