"""The identity covers what loads: the weight files are the ones transformers resolves (a model.safetensors beside
an index, several unindexed files, `transformers_weights`, special files and PEFT adapters are refused before
anything reads them), every tokenizer file a transformers tokenizer class reads is hashed, and a load is held to the
identity it was filed under (check_identity: a rename between the hash and the load is caught)."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from quantize.checkpoint import files
from quantize.errors import UsageError

from conftest import nan_copy


@pytest.fixture
def ckpt(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    files._sha256_of_files.cache_clear()
    yield shutil.copytree(tiny_model, tmp_path / "ckpt")
    files._sha256_of_files.cache_clear()


def indexed(ckpt: Path) -> Path:
    """The checkpoint re-laid as one shard and its index (what save_pretrained writes for a sharded model)."""
    from safetensors import safe_open

    shard = "model-00001-of-00001.safetensors"
    (ckpt / "model.safetensors").rename(ckpt / shard)
    with safe_open(str(ckpt / shard), "pt") as st:
        names = list(st.keys())
    (ckpt / files.SAFE_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(names, shard)}))
    return ckpt


def test_a_single_file_beside_an_index_is_refused_naming_both(ckpt):
    """Route 1 of the fifth round: clean shards and their index, plus a NaN model.safetensors. transformers loads
    model.safetensors, the identity hashed the index's shards: a NaN candidate was served the clean folder's
    cached scores."""
    indexed(ckpt)
    clean = files.identity_sha256(ckpt)
    nan_copy(ckpt / "model-00001-of-00001.safetensors", ckpt / "model.safetensors")
    with pytest.raises(UsageError, match=r"both model\.safetensors and model\.safetensors\.index\.json") as e:
        files.identity_sha256(ckpt)
    assert "Keep one layout" in str(e.value)
    (ckpt / "model.safetensors").unlink()
    assert files.identity_sha256(ckpt) == clean


def test_an_index_naming_the_single_file_alone_is_one_model(ckpt):
    """model_free_ptq writes an index beside a single model.safetensors that names it alone: every loader reads
    that one file, so nothing is ambiguous."""
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as st:
        names = list(st.keys())
    before = files.identity_sha256(ckpt)
    (ckpt / files.SAFE_INDEX).write_text(json.dumps({"weight_map": dict.fromkeys(names, "model.safetensors")}))
    assert files.safetensors_files(ckpt) == [ckpt / "model.safetensors"]
    assert files.identity_sha256(ckpt) == before


def test_a_model_file_linking_outside_is_refused_also_beside_an_index(ckpt, tmp_path):
    indexed(ckpt)
    outside = nan_copy(ckpt / "model-00001-of-00001.safetensors", tmp_path / "elsewhere.safetensors")
    (ckpt / "model.safetensors").symlink_to(outside)
    with pytest.raises(UsageError, match="both model.safetensors"):
        files.safetensors_files(ckpt)
    (ckpt / files.SAFE_INDEX).unlink()
    (ckpt / "model-00001-of-00001.safetensors").unlink()
    with pytest.raises(UsageError, match="links outside the checkpoint folder"):
        files.safetensors_files(ckpt)


def test_a_stray_file_beside_an_index_is_read_by_no_loader_and_not_hashed(ckpt):
    """With an index, transformers and vLLM both follow it: a stray .safetensors is not loaded, so it is not part
    of the identity either (a Mistral snapshot's consolidated.safetensors)."""
    indexed(ckpt)
    before = files.identity_sha256(ckpt)
    nan_copy(ckpt / "model-00001-of-00001.safetensors", ckpt / "consolidated.safetensors")
    assert files.safetensors_files(ckpt) == [ckpt / "model-00001-of-00001.safetensors"]
    assert files.identity_sha256(ckpt) == before


def test_several_unindexed_files_are_refused_and_a_lone_other_name_is_the_weights(ckpt):
    nan_copy(ckpt / "model.safetensors", ckpt / "extra.safetensors")
    with pytest.raises(UsageError, match=r"2 \.safetensors files and no model\.safetensors\.index\.json"):
        files.identity_sha256(ckpt)
    (ckpt / "model.safetensors").unlink()
    assert files.safetensors_files(ckpt) == [ckpt / "extra.safetensors"]  # loaded as model.safetensors (the view)


def test_transformers_weights_naming_another_file_is_refused(ckpt):
    """config.json's transformers_weights makes transformers load the file it names instead of model.safetensors."""
    cfg = files.read_config(ckpt)
    files.write_config(ckpt, {**cfg, "transformers_weights": "other.safetensors"})
    with pytest.raises(UsageError, match="transformers_weights to 'other.safetensors'"):
        files.identity_sha256(ckpt)
    files.write_config(ckpt, {**cfg, "transformers_weights": "model.safetensors"})  # what it loads anyway
    assert files.safetensors_files(ckpt) == [ckpt / "model.safetensors"]


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json", "tokenizer.json"])
def test_a_fifo_where_a_loaded_file_belongs_is_refused_at_once(ckpt, name):
    """A FIFO is never opened (opening it blocks until a writer comes): refused by its kind, in milliseconds."""
    (ckpt / name).unlink(missing_ok=True)
    os.mkfifo(ckpt / name)
    done: list[BaseException] = []

    def identify() -> None:
        try:
            files.identity_sha256(ckpt)
        except BaseException as e:  # handed to the test's thread
            done.append(e)

    t = threading.Thread(target=identify, daemon=True)
    t0 = time.perf_counter()
    t.start()
    t.join(5)
    assert not t.is_alive(), f"identifying a folder with a FIFO {name} blocked"
    assert time.perf_counter() - t0 < 2
    assert isinstance(done[0], UsageError) and "not a regular file" in str(done[0]) and name in str(done[0])


def test_a_peft_adapter_is_refused(ckpt):
    """Route 3: peft (installed with lm-eval) applies an adapter in the folder at load; lora_alpha 1 and 1e6 had one
    identity and one set of scores."""
    (ckpt / files.ADAPTER_CONFIG).write_text(json.dumps({"peft_type": "LORA", "lora_alpha": 1e6, "r": 2}))
    with pytest.raises(UsageError, match="PEFT adapter") as e:
        files.identity_sha256(ckpt)
    assert "merge_and_unload" in str(e.value)
    with pytest.raises(UsageError, match="PEFT adapter"):
        files.check_model_dir(ckpt)


def test_other_tokenizer_files_named_chat_templates_and_remote_code_are_part_of_the_identity(ckpt):
    before = files.identity_sha256(ckpt)
    (ckpt / "spiece.model").write_bytes(b"a sentencepiece model")
    with_spiece = files.identity_sha256(ckpt)
    assert with_spiece != before
    (ckpt / files.CHAT_TEMPLATES).mkdir()
    (ckpt / files.CHAT_TEMPLATES / "tool_use.jinja").write_text("{{ messages }}")
    with_template = files.identity_sha256(ckpt)
    assert with_template != with_spiece
    (ckpt / "modeling_custom.py").write_text("# what config.json's auto_map runs under --trust-remote-code\n")
    assert files.identity_sha256(ckpt) != with_template


def test_every_file_a_transformers_tokenizer_class_reads_is_in_the_identity():
    """IDENTITY_FILES against the library that owns the names: every value of VOCAB_FILES_NAMES in transformers'
    tokenizer modules (a new tokenizer file name in a later transformers fails here, loudly)."""
    import transformers

    root = Path(transformers.__file__).parent / "models"
    names: set[str] = set()
    for module in root.glob("*/tokenization_*.py"):
        for block in re.findall(r"VOCAB_FILES_NAMES\s*=\s*\{([^}]*)\}", module.read_text(encoding="utf-8")):
            names |= set(re.findall(r":\s*\"([^\"]+)\"", block))
    assert len(names) > 10, "transformers' tokenizer modules were not found where they used to be"
    assert sorted(names - set(files.IDENTITY_FILES)) == []


def test_a_load_after_a_rename_is_refused(ckpt, tmp_path):
    """Route 2: the weights replaced (one rename) after they were hashed and before the load. The identity taken
    again afterwards sees the new inode and ctime, hashes the new bytes and refuses."""
    identity = files.identity_sha256(ckpt)
    files.check_identity(ckpt, identity)  # unchanged: holds
    nan = nan_copy(ckpt / "model.safetensors", tmp_path / "nan.safetensors")
    os.utime(nan, ns=((st := (ckpt / "model.safetensors").stat()).st_atime_ns, st.st_mtime_ns))
    nan.rename(ckpt / "model.safetensors")
    with pytest.raises(UsageError, match="changed while it was being read") as e:
        files.check_identity(ckpt, identity)
    assert identity[:16] in str(e.value)


def _renamed_aside_and_back(ckpt: Path, tmp_path: Path) -> None:
    """Clean weights loaded in the NaN file's place and the NaN file put back: the same inode and bytes."""
    nan = ckpt / "model.safetensors"
    nan.rename(tmp_path / "aside")
    shutil.copyfile(tmp_path / "clean.safetensors", nan)
    nan.unlink()
    (tmp_path / "aside").rename(nan)


def _written_and_restored(ckpt: Path, tmp_path: Path) -> None:
    """The weights written in place and their bytes, atime and mtime put back: only the ctime moved."""
    f = ckpt / "model.safetensors"
    st, was = f.stat(), f.read_bytes()
    with f.open("r+b") as fh:
        fh.write(b"\xff" * 64)
    f.write_bytes(was)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def _config_rewritten(ckpt: Path, tmp_path: Path) -> None:
    """config.json written again with the bytes it had (a file besides the weights)."""
    (ckpt / "config.json").write_bytes((ckpt / "config.json").read_bytes())


@pytest.mark.parametrize("change", [_renamed_aside_and_back, _written_and_restored, _config_rewritten])
def test_a_file_changed_and_put_back_is_refused_though_it_hashes_the_same(ckpt, tmp_path, change):
    """A review's wrong pass: NaN weights hashed, clean ones renamed in for the load and the NaN file put back (or a
    file written in place and restored): the identity taken again was the same, so the check passed and the clean
    evidence was filed under the NaN identity. The check holds each file to the stat keys the identity was taken
    with, names the file, and does not hash again to excuse it; refused once, the identity is taken afresh."""
    shutil.copyfile(ckpt / "model.safetensors", tmp_path / "clean.safetensors")
    nan_copy(tmp_path / "clean.safetensors", ckpt / "model.safetensors")
    identity = files.identity_sha256(ckpt)
    files.check_identity(ckpt, identity)  # unchanged: holds
    changed = "config.json" if change is _config_rewritten else "model.safetensors"
    time.sleep(0.02)  # past the kernel's coarse timestamp tick since the files were written
    change(ckpt, tmp_path)
    assert files.identity_sha256(ckpt) == identity  # the bytes are the ones hashed: a hash cannot tell
    with pytest.raises(UsageError, match="changed while it was being read") as e:
        files.check_identity(ckpt, identity)
    assert f"{ckpt / changed} was replaced or written" in str(e.value) and identity[:16] in str(e.value)
    files.check_identity(ckpt, files.identity_sha256(ckpt))  # a run after the writing stopped: held afresh


def test_each_api_call_holds_the_identities_it_takes_and_the_next_starts_afresh(ckpt, tmp_path):
    """A review (r5, session 44): a process calling the API in a loop (run, gate, run again with force into the
    same folder, which writes the same bytes, gate) had its second gate refused: the files' stat keys were held
    from the first call for the life of the process. Each call holds what it takes (a change inside one call is
    still refused, a call nested in it keeps its table); the next call starts afresh."""
    from quantize.api import _boundary

    f = ckpt / "model.safetensors"
    with _boundary():
        identity = files.identity_sha256(ckpt)
        files.check_identity(ckpt, identity)
    time.sleep(0.02)
    _written_and_restored(ckpt, tmp_path)  # between two calls: a run with force writing the same bytes
    with _boundary():
        files.check_identity(ckpt, files.identity_sha256(ckpt))  # the next call: held to the files as it finds them
        time.sleep(0.02)
        with _boundary():  # a call nested in this one
            os.chmod(f, 0o444)
        with pytest.raises(UsageError, match="changed while it was being read"):
            files.check_identity(ckpt, identity)


def test_a_hub_link_pointed_elsewhere_and_back_is_refused(tmp_path, tiny_model, monkeypatch):
    """A Hub snapshot's weights are identified by their blob's name through a link: the link pointed at another
    blob for the load and back moves the link's own stat keys, not the blob's."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "rev"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in tiny_model.iterdir():
        if f.is_file():
            blob = repo / "blobs" / files.sha256_file(f)
            shutil.copyfile(f, blob)
            (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    other = repo / "blobs" / ("0" * 64)
    nan_copy(tiny_model / "model.safetensors", other)
    identity = files.identity_sha256(snap)
    assert files.hub_blobs(snap)  # identified by the blob's name
    files.check_identity(snap, identity)
    link = snap / "model.safetensors"
    target = os.readlink(link)
    time.sleep(0.02)
    link.unlink()
    link.symlink_to(os.path.relpath(other, snap))
    link.unlink()
    link.symlink_to(target)
    assert files.identity_sha256(snap) == identity
    with pytest.raises(UsageError, match=f"{re.escape(str(link))} was replaced or written"):
        files.check_identity(snap, identity)


def test_an_unchanged_check_reads_no_weight_byte(ckpt, monkeypatch):
    identity = files.identity_sha256(ckpt)
    read = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: read.append(Path(p).name) or real(p))
    files.check_identity(ckpt, identity)
    assert "model.safetensors" not in read and "tokenizer.json" in read


# --- files transformers reads in another file's place, or finds by a pattern ------------------------------------


@pytest.mark.parametrize(
    ("name", "key", "other"),
    [
        ("config.json", "configuration_files", "config.4.0.0.json"),
        ("tokenizer_config.json", "fast_tokenizer_files", "tokenizer.4.0.0.json"),
    ],
)
def test_a_config_that_makes_transformers_read_another_file_is_refused(ckpt, name, key, other):
    """config.json's `configuration_files` has transformers load config.VERSION.json in its place, and
    tokenizer_config.json's `fast_tokenizer_files` tokenizer.VERSION.json in tokenizer.json's: a file the identity
    did not hash (the reviewer's repro: rms_norm_eps 0.5 from the versioned config, logits 37.35 against 1.14, one
    identity). Refused on every stage's identity and before any load; listing only the file itself is harmless."""
    path = ckpt / name
    data = json.loads(path.read_text())
    own = "config.json" if name == "config.json" else "tokenizer.json"
    path.write_text(json.dumps({**data, key: [own, other]}))
    (ckpt / other).write_text(path.read_text() if name == "config.json" else "{}")
    for check in (files.identity_sha256, files.check_model_dir):
        with pytest.raises(UsageError, match=f"lists {key}") as e:
            check(ckpt)
        assert other in str(e.value)
    path.write_text(json.dumps({**data, key: [own]}))
    files.check_model_dir(ckpt)


def test_a_tokenizer_config_naming_a_file_outside_the_identity_is_refused(ckpt, tmp_path, monkeypatch):
    """tokenizer_config.json's `vocab_file` for a class that does not list it in VOCAB_FILES_NAMES (GemmaTokenizer)
    is opened where it points, absolute or from the working folder: a SentencePiece model outside the folder built
    the tokenizer, and swapping it kept the identity (the reviewer's repro: logits -81.18 against -31.52). Refused,
    naming the key; a name of the folder's own hashed files, or a path that exists nowhere, is harmless."""
    outside = tmp_path / "ext" / "sp.model"
    outside.parent.mkdir()
    outside.write_bytes(b"a sentencepiece model")
    cfg = ckpt / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    for value in (str(outside), "sp.model"):
        monkeypatch.chdir(outside.parent)  # a relative name is opened from the working folder
        cfg.write_text(json.dumps({**data, "tokenizer_class": "GemmaTokenizer", "vocab_file": value}))
        with pytest.raises(UsageError, match="vocab_file = ") as e:
            files.identity_sha256(ckpt)
        assert value in str(e.value)
    for value in (str(ckpt / "tokenizer.json"), "/nowhere/sp.model"):
        cfg.write_text(json.dumps({**data, "vocab_file": value}))
        files.identity_sha256(ckpt)


@pytest.mark.parametrize(
    "name", ["tekken.json", "tiktoken.model", "tokenizer.model.", "merges_file", "custom_generate/generate.py"]
)
def test_files_transformers_finds_by_pattern_or_runs_are_part_of_the_identity(ckpt, name):
    """Without tokenizer.json, transformers' tokenizer takes Mistral's tekken.json or a tiktoken model (and the
    other whole names its fallback pattern matches); under --trust-remote-code custom_generate/generate.py replaces
    generate(). Each changed the loaded tokenizer or generation under one identity in the reviewer's repros."""
    (ckpt / name).parent.mkdir(exist_ok=True)
    (ckpt / name).write_text("one")
    first = files.identity_sha256(ckpt)
    (ckpt / name).write_text("two")
    assert files.identity_sha256(ckpt) != first


def test_transformers_fallback_tokenizer_pattern_is_the_one_the_identity_covers():
    """The pattern transformers searches the folder's listing with where tokenizer.json is absent, as this version
    writes it (files.IDENTITY_FILES and files._FALLBACK_NAMES restate what it matches): a change fails here."""
    import inspect

    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    source = inspect.getsource(PreTrainedTokenizerBase.from_pretrained)
    assert 'r"tekken\\.json|tokenizer\\.model\\.*|tiktoken\\.model" + "|".join(' in source
    assert {"tekken.json", "tiktoken.model", "tokenizer.model"} <= set(files.IDENTITY_FILES)


def test_the_path_given_does_not_choose_the_tokenizer(ckpt, tmp_path, monkeypatch):
    """AutoTokenizer matches the path string it is given against Hub ids (MODEL_IDS_TO_TOKENIZERS_BACKEND) and picks
    another tokenizer class on a match: the same folder named `deepseek-ai/deepseek-coder-1b` from its parent folder
    tokenized differently from its absolute path, under one identity. The loader hands transformers absolute paths
    (files.hf_path), so both spellings load one tokenizer."""
    from quantize.checkpoint.loader import load_model

    hub_like = tmp_path / "deepseek-ai" / "deepseek-coder-1b"
    hub_like.parent.mkdir()
    shutil.copytree(ckpt, hub_like)
    monkeypatch.chdir(tmp_path)
    _, by_name = load_model(Path("deepseek-ai/deepseek-coder-1b"))
    _, by_path = load_model(hub_like)
    text = "The capital of France is Paris."
    assert type(by_name) is type(by_path) and by_name(text)["input_ids"] == by_path(text)["input_ids"]
    assert files.hf_path("deepseek-ai/deepseek-coder-1b") == str(hub_like)
