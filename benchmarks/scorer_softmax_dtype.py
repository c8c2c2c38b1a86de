"""Is a bf16 difference between our scorer and stock HFLM the log-softmax's dtype? On golden/core/v2 in bf16, the
first N items a task: ours (log-softmax in float32), stock HFLM as is (in the model's dtype) and stock with HFLM's
own `softmax_dtype=float32`, compared pairwise (same correctness, differing ids, largest |Δ ll|).

    python benchmarks/scorer_softmax_dtype.py 300 core_facts,core_kv,core_analogy,core_cloze [OUT.json]
"""

import functools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scorer_equality as se
from lm_eval.models.huggingface import HFLM

from quantize.checkpoint.loader import LastModel

n = int(sys.argv[1])
tasks = sys.argv[2].split(",")
model = Path("~/.cache/quantize/models/SmolLM2-135M-Instruct").expanduser()
models = LastModel()
tmp = Path(tempfile.mkdtemp())


def run(backend):
    s = se.suite(tmp, "core/v2", "bfloat16", backend)
    doc, sec = se.scored(s, model, models, n)
    print(backend, "seconds", round(sec, 1), flush=True)
    return {t: doc.tasks[t].model_dump() for t in tasks if t in doc.tasks}


ours = run("quantize")
stock = run("hf")
init = HFLM.__init__


@functools.wraps(init)
def f32(self, *a, **kw):
    kw["softmax_dtype"] = "float32"
    init(self, *a, **kw)


HFLM.__init__ = f32
stock32 = run("hf")
out = {}
for t in tasks:
    a = se.compare(ours[t], stock[t])
    b = se.compare(ours[t], stock32[t])
    c = se.compare(stock32[t], stock[t])
    out[t] = {
        "ours_vs_stock": [a["same_correctness"], a["differing_ids"], a["max_abs_delta"]],
        "ours_vs_stock_f32softmax": [b["same_correctness"], b["differing_ids"], b["max_abs_delta"]],
        "stock_f32softmax_vs_stock": [c["same_correctness"], c["differing_ids"], c["max_abs_delta"]],
    }
    print(t, json.dumps(out[t]), flush=True)
if len(sys.argv) > 3:
    Path(sys.argv[3]).write_text(json.dumps(out, indent=1) + "\n")
