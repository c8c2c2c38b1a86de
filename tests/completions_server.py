"""An OpenAI-compatible `/v1/completions` endpoint over a transformers model, for the tests: what a correct engine
answers to lm-eval's `local-completions` log-likelihood requests, served over real HTTP on a free port of 127.0.0.1
by the standard library, so the CI checks lm-eval's API-model path (token-id prompts, echoed log-probabilities, its
`[ctxlen:-1]` slice and greedy check, its samples) without llama.cpp's server, whose build does not fit CI's
10 minutes (tests/evaluate/test_server_samples.py runs that one under `make test-server`).

What it answers: for each prompt (token ids, or text the model's tokenizer encodes), with `echo` and `max_tokens` 1
as lm-eval sends them, the prompt's tokens and one greedy token, `token_logprobs[i]` = log p(t_i | t_<i) from the
model's float32 logits (None for the first), and `top_logprobs[i]` the `logprobs` most likely tokens at position i.
Anything else (generation without echo, other `max_tokens`) is a 400 naming the field: a test that needs it adds it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Refused(ValueError):
    """A request this endpoint does not answer (400, with the message)."""


class Completions:
    """The model's answers to completion requests; one request at a time (the model is not re-entrant)."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.lock = threading.Lock()
        self.requests = 0

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("echo") is not True or body.get("max_tokens") != 1:
            raise Refused(f"echo {body.get('echo')!r} / max_tokens {body.get('max_tokens')!r}: only echo with 1")
        top = body.get("logprobs") or 1
        prompts = self._prompts(body.get("prompt"))
        with self.lock:
            self.requests += 1
            choices = [self._echo(i, ids, int(top)) for i, ids in enumerate(prompts)]
        return {"object": "text_completion", "model": body.get("model"), "choices": choices}

    def _prompts(self, prompt: Any) -> list[list[int]]:
        """OpenAI's prompt forms: a string, a list of strings, a list of token ids, a list of such lists."""
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise Refused(f"prompt {str(prompt)[:60]!r}: a string, token ids, or a list of either")
        out = []
        for p in prompt:
            ids = self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else p
            if not ids or not all(isinstance(t, int) and 0 <= t < len(self.tokenizer) for t in ids):
                raise Refused(f"prompt {str(p)[:60]!r}: no tokens, or ids outside the vocabulary")
            out.append(ids)
        return out

    def _echo(self, index: int, ids: list[int], top: int) -> dict[str, Any]:
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0].float()
        lsm = torch.log_softmax(logits, dim=-1)
        tokens = [*ids, int(lsm[-1].argmax())]
        best = lsm.topk(top, dim=-1)
        words = self.tokenizer.convert_ids_to_tokens
        return {
            "index": index,
            "text": self.tokenizer.decode(tokens),
            "finish_reason": "length",
            "logprobs": {
                "tokens": words(tokens),
                "token_logprobs": [None, *(float(lsm[i - 1, t]) for i, t in enumerate(tokens) if i)],
                "top_logprobs": [
                    None,
                    *(
                        dict(zip(words(best.indices[i].tolist()), best.values[i].tolist(), strict=True))
                        for i in range(len(ids))
                    ),
                ],
            },
        }


@contextlib.contextmanager
def serve(model_dir: Path) -> Iterator[tuple[str, Completions]]:
    """The endpoint on a free port of 127.0.0.1 in a thread; yields its completions URL and the model's answerer,
    and shuts the server down whatever happens."""
    completions = Completions(model_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name for a POST handler
            if self.path != "/v1/completions":
                return self._send(404, {"error": f"no endpoint {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                return self._send(200, completions.answer(body))
            except ValueError as e:  # Refused, or a body that is not JSON
                return self._send(400, {"error": str(e)})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:  # quiet: pytest shows failures, not every request
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions", completions
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
