"""llama-cpp-python's internals this project relies on (checked on 0.3.36): one private method, patched only where
asked (benchmarks/server_samples.py `--fixed`), never by `quantize` itself.

- `Llama._create_completion`: the OpenAI server's completion path. With `echo=True` 0.3.36 pairs each echoed prompt
  token i with the log-softmax of the logits at position i (which predict token i + 1), drops a leading BOS from
  the echo but not from the rows, and echoes nothing when the greedy next token ends generation: lm-eval's
  `local-completions` log-likelihoods read through it are off by one token (docs/results.md, "A real server").
  `patch_echo` recompiles the method's own source with PATCHES applied (each must match exactly once), so an
  echoed token i is scored by row i - 1, BOS kept, the end-of-generation token echoed, and the top-k taken with
  numpy instead of a Python sort of the whole vocabulary per token.

- `struct ggml_tensor` (ggml.h as 0.3.36 vendors it: GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10,
  GGML_MAX_NAME 64): what llama.cpp's graph callback (`cb_eval`, `ggml_backend_sched_eval_callback`) hands over is a
  pointer to one, and llama-cpp-python maps no field of it. `GGMLTensor` is that layout; `tensor_problems` builds a
  matrix product in a ggml context of its own and reads it back through the layout (type, shape, strides, name, op,
  sources), so a moved field is found before anything is read with it. Through `llama_cpp._ggml.libggml` (its own
  "use at your own risk" module): ggml_nbytes, ggml_backend_tensor_get, ggml_op_name (op_code), and, for the check,
  ggml_init, ggml_new_tensor_2d, ggml_set_name, ggml_mul_mat, ggml_free.

- llama.cpp's converter of a Hugging Face checkpoint, `convert_hf_to_gguf.py`, with its `conversion/` package and
  the `gguf-py` it is written against (newer than PyPI's gguf 0.19.0 of the same number): no part of the installed
  package, so `make gguf-env` unpacks them from the same source distribution into `converter_home()` and stamps
  the version beside them (`converter_version`). `converter_problems` finds them there, of the installed version,
  with the command-line options convert/hf_to_gguf.py passes (its child process runs the script).

- `llama_cpp.llama_model_is_recurrent` / `llama_model_is_hybrid` (llama.h's `llama_model_is_recurrent`,
  `llama_model_is_hybrid`, through llama-cpp-python's low-level bindings, which `Llama.reset` itself calls):
  whether a model's memory holds a recurrent state (Mamba's, RWKV's; a hybrid's short-convolution or state-space
  layers beside attention: LFM2, Falcon-H1), which llama.cpp cannot cut part-way (`llama_memory_seq_rm` refuses a
  partial cut, and the next decode returns -1). `memory_rewinds` asks them; `problems` names either missing.

`problems()` lists every guarded assumption that does not hold in the installed version (tests/compat fails on
any); `patch_echo` refuses to run while there is one, never half-patching another version, and the importance
matrix (convert/imatrix.py) is refused while `tensor_problems()` finds one.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import sys
import textwrap
import warnings
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from quantize.compat import outside

DISTRIBUTION = "llama_cpp_python"
CHECKED = ((0, 3, 36), (0, 3, 37))  # [from, to): the versions PATCHES were read on

# (old, new) on the source of llama_cpp.Llama._create_completion (0.3.36, as indented in its file): the echo path only
PATCHES = [
    (  # remember the end-of-generation token that stopped the loop, so the echo can return it
        "multibyte_fix = 0\n        for token in self.generate(",
        "multibyte_fix = 0\n        _eog_token = None\n        for token in self.generate(",
    ),
    (
        "if llama_cpp.llama_vocab_is_eog(self._model.vocab, token):\n",
        "if llama_cpp.llama_vocab_is_eog(self._model.vocab, token):\n                _eog_token = token\n",
    ),
    (  # every prompt token keeps its place (BOS included), then the generated token or the one that ended it
        "all_tokens = (\n"
        "                    prompt_tokens[1 if prompt_tokens[0] == self.token_bos() else 0 :]\n"
        "                    + completion_tokens\n"
        "                )",
        "all_tokens = prompt_tokens + (\n"
        "                    completion_tokens or ([_eog_token] if _eog_token is not None else [])\n"
        "                )",
    ),
    (  # token i is predicted by the logits at position i - 1 (row 0 is a placeholder: the first has no logprob)
        "all_logprobs = Llama.logits_to_logprobs(self._scores)[token_offset:]",
        "all_logprobs = Llama.logits_to_logprobs(self._scores)\n"
        "            if echo:\n"
        "                all_logprobs = np.concatenate([np.zeros_like(all_logprobs[:1]), all_logprobs])\n"
        "            else:\n"
        "                all_logprobs = all_logprobs[token_offset:]",
    ),
    (  # an echoed BOS is a prompt token like any other
        "):\n                if token == bos_token_id:\n                    continue\n"
        "                text_offsets.append(",
        "):\n                if token == bos_token_id and not echo:\n                    continue\n"
        "                text_offsets.append(",
    ),
    (  # the top-k by numpy, not a Python sort of the whole vocabulary for every echoed token
        "sorted_logprobs = list(\n"
        "                    sorted(\n"
        "                        zip(logprobs_token, range(len(logprobs_token))), reverse=True\n"
        "                    )\n"
        "                )",
        "sorted_logprobs = [\n"
        "                    (logprobs_token[int(i)], int(i))\n"
        "                    for i in np.argsort(-logprobs_token, kind='stable')[: max(logprobs, 1)]\n"
        "                ]",
    ),
]


def _source() -> str:
    from llama_cpp import llama as module

    return inspect.getsource(module.Llama._create_completion)  # noqa: SLF001 (the method PATCHES change)


def problems() -> list[str]:
    """What no longer holds: llama-cpp-python missing or outside CHECKED, a patched line not found exactly once."""
    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:
        return [f"{DISTRIBUTION} is not installed"]
    out = [p] if (p := outside(DISTRIBUTION, installed, CHECKED)) else []
    src = _source()
    out += [
        f"Llama._create_completion holds {src.count(old)} copies of the patched line {old[:60]!r}, not 1"
        for old, _new in PATCHES
        if src.count(old) != 1
    ]
    out += [f"llama_cpp.{name} is missing" for name in MEMORY_KINDS if not hasattr(_low_level(), name)]
    return out + tensor_problems()


MEMORY_KINDS = ("llama_model_is_recurrent", "llama_model_is_hybrid")  # llama.h: a memory that cannot be cut part-way


def _low_level() -> Any:
    import llama_cpp

    return llama_cpp


def memory_rewinds(model: Any) -> bool:
    """Whether llama.cpp can cut the memory of `model` (a `Llama.model` pointer) back to any earlier position: an
    attention-only KV cache can, a recurrent or hybrid memory cannot (MEMORY_KINDS). Where llama-cpp-python lacks
    either function (a version outside CHECKED), a warning, and False: decoding every sequence from an empty memory
    is right for any model."""
    lib = _low_level()
    if not all(hasattr(lib, name) for name in MEMORY_KINDS):
        warnings.warn(
            f"llama-cpp-python {version(DISTRIBUTION)} lacks {' or '.join(MEMORY_KINDS)}: every row is decoded from an "
            "empty memory (quantize/compat/llama_cpp.py)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return not any(bool(getattr(lib, name)(model)) for name in MEMORY_KINDS)


def patch_echo() -> None:
    """Replace `Llama._create_completion` by its own source with PATCHES applied, in this process only. A
    RuntimeError naming each problem where the installed version is not the one they were read on."""
    if found := problems():
        raise RuntimeError("llama-cpp-python's echo patch does not apply: " + "; ".join(found))
    from llama_cpp import llama as module

    src = _source()
    for old, new in PATCHES:
        src = src.replace(old, new)
    scope = dict(vars(module))
    exec(compile(textwrap.dedent(src), f"<patched {module.__file__}>", "exec"), scope)
    module.Llama._create_completion = scope["_create_completion"]  # noqa: SLF001


class GGMLTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml.h (llama-cpp-python 0.3.36's vendored ggml), field for field."""

    _fields_ = (
        ("type", ctypes.c_int),  # enum ggml_type
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),  # elements per dimension, innermost first
        ("nb", ctypes.c_size_t * 4),  # stride in bytes per dimension
        ("op", ctypes.c_int),  # enum ggml_op
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    )


class _InitParams(ctypes.Structure):  # struct ggml_init_params
    _fields_ = (("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool))


@functools.cache
def ggml() -> Any:
    """llama-cpp-python's handle on libggml, the argument and result types of the functions used here set."""
    from llama_cpp import _ggml

    lib = _ggml.libggml
    p, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, result in (
        ("ggml_nbytes", [p], size),
        ("ggml_backend_tensor_get", [p, p, size, size], None),
        ("ggml_op_name", [ctypes.c_int], ctypes.c_char_p),
        ("ggml_init", [_InitParams], p),
        ("ggml_new_tensor_2d", [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], p),
        ("ggml_set_name", [p, ctypes.c_char_p], p),
        ("ggml_mul_mat", [p, p, p], p),
        ("ggml_free", [p], None),
    ):
        f = getattr(lib, name)
        f.argtypes, f.restype = args, result
    return lib


def tensor(address: int) -> GGMLTensor:
    """The ggml tensor at `address` (a graph callback's first argument), read in place: valid while the callback
    runs."""
    return GGMLTensor.from_address(address)


@functools.cache
def op_code(name: str) -> int:
    """The value of ggml's operation `name` (MUL_MAT, MUL_MAT_ID) in its enum ggml_op: `ggml_op_name` asked for 0,
    1, ... until it says `name` (it indexes a table without a bound check, so it is never asked for a value read
    from a tensor, and the scan stops at the first match). KeyError past OP_SCAN."""
    lib = ggml()
    for i in range(OP_SCAN):
        if lib.ggml_op_name(i) == name.encode():
            return i
    raise KeyError(f"ggml names no operation {name} among its first {OP_SCAN}")


OP_SCAN = 64  # MUL_MAT is the 30th of ggml 0.3.36's operations (after NONE, DUP, ADD, ..., OUT_PROD)


def tensor_bytes(address: int) -> bytearray:
    """A copy of the tensor's bytes from its backend (`ggml_backend_tensor_get` of `ggml_nbytes`: for a view, the
    span its strides reach), wherever its buffer lives."""
    lib = ggml()
    n = lib.ggml_nbytes(address)
    out = bytearray(n)
    lib.ggml_backend_tensor_get(address, (ctypes.c_char * n).from_buffer(out), 0, n)
    return out


def tensor_problems() -> list[str]:
    """Where `GGMLTensor` does not read what ggml wrote: a 5 x 3 and a 5 x 7 F32 matrix and their product built in a
    ggml context without data, each field the layout reads compared with what was asked for."""
    import llama_cpp

    lib = ggml()
    ctx = lib.ggml_init(_InitParams(1 << 20, None, True))
    if not ctx:
        return ["ggml_init gave no context for the layout check of struct ggml_tensor"]
    try:
        a = lib.ggml_new_tensor_2d(ctx, llama_cpp.GGML_TYPE_F32, 5, 3)
        b = lib.ggml_new_tensor_2d(ctx, llama_cpp.GGML_TYPE_F32, 5, 7)
        lib.ggml_set_name(a, b"blk.0.probe.weight")
        c = lib.ggml_mul_mat(ctx, a, b)
        ta, tc = tensor(a), tensor(c)
        seen = {
            "type": ta.type,
            "ne": list(ta.ne),
            "nb": list(ta.nb),
            "name": ta.name,
            "op": tc.op,
            "src": list(tc.src[:2]),
            "product ne": list(tc.ne),
            "nbytes": lib.ggml_nbytes(a),
        }
        want = {
            "type": llama_cpp.GGML_TYPE_F32,
            "ne": [5, 3, 1, 1],
            "nb": [4, 20, 60, 60],
            "name": b"blk.0.probe.weight",
            "op": op_code("MUL_MAT"),
            "src": [a, b],
            "product ne": [3, 7, 1, 1],
            "nbytes": 60,
        }
    finally:
        lib.ggml_free(ctx)
    return [
        f"struct ggml_tensor read through GGMLTensor: {k} is {seen[k]!r}, ggml made {want[k]!r}"
        for k in want
        if seen[k] != want[k]
    ]


CONVERTER = "convert_hf_to_gguf.py"  # llama.cpp's converter, at the top of its source tree
CONVERTER_STAMP = "VERSION"  # beside it: the llama-cpp-python version whose source distribution it came from
CONVERTER_OPTIONS = ("--vocab-only", "--outtype", "--outfile")  # what convert/hf_to_gguf.py passes it
# what the converter imports beyond quantize's own environment: sentencepiece, imported by Llama's set_vocab before
# it tries a checkpoint's BPE vocabulary (ModuleNotFoundError is not the FileNotFoundError it falls back on)
CONVERTER_IMPORTS = ("sentencepiece",)
MAX_STAMP_BYTES = 64


def converter_home() -> Path:
    """Where `make gguf-env` unpacks llama.cpp's converter: share/llama.cpp below the running environment."""
    return Path(sys.prefix) / "share" / "llama.cpp"


def converter_version() -> str | None:
    """The llama-cpp-python version the unpacked converter came from (its stamp), None where none is unpacked."""
    try:
        return (converter_home() / CONVERTER_STAMP).read_bytes()[:MAX_STAMP_BYTES].decode("ascii", "replace").strip()
    except OSError:
        return None


def converter_problems() -> list[str]:
    """What stops llama.cpp's converter from running here: not unpacked in converter_home, unpacked from another
    llama-cpp-python than the installed one, that one outside CHECKED, an option we pass missing from it, or a
    module it imports not installed."""
    home = converter_home()
    if not all(
        p.exists() for p in (home / CONVERTER, home / "conversion", home / "gguf-py" / "gguf", home / CONVERTER_STAMP)
    ):
        return [f"llama.cpp's converter ({CONVERTER}, conversion/, gguf-py/) is not unpacked in {home}"]
    stamp = converter_version() or ""
    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:
        return [f"{DISTRIBUTION} is not installed"]
    out = [p] if (p := outside(DISTRIBUTION, stamp, CHECKED)) else []
    if stamp != installed:
        out.append(f"the converter in {home} came from llama-cpp-python {stamp}, and {installed} is installed")
    text = (home / CONVERTER).read_text(encoding="utf-8", errors="replace")
    out += [f"{CONVERTER} has no {o} option" for o in CONVERTER_OPTIONS if f'"{o}"' not in text]
    out += [f"{m}, which {CONVERTER} imports, is not installed" for m in CONVERTER_IMPORTS if find_spec(m) is None]
    return out
