"""The Python API (quantize/api.py, re-exported by `quantize`): each command as a function returning the record
the CLI prints, bad input as the CLI's UsageError, and importing it costs no heavy library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import yaml

import quantize
from quantize import records
from quantize.convert.recipe import parse_recipe
from quantize.golden.build import Sizes
from quantize.records import RunRecord, ScoreDoc, Verdict

from conftest import HUB_ONLY_TASK, ROOT, small_golden, suite_file

SIZES = Sizes(facts=24, cloze=12, analogy=6, kv=9, prose=4, smoke=3)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-api"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("api")
    golden = small_golden(base, SIZES)
    suite = suite_file(base / "suite.yaml", golden)
    policy = base / "gate.yaml"
    policy.write_text(
        f"suite: {suite}\nrules:\n  - {{task: core_facts, metric: acc, margin: 0.1}}\n  - {{agreement: kl, max: 0.5}}\n"
    )
    return base, suite, policy


def test_importing_quantize_loads_no_heavy_library():
    heavy = "('torch', 'transformers', 'lm_eval', 'ray')"
    code = f"import sys, quantize; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_run_from_a_file_and_from_an_object_gives_the_record_it_wrote(tmp_path, tiny_model):
    data = {"name": "rtn8", "model": str(tiny_model), "method": "rtn", "scheme": "W8A16", "group_size": 64}
    path = tmp_path / "rtn8.yaml"
    path.write_text(yaml.safe_dump({**data, "output": str(tmp_path / "from-file")}))
    done = quantize.run(path)
    assert done.output == tmp_path / "from-file"
    assert done.record == records.read(RunRecord, done.output / "quantize.json")
    assert done.record.bits.bits_per_weight == pytest.approx(quantize.inspect(done.output).bits_per_weight)
    obj = quantize.run(parse_recipe(data), output=tmp_path / "from-object")
    assert obj.record.recipe.path == "<python>" and obj.record.recipe.sha256 == obj.record.recipe.resolved_sha256
    assert obj.record.bits.total_bytes == done.record.bits.total_bytes


def test_bad_input_raises_the_clis_usage_error(tmp_path, tiny_model):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model: {tiny_model}\nmethod: rtn\nscheme: W9A16\n")
    with pytest.raises(quantize.UsageError, match="scheme"):
        quantize.run(bad)
    with pytest.raises(quantize.UsageError, match="path or a Recipe"):
        quantize.run(42)
    with pytest.raises(quantize.UsageError, match="hardware 'tpu' is unknown"):
        quantize.decode_cost(tiny_model, hardware="tpu")
    with pytest.raises(quantize.UsageError, match='`x` takes "bytes" or "bpw"; got str \'bits\''):
        quantize.write_report([tiny_model], tmp_path / "report", x="bits")


# Bad calls of every kind, each refused at the API's boundary naming its keyword: `recipe.yaml` names a model that
# does not exist, so no call could load one even if it got past the check.
KV = "KVLayout(80, 8, 128, 2)"
BAD_CALLS = [
    ("output", "run('recipe.yaml', output=123)"),
    ("max_memory", "run('recipe.yaml', max_memory=-1)"),
    ("max_memory", "run('recipe.yaml', max_memory=0)"),
    ("max_memory", "run('recipe.yaml', max_memory=float('nan'))"),
    ("force", "run('recipe.yaml', force='yes')"),
    ("recipe", "run(b'recipe.yaml')"),
    ("outptu", "run('recipe.yaml', outptu='x')"),
    ("checkpoint", "inspect(None)"),
    ("checkpoint", "score('suite.yaml', 3.5)"),
    ("refresh", "scored('suite.yaml', 'ckpt', refresh=1)"),
    ("candidates", "agree('suite.yaml', 'base', 'outputs')"),
    ("candidates", "agreement('suite.yaml', 'base', [])"),
    ("junit", "gate('policy.yaml', 'base', 'cand', junit=5)"),
    ("card", "gate('policy.yaml', 'base', 'cand', card='yes')"),
    ("on_verdict", "gate('policy.yaml', 'base', 'cand', on_verdict='print')"),
    ("checkpoints", "write_report('outputs', 'report')"),
    ("out", "write_report(['outputs'], None)"),
    ("project_params", "decode_cost('ckpt', project_params=float('nan'))"),
    ("project_share", "decode_cost('ckpt', project_share=1.5)"),
    ("hardware", "decode_cost('ckpt', hardware=['h100-sxm'])"),
    ("parameters", f"token_cost(float('nan'), {{'bf16': 16}}, {KV})"),
    ("formats", f"token_cost(70e9, {{'bf16': float('inf')}}, {KV})"),
    ("formats", f"token_cost(70e9, 'bf16', {KV})"),
    ("formats", f"token_cost(70e9, {{'': 16}}, {KV})"),  # a format with no name was priced
    ("kv", "token_cost(70e9, {'bf16': 16}, (80, 8, 128, 2))"),
    ("policy", "cache_key(123)"),
    ("path", "golden_verify('')"),
    ("seed", "golden_build('sources', 'golden/core/v9', seed=1.5)"),
    ("tasks", "golden_freeze('arc_easy', 'golden/arc/v1')"),
    ("margin", "golden_size('suite.yaml', 'base', 'cand', margin='0.02', alpha=0.05, power=0.8)"),
    ("alpha", "golden_size('suite.yaml', 'base', 'cand', margin=0.02, alpha=None, power=0.8)"),
    ("verdict", "card('ckpt', None)"),
    ("force", "default_model(force='yes')"),
    ("stop", "golden_new('golden/faq/v1', 'faq.jsonl', 'greedy', stop='\\n')"),
    ("max_gen_toks", "golden_new('golden/faq/v1', 'faq.jsonl', 'greedy', max_gen_toks=2.5)"),
    ("budget", "run_search('search.yaml', budget=float('nan'))"),
    ("budget", "run_search('search.yaml', budget='7.5')"),
    ("budget", "run_search('search.yaml', budget=10**400)"),  # past a float: math.isfinite overflowed
    ("max_memory", "run('recipe.yaml', max_memory=10**400)"),
    ("max_memory", "run('recipe.yaml', max_memory='9' * 400)"),  # int(float(...)) overflowed
    ("max_memory", "run('recipe.yaml', max_memory=1e300)"),  # passed, and the plan counted on it
    ("margin", "golden_size('suite.yaml', 'base', 'cand', margin=10**400, alpha=0.05, power=0.8)"),
    ("max_parallel", "run_sweep('sweep.yaml', max_parallel='4')"),
    ("address", "plan_sweep('sweep.yaml', address=5)"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """Every bad call of BAD_CALLS in one fresh process (in an empty folder): what each raised, and which heavy
    libraries were imported by the end."""
    import json

    here = tmp_path_factory.mktemp("bad-calls")
    (here / "recipe.yaml").write_text("name: r\nmethod: rtn\nscheme: W8A16\nmodel: /no/such/model\n")
    code = f"""
import json, sys, quantize
from quantize import *
from quantize.cost.bounds import KVLayout
out = {{}}
for _, call in {BAD_CALLS!r}:
    try:
        eval(call)
        out[call] = ["returned", ""]
    except quantize.UsageError as e:  # a KeywordError, naming the keyword; an unknown keyword, a plain one
        out[call] = ["UsageError", str(e)]
    except Exception as e:
        out[call] = [type(e).__name__, str(e)]
heavy = sorted(m for m in ("torch", "transformers", "lm_eval", "ray") if m in sys.modules)
print(json.dumps({{"calls": out, "heavy": heavy}}))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=here, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert [p.name for p in here.iterdir()] == ["recipe.yaml"]  # nothing written: `run(output=123)` wrote ./123
    return json.loads(run.stdout)


@pytest.mark.parametrize(("keyword", "call"), BAD_CALLS, ids=[call for _, call in BAD_CALLS])
def test_a_bad_argument_is_a_usage_error_naming_its_keyword_before_any_heavy_import(refusals, keyword, call):
    kind, message = refusals["calls"][call]
    assert kind == "UsageError", (kind, message)
    named = "unexpected keyword argument 'outptu'" if keyword == "outptu" else f"`{keyword}` takes "
    assert message.startswith(f"quantize.{call.split('(')[0]}: ") and named in message, message
    assert refusals["heavy"] == []


def test_max_memory_takes_a_size_as_the_command_line_does(tmp_path, tiny_model):
    """`max_memory="1KB"` reaches the memory plan as 1,024 bytes, which refuses the run before anything loads."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nmethod: rtn\nscheme: W8A16\nmodel: {tiny_model}\noutput: {tmp_path / 'out'}\n")
    with pytest.raises(quantize.UsageError, match=r"0\.00 GiB is available \(--max-memory\).* Nothing was loaded"):
        quantize.run(recipe, max_memory="1KB")
    assert not (tmp_path / "out").exists()


def test_score_and_gate_return_the_records_the_cli_prints(setup, tiny_model, tmp_path):
    _, suite, policy = setup
    doc = quantize.score(suite, tiny_model)
    assert isinstance(doc, ScoreDoc) and doc.tasks["core_facts"].items
    junit = tmp_path / "gate.xml"
    v = quantize.gate(policy, tiny_model, tiny_model, junit=junit)
    assert isinstance(v, Verdict) and v.verdict == "pass" and v.exit_code == 0
    assert "testcase" in junit.read_text()
    rtn = quantize.run(
        parse_recipe({"name": "rtn8", "model": str(tiny_model), "method": "rtn", "scheme": "W8A16", "group_size": 64}),
        output=tmp_path / "rtn8",
    )
    results = quantize.agree(suite, tiny_model, [tiny_model, rtn.output])  # the baseline itself is left out
    assert [c for c, _ in results] == [rtn.output] and 0 <= results[0][1].kl_mean < 0.5


def test_decode_cost_and_report(setup, tiny_model, tmp_path):
    cost = quantize.decode_cost(tiny_model)
    assert cost.checkpoint is not None and cost.formats and cost.kv_bytes_per_sequence > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = quantize.write_report([tiny_model], tmp_path / "report", suite=setup[1])
    assert (tmp_path / "report" / "report.md").is_file() and data


def test_the_examples_in_docs_api_name_only_what_exists():
    """Every Python block of docs/api.md compiles, and every `quantize.NAME` it calls is part of the API."""
    import ast
    import re

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    called = set()
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "quantize":
                called.add(node.attr)
    assert called <= set(quantize.__all__), called - set(quantize.__all__)
    assert set(quantize.api.__all__) - {"Converted", "CacheKey"} <= called  # every function has an example


def test_freezing_into_an_existing_version_is_refused_before_lm_eval_is_imported(tmp_path):
    """golden_freeze checked its `out` inside the freeze, after quiet_libraries had imported transformers and
    lm-eval (1.7 s to refuse, 0.5 s now)."""
    (tmp_path / "faq" / "v1").mkdir(parents=True)
    code = (
        "import sys, quantize\n"
        "try:\n    quantize.golden_freeze(['arc_easy'], 'faq/v1')\n"
        "except quantize.UsageError as e:\n    print('refused', 'exists' in str(e))\n"
        "print(sorted(m for m in ('torch', 'transformers', 'lm_eval') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.stdout.split("\n")[:2] == ["refused True", "[]"], run.stdout + run.stderr[-1000:]


RTN = {"name": "rtn8", "method": "rtn", "scheme": "W8A16", "group_size": 64}


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("name", "../../escaped", "a path separator"),  # ran, and wrote outputs/../../escaped
        ("scheme", "W9A16", "scheme"),  # KeyError
        ("group_size", -1, "power of two"),  # pydantic's ValidationError from compressed-tensors' own args
        ("model", 5, "model"),  # TypeError
    ],
)
def test_a_recipe_object_edited_after_parse_recipe_is_validated_again_as_a_file_is(
    tmp_path, monkeypatch, tiny_model, field, value, says
):
    monkeypatch.chdir(tmp_path)
    recipe = parse_recipe({**RTN, "model": str(tiny_model)})
    setattr(recipe, field, value)  # pydantic checks no assignment
    with pytest.raises(
        quantize.UsageError, match=f"the Recipe given to quantize.run is not a valid recipe:(.|\n)*{says}"
    ):
        quantize.run(recipe, output=None if field == "name" else tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere under it


def test_a_model_constructed_recipe_is_validated_as_a_file_is(tmp_path, tiny_model):
    """model_construct skips every validator; run checks it as it would check the same fields in a file."""
    built = type(parse_recipe({**RTN, "model": str(tiny_model)})).model_construct(
        **{**RTN, "model": str(tiny_model), "group_size": 3}
    )
    with pytest.raises(quantize.UsageError, match="group_size = 3: group_size must be a power of two"):
        quantize.run(built, output=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_memory_size_too_large_to_hold_is_refused_naming_the_flag_field_or_keyword(tmp_path, tiny_model, capsys):
    """`int(float("9" * 400))` overflowed: a traceback from argparse's type, a raw OverflowError from the API and
    exit 3 from a recipe's field. A size past 16 EiB is refused in each, named as there."""
    from quantize.cli import main

    huge = "9" * 400
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nmethod: rtn\nscheme: W8A16\nmodel: {tiny_model}\noutput: {tmp_path / 'out'}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(recipe), "--max-memory", huge])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --max-memory:" in err and "16 EiB" in err and "Traceback" not in err
    for too_much in (huge, f"{2**64 + 1}", 2**64 + 1, 1e300):
        with pytest.raises(quantize.UsageError, match="`max_memory` takes .*at most 16 EiB"):
            quantize.run(recipe, max_memory=too_much)
    recipe.write_text(recipe.read_text() + f"max_memory: '{huge}GB'\n")
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "max_memory" in err and "16 EiB" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda long: quantize.inspect(long),
        lambda long: quantize.cache_key(long),
        lambda long: quantize.golden_verify(long),
        lambda long: quantize.plan_sweep(long),
        lambda long: quantize.decode_cost(long),
    ],
    ids=["inspect", "cache_key", "golden_verify", "plan_sweep", "decode_cost"],
)
def test_a_path_that_cannot_name_a_file_is_a_usage_error_in_the_api_as_on_the_command_line(tmp_path, call):
    """The CLI mapped ENAMETOOLONG (and ELOOP, ENOTDIR, EISDIR) to exit 2 at its top; the API raised OSError."""
    with pytest.raises(quantize.UsageError, match="File name too long: .*; check the path"):
        call(str(tmp_path / ("x" * 300)))


def test_a_bad_omp_num_threads_is_refused_by_every_api_call(monkeypatch, tiny_model):
    """machine.threads() was checked only by the CLI's main: inspect answered and run converted regardless."""
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    for call in (lambda: quantize.inspect(tiny_model), lambda: quantize.default_model()):
        with pytest.raises(quantize.UsageError, match="OMP_NUM_THREADS is 'abc'"):
            call()


def test_numpy_numbers_reach_the_writers_as_python_numbers(tmp_path):
    """INT takes numbers.Integral, which numpy's int64 is; json and yaml then refused it after the checks."""
    np = pytest.importorskip("numpy")
    source = tmp_path / "gen.jsonl"
    source.write_text('{"prompt": "2+2=", "answer": "4"}\n{"prompt": "1+2=", "answer": "3"}\n')
    m = quantize.golden_new(
        tmp_path / "g" / "v1", source, "generate", stop=[np.str_("\n")], max_gen_toks=np.int64(5), seed=np.int64(3)
    )
    assert type(m.seed) is int and quantize.golden_verify(tmp_path / "g" / "v1").path == tmp_path / "g" / "v1"
    assert "max_gen_toks: 5" in next((tmp_path / "g" / "v1" / "tasks").iterdir()).read_text()


def test_default_model_refuses_force_without_prepare():
    """force=True was ignored without prepare (the folder returned unconverted), as `quantize model path --force`."""
    with pytest.raises(quantize.UsageError, match="`force` converts the default model again"):
        quantize.default_model(force=True)


def test_the_table_of_docs_api_lists_every_parameter_of_each_function():
    """The table left out `quiet` of seven functions and decode_cost's `kv` and `kv_bytes`."""
    import inspect
    import re

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| [^|]* \| `quantize\.(\w+)\((.*?)\)`", text, re.M)
    assert {name for name, _ in rows} == set(quantize.api.__all__) - {"Converted", "CacheKey"}
    for name, listed in rows:
        documented = [p.split("=")[0].strip() for p in listed.split(",") if p.strip() not in ("*", "")]
        assert documented == list(inspect.signature(getattr(quantize, name)).parameters), name


FREEZE_BESIDE_A_HUB = """
import http.server, json, os, sys, threading
seen = []
class Hub(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        seen.append(self.path)
        self.send_response(404); self.end_headers()
    do_HEAD = do_GET
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
import quantize
try:
    quantize.golden_freeze(["hub_only"], "g/v1", include_path="tasks")
    said = "returned"
except quantize.UsageError as e:
    said = str(e)
print(json.dumps({"said": said, "seen": seen}))
"""


def test_golden_freeze_reads_the_hubs_datasets_offline_as_its_message_says(tmp_path):
    """The API set no offline variable (only cli._offline did): golden_freeze asked the Hub (here a local server
    standing for it) for the dataset, then said "Freezing runs offline". It now runs offline for the call, and the
    process's environment is left as it was."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "hub_only.yaml").write_text(yaml.safe_dump(HUB_ONLY_TASK))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    run = subprocess.run(
        [sys.executable, "-c", FREEZE_BESIDE_A_HUB], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["seen"] == [] and "Freezing runs offline" in found["said"], found
