"""Fuzzing every kind of user input through the CLI: whatever the bytes, the answer is exit 2 (or 0/1
where the input happens to be valid) with one message and no traceback, within 2 seconds.

The default run tries a few dozen cases of each kind; `make fuzz` runs QUANTIZE_FUZZ_EXAMPLES (1,000)
of each and prints the counts."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import time
import unicodedata
from collections import Counter

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quantize.cli import main
from quantize.convert.calibration import check_calibration
from quantize.convert.recipe import Calibration
from quantize.errors import UsageError

from conftest import ROOT, result

EXAMPLES = int(os.environ.get("QUANTIZE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TALLY: Counter = Counter()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "gptq",
            "awq",
            "fp8",
            "rtn",
            "smoothquant",
            "llmcompressor",
            "W4A16",
            "W8A8",
            "FP8",
            "FP8_DYNAMIC",
            "acc",
            "perplexity",
            "kl",
            "top1",
            "smoke",
            "hf",
            "auto",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=12), c, max_size=4)),
    max_leaves=12,
)


def mapping(keys: list[str]) -> st.SearchStrategy[dict]:
    """Mostly the schema's own keys, sometimes others, with values of any shape."""
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=12)), values, max_size=len(keys) + 2)


def check(kind: str, argv: list[str], capsys, allowed: tuple[int, ...] = (2,)) -> int:
    t0 = time.perf_counter()
    code = main(argv)
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    TALLY[(kind, code)] += 1
    assert code in allowed, f"{kind}: exit {code}: {err[:500]}"
    assert "Traceback" not in err and took < 2.0, (kind, took, err[:300])
    if code == 2:  # the refusal, after any stage lines the command printed before it (quantize/progress.py)
        refusal = "\n".join(line for line in err.splitlines() if not line.startswith("quantize: "))
        assert refusal.startswith(f"quantize {argv[0]}: error: "), err[:300]
    return code


RECIPE_KEYS = [
    "name",
    "method",
    "scheme",
    "group_size",
    "symmetric",
    "act_order",
    "dampening_frac",
    "awq_grid",
    "smoothing_strength",
    "indivisible",
    "targets",
    "ignore",
    "calibration",
    "output",
    "dtype",
    "model",
    "stages",
    "backend",
    "trust_remote_code",
]


@FUZZ
@given(data=mapping(RECIPE_KEYS))
def test_fuzz_recipes(tmp_path_factory, capsys, data):
    d = tmp_path_factory.mktemp("r")
    if isinstance(data, dict):
        data["model"] = str(d / "no-such-model")  # a valid recipe stops at the model check: nothing converts
    p = d / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    check("recipe", ["run", str(p)], capsys)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_fuzz_recipe_bytes(tmp_path_factory, capsys, raw):
    p = tmp_path_factory.mktemp("rb") / "r.yaml"
    p.write_bytes(raw)
    check("recipe bytes", ["run", str(p)], capsys)


RULE = mapping(["task", "metric", "margin", "max_ratio", "agreement", "max", "min", "name"])


@FUZZ
@given(
    data=mapping(["name", "suite", "alpha", "power", "fail_on_inconclusive", "rules"]),
    rules=st.one_of(values, st.lists(RULE, max_size=3)),
)
def test_fuzz_policies(tmp_path_factory, capsys, data, rules):
    d = tmp_path_factory.mktemp("p")
    data = {**data, "rules": rules}
    (d / "p.yaml").write_text(yaml.safe_dump(data))
    check("policy", ["gate", str(d / "p.yaml"), "--baseline", str(d / "nope"), "--candidate", str(d / "nope")], capsys)


@FUZZ
@given(
    data=mapping(
        [
            "name",
            "golden",
            "tasks",
            "subset",
            "batch_size",
            "seed",
            "backend",
            "dtype",
            "device",
            "max_length",
            "vllm",
            "agreement",
        ]
    )
)
def test_fuzz_suites(tmp_path_factory, capsys, data):
    d = tmp_path_factory.mktemp("s")
    (d / "s.yaml").write_text(yaml.safe_dump(data))
    check("suite", ["eval", str(d / "s.yaml"), str(d / "no-such-checkpoint")], capsys)


MANIFEST = json.loads((ROOT / "golden" / "core" / "v1" / "MANIFEST.json").read_text())


@FUZZ
@given(
    data=st.one_of(
        values,
        mapping(list(MANIFEST)),
        st.builds(lambda k, v: {**MANIFEST, k: v}, st.sampled_from(list(MANIFEST)), values),
    )
)
def test_fuzz_manifests(tmp_path_factory, capsys, data):
    d = tmp_path_factory.mktemp("m")
    (d / "MANIFEST.json").write_text(json.dumps(data))
    check("manifest", ["golden", "verify", str(d)], capsys)


SCORE_KEYS = ["schema_version", "key", "provenance", "created", "wall_seconds", "tasks"]


@FUZZ
@given(data=st.one_of(values, mapping(SCORE_KEYS)))
def test_fuzz_score_files(tmp_path_factory, capsys, data):
    d = tmp_path_factory.mktemp("sc")
    suite = d / "suite.yaml"
    suite.write_text(f"golden: {ROOT / 'golden' / 'core' / 'v1'}\ntasks: [core_facts]\n")
    (d / "p.yaml").write_text(f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.02}}\n")
    (d / "b.json").write_text(json.dumps(data))
    check(
        "score file",
        ["gate", str(d / "p.yaml"), "--baseline", str(d / "b.json"), "--candidate", str(d / "b.json")],
        capsys,
    )


@FUZZ
@given(
    config=st.one_of(
        values,
        mapping(["quantization_config", "compression_config", "num_hidden_layers"]),
        st.builds(
            lambda q: {"quantization_config": q}, mapping(["quant_method", "bits", "w_bit", "config_groups", "format"])
        ),
    ),
    index=st.one_of(st.none(), values, st.builds(lambda w: {"weight_map": w}, values)),
)
def test_fuzz_checkpoint_folders(tmp_path_factory, capsys, config, index):
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("c")
    save_file(
        {"model.layers.0.mlp.down_proj.qweight": torch.zeros(2, 8, dtype=torch.int32)}, str(d / "model.safetensors")
    )
    (d / "config.json").write_text(json.dumps(config))
    if index is not None:  # the index alone (beside model.safetensors the folder is refused for that): it is read
        (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    check("checkpoint folder", ["inspect", str(d)], capsys, allowed=(0, 2))


LAYOUT_PARTS = ("model.safetensors", "index", "shard", "stray", "fifo", "adapter", "transformers_weights", "link out")


@FUZZ
@given(
    parts=st.sets(st.sampled_from(LAYOUT_PARTS)), explicit=st.sampled_from(["model.safetensors", "shard.safetensors"])
)
def test_fuzz_weight_layouts(tmp_path_factory, capsys, parts, explicit):
    """Any mix of what a folder's weights can be: exit 0 only where one set of files is what every loader reads (no
    FIFO, no adapter, no two layouts, no loaded file outside the folder), else exit 2; never a hang or a traceback."""
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("w")
    weights = {"model.layers.0.mlp.down_proj.weight": torch.zeros(4, 8)}
    for part, name in (
        ("model.safetensors", "model.safetensors"),
        ("shard", "shard.safetensors"),
        ("stray", "x.safetensors"),
    ):
        if part in parts:
            save_file(weights, str(d / name))
    if "index" in parts:
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": dict.fromkeys(weights, "shard.safetensors")})
        )
    if "fifo" in parts:
        os.mkfifo(d / "fifo.safetensors")
    if "adapter" in parts:
        (d / "adapter_config.json").write_text("{}")
    if "link out" in parts:
        out = tmp_path_factory.mktemp("out") / "o.safetensors"
        save_file(weights, str(out))
        (d / "linked.safetensors").symlink_to(out)
    config = {"transformers_weights": explicit} if "transformers_weights" in parts else {}
    (d / "config.json").write_text(json.dumps(config))
    code = check("weight layout", ["inspect", str(d)], capsys, allowed=(0, 2))
    if code == 0:
        assert not parts & {"fifo", "adapter"}, parts
        assert not {"model.safetensors", "index"} <= parts, parts
        assert "link out" not in parts or "index" in parts, parts  # beside an index a stray file is read by none


HEADER_ENTRY = mapping(["dtype", "shape", "data_offsets"])


@FUZZ
@given(
    header=st.one_of(values, st.dictionaries(st.text(max_size=8), st.one_of(HEADER_ENTRY, values), max_size=3)),
    data_len=st.integers(0, 64),
)
def test_fuzz_safetensors_headers(tmp_path_factory, capsys, header, data_len):
    blob = json.dumps(header).encode()
    p = tmp_path_factory.mktemp("h") / "x.safetensors"
    p.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * data_len)
    check("safetensors header", ["inspect", str(p)], capsys, allowed=(0, 2))


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    if os.environ.get("QUANTIZE_FUZZ_EXAMPLES"):
        kinds = sorted({k for k, _ in TALLY})
        print("\nfuzz cases by kind and exit code:")
        for k in kinds:
            codes = {c: n for (kk, c), n in TALLY.items() if kk == k}
            print(f"  {k:<20} {sum(codes.values()):>6} cases, exits {dict(sorted(codes.items()))}")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  peak RSS of the fuzzing process: {rss:.0f} MiB; 0 tracebacks; none over 2 s")


# --- integrity classes (#26): each a property over generated cases, counted with the rest -------------------

NAME_CHARS = st.text(alphabet=st.sampled_from(list("ab*?[]-.! ")), min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")  # pathlib folds these into the parent: no output is named so
)


@FUZZ
@given(mine=NAME_CHARS, others=st.lists(NAME_CHARS, max_size=5))
def test_fuzz_leftover_names(tmp_path_factory, mine, others):
    """Whatever characters output names hold, a run claims exactly its own leftovers: never a pattern match."""
    from quantize.io import leftovers

    d = tmp_path_factory.mktemp("left")
    own = d / f".{mine}.tmp-99999999"
    own.mkdir()
    for o in set(others) - {mine}:
        (d / f".{o}.tmp-99999999").mkdir(exist_ok=True)
        (d / f".{o}.old-99999999").mkdir(exist_ok=True)
    assert leftovers(d / mine) == [own]
    TALLY[("leftover names", 0)] += 1


@FUZZ
@given(where=st.one_of(st.text(max_size=30), st.sampled_from(["/etc/hostname", "../../x", "../data/x.jsonl"])))
def test_fuzz_task_data_paths(tmp_path_factory, capsys, where):
    """A task YAML naming any path: the set verifies only when the path is one of its own listed files."""
    import hashlib

    import yaml

    src = ROOT / "golden" / "answers" / "v1"
    d = tmp_path_factory.mktemp("g") / "answers" / "v1"
    shutil.copytree(src, d)
    t = d / "tasks" / "answers_facts.yaml"
    cfg = yaml.safe_load(t.read_text())
    cfg["dataset_kwargs"]["data_files"]["test"] = where
    t.write_text(yaml.safe_dump(cfg))
    m = json.loads((d / "MANIFEST.json").read_text())
    m["files"]["tasks/answers_facts.yaml"]["sha256"] = hashlib.sha256(t.read_bytes()).hexdigest()
    (d / "MANIFEST.json").write_text(json.dumps(m))
    try:
        own = bool(where) and (d / "tasks" / where).resolve() == (d / "data" / "answers_facts.jsonl").resolve()
    except (ValueError, OSError):  # a path no file system can name (a NUL byte) is not the set's file
        own = False
    check("task data path", ["golden", "verify", str(d)], capsys, allowed=(0,) if own else (2,))


@FUZZ
@given(flips=st.lists(st.integers(0, 39), max_size=5), lls=st.lists(st.integers(0, 9), max_size=3))
def test_fuzz_tampered_score_items(flips, lls):
    """A score document edited item by item is caught exactly when its summaries no longer follow from its items."""
    from quantize import records
    from quantize.evaluate.cache import summary_mismatches
    from quantize.evaluate.score import task_scores

    acc = [{"id": f"a{i}", "cluster": "c", "score": float(i % 3 == 0), "ll": -1.0} for i in range(40)]
    docs = [
        {"id": f"d{i}", "cluster": f"d{i}", "score": -50.0 - i, "ll": -50.0 - i, "words": 10, "bytes": 60}
        for i in range(10)
    ]
    base = result([0.0], [-1.0])
    base["tasks"] = {
        "t_acc": task_scores("loglikelihood", 1.0, acc, {}).model_dump(),
        "t_prose": task_scores("loglikelihood_rolling", 1.0, docs, {}).model_dump(),
    }
    for i in flips:
        it = base["tasks"]["t_acc"]["items"][i]
        it["score"] = 1.0 - it["score"]
    for i in lls:
        it = base["tasks"]["t_prose"]["items"][i]
        it["ll"] = it["score"] = it["ll"] - 1.0
    doc = records.parse(records.ScoreDoc, base, "fuzz")
    # a tampering that leaves every summary true (a right and a wrong item swapped) is not evidence of one
    changed_acc = sum(it["score"] for it in base["tasks"]["t_acc"]["items"]) != sum(it["score"] for it in acc)
    assert bool(summary_mismatches(doc)) == bool(changed_acc or lls)
    TALLY[("tampered score", 2 if (changed_acc or lls) else 0)] += 1


@FUZZ
@given(layers=st.integers(0, 10**6), vocab=st.integers(1, 10**10), hidden=st.integers(1, 4096))
@example(layers=2, vocab=32, hidden=8)  # the one config the weights agree with
def test_fuzz_config_against_headers(tmp_path_factory, layers, vocab, hidden):
    """Any layer count or embedding shape config.json claims: refused, in milliseconds, unless the weights agree."""
    import time

    import torch
    from safetensors.torch import save_file

    from quantize.checkpoint.files import check_model_dir
    from quantize.errors import UsageError

    d = tmp_path_factory.mktemp("hdr")
    t = {"model.embed_tokens.weight": torch.zeros(32, 8)}
    t |= {f"model.layers.{i}.mlp.up_proj.weight": torch.zeros(4, 8) for i in range(2)}
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": layers, "vocab_size": vocab, "hidden_size": hidden})
    )
    agrees = (layers, vocab, hidden) == (2, 32, 8)
    t0 = time.perf_counter()
    try:
        check_model_dir(d)
        code = 0
    except UsageError:
        code = 2
    assert code == (0 if agrees else 2) and time.perf_counter() - t0 < 1.0
    TALLY[("config vs headers", code)] += 1


NAME_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(exclude_categories=()),  # every code point, lone surrogates included
        st.sampled_from(["/", "\\", ".", " ", "\n", "\x00", "\u200b", "\u0301", "e", "A", "a"]),  # e + U+0301: NFC
    ),
    max_size=120,
)


# --- what a user names, read the one safe way (#41): every reader, every kind of file that is no plain input ------

SPECIAL = ["fifo", "/dev/zero", "folder", "oversize", "not utf-8", "random bytes"]
READERS = {  # argv with {} where the named file goes, the exits a file of random bytes may give
    "golden new --from": (["golden", "new", "{out}", "--from", "{}", "--type", "multiple_choice"], (0, 2)),
    "card --verdict": (["card", "{out}", "--verdict", "{}"], (2,)),
    "sweep file": (["sweep", "{}"], (2,)),
    "recipe": (["run", "{}"], (2,)),
    "golden verify manifest": (["golden", "verify", "{dir}"], (2,)),
}


def special_file(d, kind: str, raw: bytes, name: str):
    """A path of `kind` named `name` in `d`: what a reader must refuse (or read, for random bytes)."""
    p = d / name
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "/dev/zero":
        p.symlink_to("/dev/zero")
    elif kind == "folder":
        p.mkdir()
    elif kind == "oversize":
        with p.open("wb") as fh:
            fh.truncate(2**34)  # sparse: 16 GiB on paper, over every cap
    elif kind == "not utf-8":
        p.write_bytes(b"name: x\n" + raw + b"\xff\xfe\n")
    else:
        p.write_bytes(raw)
    return p


@FUZZ
@given(reader=st.sampled_from(sorted(READERS)), kind=st.sampled_from(SPECIAL), raw=st.binary(max_size=200))
def test_fuzz_named_files(tmp_path_factory, capsys, reader, kind, raw):
    """A FIFO, a link to /dev/zero, a folder, a 16 GiB file, bytes that are not UTF-8, or random bytes, named where
    a reader expects a file: exit 2 naming it (random bytes may make a valid file), fast, never a hang."""
    d = tmp_path_factory.mktemp("named")
    argv, allowed = READERS[reader]
    name = "MANIFEST.json" if reader == "golden verify manifest" else "input"
    p = special_file(d, kind, raw, name)
    args = [a.replace("{}", str(p)).replace("{out}", str(d / "out" / "v1")).replace("{dir}", str(d)) for a in argv]
    check(f"named: {kind}", args, capsys, allowed=allowed if kind == "random bytes" else (2,))


# --- saved datasets (#55): a save_to_disk folder with forged metadata or special files, as a calibration source ----

ARROW = "data-00000-of-00001.arrow"
DATASET_NAMES = st.one_of(
    st.text(max_size=12),
    st.sampled_from([ARROW, f"./{ARROW}", f"../ds/{ARROW}", f"x/../{ARROW}", "/etc/hostname", "", ".", "..", "\x00"]),
)
FORGED_JSON = {
    "state.json": st.one_of(
        values,
        mapping(["_data_files", "_fingerprint", "_format_type", "_split"]),
        st.builds(
            lambda files: {"_data_files": files, "_split": None},
            st.one_of(
                values, st.lists(st.one_of(st.builds(lambda f: {"filename": f}, DATASET_NAMES), values), max_size=3)
            ),
        ),
    ),
    "dataset_info.json": st.one_of(values, mapping(["features", "description", "splits"])),
    "dataset_dict.json": st.one_of(
        values,
        st.builds(
            lambda splits: {"splits": splits},
            st.one_of(
                values,
                st.lists(st.one_of(st.sampled_from(["train", "val", "../ds", "/tmp"]), DATASET_NAMES), max_size=3),
            ),
        ),
    ),
}


@pytest.fixture(scope="module")
def saved_datasets(tmp_path_factory):
    """A Dataset and a DatasetDict (split train) of text saved by save_to_disk."""
    import datasets

    d = tmp_path_factory.mktemp("saved")
    texts = [" ".join(["the hacker wrote a program for the system"] * 3)] * 20
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(d / "dataset"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts})}).save_to_disk(str(d / "dict"))
    return d


@st.composite
def dataset_case(draw):
    """(layout, file changed, how: a kind of special file or `json`, bytes or a JSON value)."""
    layout = draw(st.sampled_from(["dataset", "dict"]))
    files = ["state.json", "dataset_info.json", ARROW] + (["dataset_dict.json", "train"] if layout == "dict" else [])
    target = draw(st.sampled_from(files))
    if target in (ARROW, "train") or draw(st.booleans()):
        return layout, target, draw(st.sampled_from([*SPECIAL, "link out"])), draw(st.binary(max_size=200))
    return layout, target, "json", draw(FORGED_JSON[target])


def _readable_data_files(folder) -> bool:
    """Whether state.json lists data files that are each a regular file inside the folder (links followed)."""
    state = json.loads((folder / "state.json").read_text())
    root = folder.resolve()
    names = [f.get("filename") if isinstance(f, dict) else None for f in state["_data_files"]]
    return all(
        isinstance(n, str) and (folder / n).resolve().is_relative_to(root) and (folder / n).is_file() for n in names
    )


@FUZZ
@given(case=dataset_case())
def test_fuzz_saved_datasets(saved_datasets, tiny_model, tmp_path_factory, capsys, case):
    """A saved dataset whose own files are forged (any JSON in state.json, dataset_info.json, dataset_dict.json; any
    file name in _data_files or splits) or special (a FIFO, /dev/zero, a folder, 16 GiB, not UTF-8, random bytes, a
    link out of the folder), named as `quantize run`'s calibration: a UsageError (exit 2) naming the problem, or read
    as valid (then every data file it names is a regular file inside the folder); never another exception, a hang
    or over 2 s."""
    layout, target, how, raw = case
    d = tmp_path_factory.mktemp("sd")
    shutil.copytree(saved_datasets / layout, d / "ds")
    inner = d / "ds" / "train" if layout == "dict" and target != "dataset_dict.json" else d / "ds"
    path = inner / (target if target != "train" else "")
    if how == "json":
        path.write_text(json.dumps(raw))
    else:
        if target == "train":
            shutil.rmtree(path)
        else:
            path.unlink()
        if how == "link out":
            path.symlink_to(saved_datasets / "dataset" / (target if target != "train" else ""))
        else:
            special_file(path.parent, how, raw, path.name)
    # the check `quantize run` makes once its memory plan has taken the run (convert/engine.py
    # calibration_after_the_plan): after the output check, so a run into an existing output never reaches it
    calibration = Calibration(source=str(d / "ds"), samples=2, seq_len=16)
    t0 = time.perf_counter()
    try:
        check_calibration(calibration, tiny_model)
        err, valid = "", True
    except UsageError as e:
        err, valid = str(e), False
    took = time.perf_counter() - t0
    TALLY[("saved dataset", 0 if valid else 2)] += 1
    assert took < 2.0, (case, took, err[:300])
    if valid:
        assert how in ("json", "random bytes") and target != "train", (case, err[:300])
        assert _readable_data_files(inner), case


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    """A golden set of four multiple-choice items from `golden new`."""
    d = tmp_path_factory.mktemp("tiny")
    items = [{"question": f"q{i}", "choices": ["a", "b", "c"], "answer": i % 3} for i in range(4)]
    (d / "items.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    assert (
        main(["golden", "new", str(d / "tiny" / "v1"), "--from", str(d / "items.jsonl"), "--type", "multiple_choice"])
        == 0
    )
    return d / "tiny" / "v1"


ITEM_LINE = st.one_of(
    st.builds(json.dumps, values),
    st.builds(json.dumps, mapping(["id", "question", "choices", "answer", "cluster", "golden_shots"])),
    st.builds(
        lambda i, a, c: json.dumps({"id": i, "question": "q", "choices": c, "answer": a}),
        st.one_of(st.integers(0, 3), st.text(max_size=3)),
        st.one_of(st.integers(-2, 5), st.text(max_size=3), st.booleans(), st.none()),
        st.one_of(st.lists(st.text(max_size=3), max_size=4), values),
    ),
    st.text(max_size=40),
)


@FUZZ
@given(value=st.one_of(NAME_TEXT, st.sampled_from(["", ".", "..", "a/", "./a", "../UP", "/abs", "\ud800", "a" * 101])))
def test_fuzz_names(tmp_path_factory, value):
    """Any text is either refused (one line naming the field, exit 2) or a name that is one folder inside its parent:
    created there, it is listed back under exactly that name, and nothing else appears."""
    from quantize.errors import UsageError
    from quantize.names import checked

    d = tmp_path_factory.mktemp("names")
    try:
        name = checked(value, "recipes[0].name", "set `name:`")
    except UsageError as e:
        msg = str(e)
        assert msg.startswith("recipes[0].name = ") and "\n" not in msg and len(msg) < 1000
        msg.encode("utf-8")
        TALLY[("names", 2)] += 1
        return
    p = d / name
    assert p.parent == d and p.name == name
    p.mkdir()
    assert os.listdir(d) == [name]
    TALLY[("names", 0)] += 1


@FUZZ
@given(lines=st.lists(ITEM_LINE, min_size=1, max_size=6), template=st.booleans())
def test_fuzz_golden_item_lines(tiny_set, tmp_path_factory, capsys, lines, template):
    """Any lines in a set's data file, the MANIFEST re-sealed over them (its hashes rewritten): `golden verify` is
    exit 0 or 2, never 3; when it passes, every line is a JSON object with an id of its own and a right answer."""
    from quantize.io import sha256_bytes

    d = tmp_path_factory.mktemp("items") / "tiny" / "v1"
    shutil.copytree(tiny_set, d)
    task = next((d / "tasks").glob("tiny_*.yaml"))
    if template:  # the answer through a Jinja template, as lm-eval's own tasks often give it
        task.write_text(task.read_text().replace("doc_to_target: answer", "doc_to_target: '{{answer}}'"))
    data = next((d / "data").glob("*.jsonl"))
    data.write_text("".join(line.replace("\n", " ") + "\n" for line in lines))
    m = json.loads((d / "MANIFEST.json").read_text())
    for name, entry in m["files"].items():
        blob = (d / name).read_bytes()
        entry["sha256"] = sha256_bytes(blob)
        entry["items"] = blob.count(b"\n") if entry["items"] is not None else None
    m["smoke_ids"] = {}
    (d / "MANIFEST.json").write_text(json.dumps(m))
    if check("golden item lines", ["golden", "verify", str(d)], capsys, allowed=(0, 2)) == 0:
        docs = [json.loads(line) for line in lines]
        ids = [unicodedata.normalize("NFC", str(doc["id"])).strip() for doc in docs]
        assert len(set(ids)) == len(ids) and all(ids)
        for doc in docs:
            assert isinstance(doc["choices"], list) and all(isinstance(c, str) for c in doc["choices"])
            a = doc["answer"]
            assert template or a in doc["choices"] or (type(a) is int and 0 <= a < len(doc["choices"])), doc
