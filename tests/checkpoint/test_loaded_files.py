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


def test_an_unchanged_check_reads_no_weight_byte(ckpt, monkeypatch):
    identity = files.identity_sha256(ckpt)
    read = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: read.append(Path(p).name) or real(p))
    files.check_identity(ckpt, identity)
    assert "model.safetensors" not in read and "tokenizer.json" in read
