"""The memory plan (convert/memory.py): made from headers and config.json before torch is imported, it chooses the
path a run takes and refuses one that cannot fit. The checkpoints here are header-only sparse files (benchmarks/
scale.py's write_llama(sparse=True)): they claim a Llama-70B's 130 GiB and allocate nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantize.convert import memory
from quantize.convert.recipe import parse_recipe
from quantize.errors import UsageError

from conftest import quantize_child

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scale", ROOT / "benchmarks" / "scale.py")
scale = importlib.util.module_from_spec(_spec)
sys.modules["scale"] = scale  # dataclasses look their module up
_spec.loader.exec_module(scale)

GiB = 1024**3
LLAMA_70B = scale.Shape(hidden=8192, intermediate=28672, heads=64, kv_heads=8, vocab=128256)


@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> Path:
    """80 decoder layers of Llama-70B's shape, one a shard: headers only, in sparse files of their full size."""
    return scale.write_llama(tmp_path_factory.mktemp("huge") / "llama-70b", LLAMA_70B, 80, sparse=True)


def recipe(model: Path, **fields):
    return parse_recipe({"model": str(model), **fields})


FP8 = dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None)
GPTQ = dict(method="gptq", scheme="W4A16", group_size=128, calibration={"samples": 256, "seq_len": 2048})


def test_the_plan_reads_the_headers_of_a_sparse_checkpoint(huge):
    ckpt = memory.read_checkpoint(huge)
    files = list(huge.glob("*.safetensors"))
    assert len(files) == 80 and sum(f.stat().st_size for f in files) > 100 * GiB  # claimed, not allocated
    assert sum(f.stat().st_blocks for f in files) * 512 < 100 * 2**20
    # bf16: two norms, three MLP matrices, q and o (8192²), k and v (1024 × 8192: 8 KV heads of 128)
    layer = 2 * (2 * 8192 + 3 * 8192 * 28672 + 2 * 8192 * 8192 + 2 * 1024 * 8192)
    assert ckpt.largest_layer_bytes == layer
    assert ckpt.model_bytes == 80 * layer + 2 * (128256 * 8192 + 8192)
    assert ckpt.largest_shard[1] == layer + 2 * 128256 * 8192  # the first shard holds the embedding too


def test_an_in_memory_run_larger_than_the_memory_is_refused_naming_its_largest_term(huge):
    with pytest.raises(UsageError) as e:
        memory.plan(recipe(huge, **GPTQ, offload="off"), huge, max_memory=200 * GiB)
    msg = str(e.value)
    assert "in-memory path" in msg and "200.00 GiB is available (--max-memory)" in msg
    assert "the largest term is model in memory" in msg
    assert "streaming is not possible (it calibrates on data" in msg
    assert "offload its weights to disk (`offload: on`" in msg
    assert "Nothing was loaded" in msg


def test_a_calibrated_recipe_that_does_not_fit_in_memory_offloads_its_weights(huge):
    p = memory.plan(recipe(huge, **GPTQ), huge, max_memory=100 * GiB)
    assert p.path == "offloaded" and p.fits and not p.full_reload  # 130 GiB cannot be reloaded in 100
    assert p.alternatives["in-memory"] > 2 * p.model_bytes > 100 * GiB
    # one decoder layer (bf16, and two float32 working copies), not the model's 80
    assert p.terms["decoder layer onloaded (with working copies)"] == 5 * p.largest_layer_bytes
    # float32 in_features² per Linear of a layer: q, k, v, gate, up read 8192 features, o 8192, down 28672
    assert p.terms["Hessians of one layer"] == (6 * 8192**2 + 28672**2) * 4
    assert p.terms["calibration activations"] == p.activation_bytes > 0
    rec = p.record()
    assert rec.path == "offloaded" and rec.reload == "streamed" and rec.need_bytes < 40 * GiB
    # the same recipe on a machine that holds it stays in memory; `offload: on` offloads anyway
    assert memory.plan(recipe(huge, **GPTQ), huge, max_memory=10**6 * GiB).path == "in-memory"
    on = memory.plan(recipe(huge, **GPTQ, offload="on"), huge, max_memory=10**6 * GiB)
    assert on.path == "offloaded" and on.full_reload


def test_an_offloaded_run_that_cannot_fit_is_refused_naming_its_largest_term(huge):
    many = {**GPTQ, "calibration": {"samples": 1024, "seq_len": 2048}}  # 64 GiB of layer inputs and outputs
    with pytest.raises(UsageError) as e:
        memory.plan(recipe(huge, **many), huge, max_memory=50 * GiB)
    msg = str(e.value)
    assert "offloaded path" in msg and "the largest term is calibration activations" in msg
    assert "fewer calibration samples or a shorter seq_len" in msg


def test_the_offloaded_save_is_a_phase_that_holds_the_whole_output(huge):
    """transformers' save_pretrained gathers an offloaded model's compressed state dict before writing it: measured
    685 -> 1,404 MiB RSS while saving FP8 dynamic + FP8 KV of benchmarks/memory_budget.py's 1.3 GiB Llama (its
    output 810 MiB), where the plan counted one decoder layer. A 70B's W4A16 output is about 36 GiB: its save does
    not fit 20 GiB, however little the calibration holds."""
    p = memory.plan(recipe(huge, **GPTQ), huge, max_memory=100 * GiB)
    assert p.path == "offloaded" and set(p.phases) == {"conversion", "save", "streamed checks"}
    assert p.phases["save"] == p.output_bytes + p.largest_layer_bytes + memory.RUNTIME_BYTES
    assert p.need_bytes == p.phases["save"] > p.phases["conversion"] and p.record().phases["save"] == p.need_bytes
    with pytest.raises(UsageError) as e:
        memory.plan(recipe(huge, **GPTQ), huge, max_memory=20 * GiB)
    msg = str(e.value)
    assert "the largest term is save: the compressed output gathered while it is written" in msg
    assert "gathers the whole compressed output before writing it" in msg


def test_offload_on_for_a_recipe_that_cannot_offload_is_refused(huge):
    with pytest.raises(UsageError, match="offload: on, but .* it calibrates nothing"):
        memory.plan(recipe(huge, **FP8, offload="on"), huge, max_memory=10**6 * GiB)
    with pytest.raises(UsageError, match="offload: on, but .* backend gptqmodel loads the whole model"):
        memory.plan(recipe(huge, **GPTQ, offload="on", backend="gptqmodel"), huge)
    with pytest.raises(UsageError, match="offload"):
        recipe(huge, **GPTQ, offload="sometimes")


def test_calibration_activations_are_planned_and_named_when_they_dominate(tmp_path):
    small = scale.write_llama(tmp_path / "small", scale.Shape(hidden=4096, intermediate=64, vocab=64), 1, sparse=True)
    r = recipe(small, **{**GPTQ, "calibration": {"samples": 4096, "seq_len": 4096}})
    with pytest.raises(UsageError) as e:
        memory.plan(r, small, max_memory=8 * GiB)
    assert "the largest term is calibration activations" in str(e.value)
    assert "fewer calibration samples or a shorter seq_len" in str(e.value)
    # 2 × samples × seq_len × hidden × 2 bytes (bf16) + one sample's attention scores in float32
    assert memory.activation_bytes(memory.read_checkpoint(small), r, 2) == 2 * 4096 * 4096 * 4096 * 2 + 4 * 4096**2 * 4


def test_a_data_free_recipe_that_does_not_fit_in_memory_streams(huge):
    p = memory.plan(recipe(huge, **FP8), huge, max_memory=64 * GiB)
    assert p.path == "streamed" and p.fits and not p.full_reload  # 130 GiB cannot be reloaded in 64
    assert p.alternatives["in-memory"] > 2 * p.model_bytes
    assert p.terms["largest shard"] == p.largest_shard_bytes
    assert 0 < p.terms["its output"] < p.largest_shard_bytes
    rec = p.record()
    assert rec.path == "streamed" and rec.reload == "streamed" and rec.available_from == "--max-memory"
    assert rec.need_bytes == sum(rec.terms.values()) < 64 * GiB


def test_streaming_off_or_too_little_for_a_shard_is_refused(huge):
    with pytest.raises(UsageError, match="in-memory path"):
        memory.plan(recipe(huge, **FP8, streaming="off"), huge, max_memory=64 * GiB)
    with pytest.raises(UsageError) as e:
        memory.plan(recipe(huge, **FP8), huge, max_memory=2 * GiB)
    assert "streamed path" in str(e.value) and "re-shard the checkpoint" in str(e.value)


def test_streaming_on_for_a_recipe_that_cannot_stream_is_refused(huge):
    with pytest.raises(UsageError, match="cannot stream: it calibrates on data"):
        memory.plan(recipe(huge, **GPTQ, streaming="on"), huge, max_memory=10**6 * GiB)
    with pytest.raises(UsageError, match="dtype float32"):
        memory.plan(recipe(huge, **FP8, streaming="on", dtype="float32"), huge)


def test_the_recipe_max_memory_and_meminfo(tmp_path, huge):
    assert recipe(huge, **FP8, max_memory="12GB").max_memory == 12 * 10**9
    assert recipe(huge, **FP8, max_memory="1.5GiB").max_memory == 3 * 2**29
    assert recipe(huge, **FP8, max_memory=4096).max_memory == 4096
    for bad in ("12 parsecs", "-1GB", 0, "GB"):
        with pytest.raises(UsageError, match="max_memory"):
            recipe(huge, **FP8, max_memory=bad)
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemAvailable:   1234 kB\n")
    assert memory.mem_available(info) == 1234 * 1024
    info.write_text("MemTotal: 1 kB\n")
    assert memory.mem_available(info) is None
    r = recipe(huge, **FP8, max_memory="3GB")
    assert memory.available(r, None) == memory.Available(3 * 10**9, "recipe max_memory")
    assert memory.available(r, 5) == memory.Available(5, "--max-memory")


def test_quantize_run_refuses_before_torch_is_imported(tmp_path, huge):
    rfile = tmp_path / "big.yaml"
    rfile.write_text(yaml.safe_dump({"model": str(huge), "output": str(tmp_path / "out"), **GPTQ}))
    code = (
        "import sys; from quantize.cli import main; rc = main(['run', sys.argv[1], '--max-memory', '20GiB']); "
        "print('torch' in sys.modules, rc)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(rfile)], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.split() == ["False", "2"], done.stderr
    assert "would need about" in done.stderr and "20.00 GiB is available (--max-memory)" in done.stderr
    assert not (tmp_path / "out").exists()
    bad = quantize_child("run", str(rfile), "--max-memory", "lots")
    assert bad.returncode == 2 and "not a memory size" in bad.stderr


def test_an_output_larger_than_the_free_disk_is_refused(huge, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 * GiB, 9 * GiB, 1 * GiB))
    with pytest.raises(UsageError, match=r"estimated at \d+\.\d+ GiB and .* has 1.00 GiB free"):
        memory.plan(recipe(huge, **FP8), huge, max_memory=64 * GiB, out=tmp_path / "out")


# benchmarks/memory_budget.py's source: 13 layers of a 2048-wide Llama, vocabulary 32000, one layer a shard (1.3 GiB)
BUDGET_SHAPE = scale.Shape(hidden=2048, intermediate=5632, heads=16, kv_heads=4, vocab=32000)


def test_the_full_reload_check_is_a_phase_the_budget_covers(tmp_path):
    """The full reload check decompresses the whole output into the model while the output's files are mapped:
    its own phase, planned only where it fits. FP8 dynamic streamed from the benchmark's 1.3 GiB source under
    2 GiB streams the check (one tensor at a time) and the estimate covers both phases; without a budget the check
    reloads and the estimate is the reload's. Before, the reload was planned in wherever the model's bytes and the
    libraries fit (1.9 GiB < 2 GiB) while the plan estimated the run at 1.0 GiB; the run peaked at 2.5 GiB."""
    src = scale.write_llama(tmp_path / "budget", BUDGET_SHAPE, 13, sparse=True)
    r = recipe(src, **FP8, streaming="on")
    tight = memory.plan(r, src, max_memory=2 * GiB)
    assert tight.path == "streamed" and not tight.full_reload and tight.record().reload == "streamed"
    assert set(tight.phases) == {"conversion", "streamed checks"} and tight.need_bytes <= 2 * GiB
    free = memory.plan(r, src)
    reload = free.phases["full reload check"]
    assert free.full_reload and free.need_bytes == reload > free.phases["conversion"]
    # at least the model once in its dtype, the output's files and the libraries: more than the 2 GiB above
    assert reload >= free.model_bytes + free.output_bytes + memory.RUNTIME_BYTES > 2 * GiB
    assert free.record().phases == free.phases and free.record().need_bytes == reload
    # every budget is a bound: a plan either refuses or holds every phase it plans within it
    for budget in (int(g * GiB) for g in (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)):
        for streaming in ("on", "off"):
            try:
                p = memory.plan(recipe(src, **FP8, streaming=streaming), src, max_memory=budget)
            except UsageError:
                continue
            assert max(p.phases.values()) == p.need_bytes <= budget, (budget, streaming, p.phases)
