"""End to end on a tiny seeded Llama (built from a config, no download): every method, the
indivisible-layer policy, atomic output and the metadata written next to the weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from quantize import records
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.loader import meta_model
from quantize.cli import main
from quantize.convert.plan import divisor_group, plan_layers
from quantize.convert.recipe import parse_recipe
from quantize.errors import RuntimeFailure, UsageError
from quantize.records import RunRecord

CAL = {"source": "builtin:jargon", "samples": 4, "seq_len": 32, "seed": 0}


def write_recipe(tmp_path: Path, model: Path, name: str, **fields) -> Path:
    data = {"name": name, "model": str(model), "output": str(tmp_path / "out" / name), **fields}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def run_ok(recipe: Path, capsys) -> dict:
    """Run a recipe; its quantize.json, validated against the RunRecord model, as a dict."""
    assert main(["run", str(recipe), "--quiet"]) == 0, capsys.readouterr().err
    out = Path(yaml.safe_load(recipe.read_text())["output"])
    return records.read(RunRecord, out / "quantize.json").model_dump()


METHODS = {
    "rtn-w4": dict(method="rtn", scheme="W4A16", group_size=64, calibration=None),
    "gptq-w4": dict(method="gptq", scheme="W4A16", group_size=128, act_order=True, calibration=CAL),
    "awq-w4": dict(method="awq", scheme="W4A16", group_size=64, symmetric=False, awq_grid=3, calibration=CAL),
    "sq-w8a8": dict(method="smoothquant", scheme="W8A8", smoothing_strength=0.5, calibration=CAL),
    "fp8-dyn": dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None),
    "fp8-static": dict(method="fp8", scheme="FP8", calibration=CAL),
}
EXPECTED_FORMAT = {
    "rtn-w4": "pack-quantized",
    "gptq-w4": "pack-quantized",
    "awq-w4": "pack-quantized",
    "sq-w8a8": "int-quantized",
    "fp8-dyn": "float-quantized",
    "fp8-static": "float-quantized",
}


@pytest.mark.parametrize("name", list(METHODS))
def test_method_end_to_end(tmp_path, tiny_model, capsys, name):
    import torch
    from transformers import AutoModelForCausalLM

    meta = run_ok(write_recipe(tmp_path, tiny_model, name, **METHODS[name]), capsys)
    out = tmp_path / "out" / name
    # the checkpoint reloads with plain transformers and gives finite logits
    model = AutoModelForCausalLM.from_pretrained(str(out))
    logits = model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits
    assert torch.isfinite(logits).all()
    # the metadata agrees with an independent read of the saved headers
    report = bits_report(out)
    assert meta["bits"]["format"] == f"compressed-tensors {EXPECTED_FORMAT[name]}"
    assert meta["bits"]["total_bytes"] == report.total_bytes
    assert report.parameters == meta["source_model"]["parameters"] == bits_report(tiny_model).parameters
    assert meta["bits"]["bits_per_weight"] == pytest.approx(8 * report.total_bytes / report.parameters)
    assert meta["bits"]["bits_per_weight"] < 16
    assert meta["layer_plan"]["quantized_layers"] == 14  # 7 linears × 2 layers, lm_head ignored
    # the one finiteness check ran on the reloaded checkpoint, over the probe (two calibration rows, or a sentence)
    [check] = meta["finite_checks"]
    assert check["stage"].startswith("after reloading the saved checkpoint") and check["finite"]
    rows = 2 if METHODS[name]["calibration"] else 1
    assert check["rows"] == rows and check["tokens"] >= rows and 0 < check["max_abs_logit"] < 1e4
    assert (out / "README.md").read_text().count(f"{meta['bits']['bits_per_weight']:.3f}") == 1


def test_group_bits_are_what_the_closed_form_says(tmp_path, tiny_model, capsys):
    """RTN symmetric int4, g64 on every layer: 4 + 16/64 bits per quantized weight (+ tiny weight_shape)."""
    meta = run_ok(write_recipe(tmp_path, tiny_model, "closed", **METHODS["rtn-w4"]), capsys)
    q = meta["bits"]["quantized_linear_bits_per_weight"]
    assert 4.25 <= q < 4.25 + 0.01


def test_metadata_fields(tmp_path, tiny_model, capsys):
    meta = run_ok(write_recipe(tmp_path, tiny_model, "meta", **METHODS["gptq-w4"]), capsys)
    assert meta["schema_version"] == 1
    assert len(meta["recipe"]["sha256"]) == 64 and meta["recipe"]["resolved"]["group_size"] == 128
    assert len(meta["source_model"]["weights_sha256"]) == 64 and len(meta["weights_sha256"]) == 64
    cal = meta["calibration"]
    assert cal["samples"] == 4 and cal["seq_len"] == 32 and cal["tokens"] == 128 and len(cal["token_sha256"]) == 64
    assert meta["seed"] == 0
    for lib in ("quantize", "torch", "transformers", "llmcompressor", "compressed-tensors", "lm_eval"):
        assert meta["versions"][lib], lib
    assert meta["time_seconds"]["total"] > 0 and meta["time_seconds"]["quantize"] > 0
    assert meta["memory"]["peak_rss_bytes"] > 10 * 2**20
    # 192 input features: group 128 does not divide, smaller-group takes 64 for down_proj
    assert meta["layer_plan"]["by_group_size"] == {"128": 12, "64": 2}
    # act_order uses static groups: columns are processed by decreasing diag(H), no g_idx is stored
    assert "group_index" not in meta["bits"]["bytes_by_role"]
    # what ran is llm-compressor's own recipe YAML, and it loads back into the same modifiers
    from llmcompressor.recipe import Recipe as LlmcRecipe

    reloaded = LlmcRecipe.create_instance(meta["engine"]["modifiers"])
    (gptq,) = reloaded.modifiers
    assert type(gptq).__name__ == "GPTQModifier" and str(gptq.actorder).lower().endswith("weight")
    assert LlmcRecipe.from_modifiers(reloaded.modifiers).yaml() == meta["engine"]["modifiers"]


def test_calibration_hash_is_deterministic(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    from quantize.convert.calibration import build_calibration
    from quantize.convert.recipe import Calibration

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    a = build_calibration(tok, Calibration(**CAL))
    b = build_calibration(tok, Calibration(**CAL))
    c = build_calibration(tok, Calibration(**{**CAL, "seed": 1}))
    assert a.record.token_sha256 == b.record.token_sha256 != c.record.token_sha256
    assert tuple(a.input_ids.shape) == (4, 32)


def test_too_little_calibration_text(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    from quantize.convert.calibration import build_calibration
    from quantize.convert.recipe import Calibration

    src = tmp_path / "small.txt"
    src.write_text("just a few words\n\nand a few more")
    with pytest.raises(UsageError, match="fewer than samples"):
        build_calibration(
            AutoTokenizer.from_pretrained(str(tiny_model)), Calibration(source=str(src), samples=4, seq_len=32)
        )


# --- indivisible policy -------------------------------------------------------------------------


def plan(tiny_model, **fields):
    r = parse_recipe({"method": "rtn", "scheme": "W4A16", "group_size": 128, "calibration": None, **fields})
    return plan_layers(meta_model(tiny_model, False), r, linearize_experts=True)  # a dense model: no experts


def test_divisor_group():
    assert divisor_group(576, 128) == 64 and divisor_group(1536, 128) == 128 and divisor_group(96, 128) == 32
    assert divisor_group(7, 128) is None and divisor_group(100, 128) is None  # 4 is below the smallest group


def test_indivisible_smaller_group(tiny_model):
    p = plan(tiny_model, indivisible="smaller-group")
    assert len(p.groups[64]) == 2 and all(n.endswith("down_proj") for n in p.groups[64]) and not p.kept


def test_indivisible_keep(tiny_model):
    p = plan(tiny_model, indivisible="keep")
    assert 64 not in p.groups and sorted(p.kept) == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]


def test_indivisible_error(tiny_model):
    with pytest.raises(UsageError, match="indivisible: smaller-group"):
        plan(tiny_model, indivisible="error")


def test_kept_layers_are_16_bit_in_the_checkpoint(tmp_path, tiny_model, capsys):
    meta = run_ok(
        write_recipe(tmp_path, tiny_model, "keep", **{**METHODS["rtn-w4"], "group_size": 128, "indivisible": "keep"}),
        capsys,
    )
    assert set(meta["layer_plan"]["kept_16bit"]) == {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
    rows = {m["module"]: m for m in meta["bits"]["modules"]}
    assert rows["model.layers.0.mlp.down_proj"]["format"] == "bf16"
    # 128 input features and group 128: one scale per output row, which the header shows as per-channel
    assert rows["model.layers.0.mlp.up_proj"]["format"] == "int4 per-channel"


def test_targets_matching_nothing(tiny_model):
    with pytest.raises(UsageError, match="match no Linear layer"):
        plan(tiny_model, targets=["re:.*nothing_here"])


@pytest.mark.parametrize(
    "override,fields",
    [
        ({"targets": ["re:.*nothing_here"], "scheme": "keep"}, {}),
        ({"targets": ["re:.*q_proj"], "scheme": "W8A16"}, {"ignore": ["lm_head", "re:.*q_proj"]}),
    ],
    ids=["no-such-layer", "only-ignored-layers"],
)
def test_an_override_that_matches_no_quantized_layer_is_refused(tiny_model, override, fields):
    """An override whose targets match no layer, or only ignored ones, did nothing and said nothing (a review)."""
    with pytest.raises(UsageError, match="overrides.0.targets .* match no layer the recipe quantizes"):
        plan(tiny_model, overrides=[override], **fields)
    assert plan(tiny_model, overrides=[{"targets": ["re:.*q_proj"], "scheme": "keep"}]).kept  # one that matches


# --- atomic output ------------------------------------------------------------------------------


def test_a_calibrated_run_lets_the_model_go_before_the_reload_check(tmp_path, tiny_model, capsys, monkeypatch):
    """llm-compressor's sequential pipeline registers namespaces holding the model in torch.fx's wrap table
    (quantize/compat/llmcompressor.py): unless they are dropped, the quantized model and the source's mapped pages
    stay resident while the reload check loads a second copy, and the memory plan's phases do not hold."""
    import gc
    import weakref

    from quantize.compat.torch import wrap_table
    from quantize.convert import engine
    from quantize.convert.backends.llmcompressor import LLMCompressorBackend

    table = wrap_table()
    table_before = set(table)
    refs, alive = [], []
    own_quantize, own_reload = LLMCompressorBackend.quantize, engine.reload_check

    def quantize(self, job):
        refs.append(weakref.ref(job.model))
        return own_quantize(self, job)

    def reload_check(*args, **kwargs):
        gc.collect()
        alive.append(refs[0]() is not None)
        return own_reload(*args, **kwargs)

    monkeypatch.setattr(LLMCompressorBackend, "quantize", quantize)
    monkeypatch.setattr(engine, "reload_check", reload_check)
    fields = {**METHODS["fp8-dyn"], "kv_cache": {"scheme": "FP8"}, "calibration": CAL}
    run_ok(write_recipe(tmp_path, tiny_model, "kv", **fields), capsys)
    assert alive == [False]
    assert set(table) == table_before


def test_the_streamed_structure_check_expects_the_kv_cache_scales(tmp_path, tiny_model, capsys):
    """An FP8 KV cache stores k_scale and v_scale on every attention module: the check of an output too large to
    reload accepts them, and names one that is missing."""
    from safetensors.torch import load_file, save_file

    from quantize.convert.checks import structure_check

    fields = {**METHODS["fp8-dyn"], "kv_cache": {"scheme": "FP8"}, "calibration": CAL}
    run_ok(write_recipe(tmp_path, tiny_model, "kvs", **fields), capsys)
    out = tmp_path / "out" / "kvs"
    quantized = {n for names in plan(tiny_model).groups.values() for n in names}  # the same targets as FP8
    structure_check(out, tiny_model, quantized, False)
    shard = out / "model.safetensors"
    tensors = load_file(shard)
    assert "model.layers.0.self_attn.k_scale" in tensors
    del tensors["model.layers.0.self_attn.k_scale"]
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(RuntimeFailure, match=r"model.layers.0.self_attn.k_scale \(the KV cache's quantization"):
        structure_check(out, tiny_model, quantized, False)


def test_failed_run_leaves_nothing(tmp_path, tiny_model, capsys, monkeypatch):
    import quantize.convert.engine as engine

    def boom(*a, **k):
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(engine, "reload_check", boom)
    recipe = write_recipe(tmp_path, tiny_model, "atomic", **METHODS["rtn-w4"])
    assert main(["run", str(recipe), "--quiet"]) == 3
    assert "disk full" in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == []  # no target, no leftover temporary folder


def test_existing_output_refused_then_forced(tmp_path, tiny_model, capsys):
    recipe = write_recipe(tmp_path, tiny_model, "twice", **METHODS["fp8-dyn"])
    first = run_ok(recipe, capsys)
    assert main(["run", str(recipe), "--quiet"]) == 2
    assert "already exists" in capsys.readouterr().err
    recipe.write_text(recipe.read_text() + "description: the second run\n")
    assert main(["run", str(recipe), "--quiet", "--force"]) == 0
    second = records.read(RunRecord, tmp_path / "out" / "twice" / "quantize.json")
    # the folder now holds the second run: its recipe, not the first one's
    assert (
        second.recipe.resolved["description"] == "the second run" and second.recipe.sha256 != first["recipe"]["sha256"]
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["twice"]


def test_nonfinite_model_is_refused_with_the_layer_named(tmp_path, tiny_model, capsys):
    """A source whose layer 1 MLP produces inf: the run fails (exit 3), names the layer, saves nothing."""
    import torch
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    w = load_file(str(broken / "model.safetensors"))
    w["model.layers.1.mlp.up_proj.weight"] = torch.full_like(w["model.layers.1.mlp.up_proj.weight"], float("inf"))
    save_file(w, str(broken / "model.safetensors"), metadata={"format": "pt"})
    recipe = write_recipe(tmp_path, broken, "nan", **METHODS["fp8-dyn"])
    assert main(["run", str(recipe), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "not finite" in err and "model.layers.1.mlp" in err
    assert not (tmp_path / "out" / "nan").exists()


def test_weights_hash_is_hashed_once_and_follows_rewrites(tmp_path, monkeypatch):
    import hashlib

    from quantize.checkpoint import loader as models

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    f = ckpt / "model.safetensors"
    f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")

    def lines() -> str:  # one "NAME SHA256" line per file, as a Hub snapshot's blob names give
        return hashlib.sha256(f"model.safetensors {hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode()).hexdigest()

    expected = lines()
    reads = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: (reads.append(self.name), real_open(self, *a, **k))[1])
    assert models.weights_sha256(ckpt) == expected
    assert models.weights_sha256(ckpt) == expected
    assert reads.count("model.safetensors") == 1  # the second call is served from the memo
    f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}       ")  # rewritten: another size and mtime
    assert models.weights_sha256(ckpt) == lines() != expected


def test_the_default_calibration_dtype_depends_on_the_recipe_and_checkpoint_only(tmp_path, monkeypatch):
    """No probe and no device decides the dtype: a bf16 checkpoint calibrates in its own dtype on a CPU fast or slow
    in bf16 and on an accelerator; AWQ in float32 everywhere; the recipe's `dtype:` wins. The probe only adds a
    suggestion to the reason, on a CPU slow in bf16."""
    from quantize.convert import dtypes

    (tmp_path / "config.json").write_text('{"dtype": "bfloat16"}')
    speed = {"x": 6.0}
    monkeypatch.setattr(dtypes, "machine_bf16_speedup", lambda: (speed["x"], True))

    def choice(method: str = "gptq-w4", **fields) -> tuple[str, str]:
        recipe = parse_recipe({"name": "r", "model": str(tmp_path), "output": "o", **METHODS[method], **fields})
        return dtypes.calibration_dtype(recipe, tmp_path)

    for dev in ("cpu", "cuda"):
        monkeypatch.setattr(dtypes, "device", lambda dev=dev: dev)
        for x in (6.0, 0.17, dtypes.BF16_FAST - 0.01):
            speed["x"] = x
            dtype, reason = choice()
            assert dtype == "auto", (dev, x)
            assert ("dtype: float32" in reason) == (dev == "cpu" and x < dtypes.BF16_FAST), (dev, x, reason)
            assert choice("awq-w4")[0] == "float32" and choice(dtype="bfloat16")[0] == "bfloat16"
    (tmp_path / "config.json").write_text('{"torch_dtype": "float32"}')
    speed["x"] = 0.17
    assert choice() == ("auto", "the checkpoint's own dtype (float32); the default, the same on every machine")


def test_two_machines_probes_cannot_change_a_recipes_bytes(tmp_path, tiny_model, capsys, monkeypatch):
    """The same GPTQ recipe on a bf16 checkpoint, once as on a CPU fast in bf16 and once as on one slow in it:
    the same weights, byte for byte, and the slow one's quantize.json says what the probe suggested."""
    from quantize.convert import dtypes

    metas = {}
    for name, x in (("fast", 6.3), ("slow", 0.17)):
        monkeypatch.setattr(dtypes, "machine_bf16_speedup", lambda x=x: (x, True))
        monkeypatch.setattr(dtypes, "device", lambda: "cpu")
        metas[name] = run_ok(write_recipe(tmp_path, tiny_model, name, **METHODS["gptq-w4"]), capsys)
    assert metas["fast"]["weights_sha256"] == metas["slow"]["weights_sha256"]
    assert metas["fast"]["engine"]["calibration_dtype"] == metas["slow"]["engine"]["calibration_dtype"] == "auto"
    assert "dtype: float32" in metas["slow"]["engine"]["calibration_dtype_reason"]
    assert "dtype: float32" not in metas["fast"]["engine"]["calibration_dtype_reason"]


def test_the_bf16_probe_is_taken_once_per_boot(tmp_path, monkeypatch):
    """Measured by the first conversion after a boot and kept: a later one (a sweep's worker beside another job)
    decides alike without timing anything; another boot, or a kept value that is not a speed-up, is measured again."""
    from quantize import cache
    from quantize.convert import dtypes

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    timings = iter([2.3, 1.2, 4.0])
    monkeypatch.setattr(dtypes, "bf16_speedup", lambda: next(timings))
    assert dtypes.machine_bf16_speedup() == (2.3, True)
    assert dtypes.machine_bf16_speedup() == (2.3, False)  # not 1.2: the first timing stands
    monkeypatch.setattr(cache, "boot_id", lambda: "after-a-reboot")
    assert dtypes.machine_bf16_speedup() == (1.2, True)
    dtypes._probe_path("bf16-speedup").write_text('{"value": "fast"}')
    assert dtypes.machine_bf16_speedup() == (4.0, True)


def test_bf16_probe_is_a_ratio_of_two_timings(monkeypatch):
    """t_fp32 / t_bf16 on a stand-in for the matmul that takes 3 ms in float32 and 1 ms in bfloat16: about 3."""
    import time

    import torch

    from quantize.convert.dtypes import bf16_speedup

    def timed_linear(x, w):
        time.sleep(0.003 if x.dtype == torch.float32 else 0.001)

    monkeypatch.setattr(torch.nn.functional, "linear", timed_linear)
    assert bf16_speedup(tokens=4, d_in=8, d_out=8, repeats=3) == pytest.approx(3.0, rel=0.3)


def test_a_float32_calibration_is_saved_in_the_source_dtype(tmp_path, tiny_model, capsys):
    """`dtype: float32` on a bf16 source: calibrated in float32, then every float tensor cast back to bf16
    (cast_saved_floats), so the checkpoint has the bytes of a bf16-calibrated one and reloads as bf16."""
    from quantize.checkpoint.headers import read_header

    fields = dict(method="rtn", scheme="W4A16", group_size=64, calibration=None)
    meta32 = run_ok(write_recipe(tmp_path, tiny_model, "fp32", **fields, dtype="float32"), capsys)
    meta16 = run_ok(write_recipe(tmp_path, tiny_model, "bf16", **fields, dtype="bfloat16"), capsys)
    assert meta32["engine"]["calibration_dtype"] == "float32" and meta32["engine"]["saved_dtype"] == "bfloat16"
    tensors, _, _ = read_header(tmp_path / "out" / "fp32" / "model.safetensors")
    floats = {t.dtype for t in tensors.values() if t.dtype.startswith(("F", "BF"))}
    assert floats == {"BF16"}, floats  # no float32 scale, norm or embedding left
    assert meta32["bits"]["total_bytes"] == meta16["bits"]["total_bytes"]
    assert json.loads((tmp_path / "out" / "fp32" / "config.json").read_text())["dtype"] == "bfloat16"


def test_the_plan_names_exactly_the_layers_the_checkpoint_quantized(tmp_path, tiny_model, capsys):
    """The layer plan (compressed-tensors' matcher over targets and ignore, on the meta model) against the saved
    checkpoint's own payload tensors: regex targets and ignores give the same set on both sides."""
    fields = dict(
        method="rtn",
        scheme="W4A16",
        group_size=64,
        calibration=None,
        targets=["re:.*mlp\\..*_proj$", "re:.*self_attn\\.q_proj$"],
        ignore=["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"],
    )
    recipe = write_recipe(tmp_path, tiny_model, "regex", **fields)
    plan = plan_layers(meta_model(tiny_model, False), parse_recipe(yaml.safe_load(recipe.read_text())), True)
    run_ok(recipe, capsys)
    stored = {m.module for m in bits_report(tmp_path / "out" / "regex").modules if "payload" in m.roles}
    planned = {n for names in plan.groups.values() for n in names}
    assert planned == stored and len(stored) == 2 * 4 - 1  # q_proj and three MLP projections per layer, one ignored


def test_offloaded_gptq_writes_the_same_weights_as_in_memory(tmp_path, tiny_model, capsys):
    """`offload: on`: the weights load onto disk (compressed-tensors' DiskCache in a folder beside the output,
    removed afterwards) and the sequential pipeline calibrates one decoder layer at a time: the same weights, byte
    for byte, as the in-memory run (whose GPTQ runs the same sequential pipeline), and the path recorded."""
    mem = run_ok(write_recipe(tmp_path, tiny_model, "mem", **METHODS["gptq-w4"]), capsys)
    off = run_ok(write_recipe(tmp_path, tiny_model, "off", offload="on", **METHODS["gptq-w4"]), capsys)
    assert mem["memory_plan"]["path"] == "in-memory" and off["memory_plan"]["path"] == "offloaded"
    assert "Hessians of one layer" in off["memory_plan"]["terms"]
    assert off["memory_plan"]["reload"] == "full" and off["finite_checks"][0]["rows"] > 0  # it fits: reloaded
    assert off["weights_sha256"] == mem["weights_sha256"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mem", "off"]  # no offload folder left


def test_gptqmodel_refuses_kept_layers_for_what_they_are(tmp_path, monkeypatch):
    """The gptqmodel backend refuses, before loading, a plan it cannot write for transformers: a layer whose input
    features the group does not divide is named as such; an MoE's router kept at 16 bits is named as kept (it was
    reported as an indivisible layer, though its 128 features are a multiple of 64); a family GPTQModel defuses
    (read from its defuser's registry, which needs `make gptq-env`: stood in for here; the real registry is
    tested in tests/checkpoint/test_foreign.py) is named with what to use instead."""
    from quantize.convert.backends import gptqmodel as backend
    from quantize.convert.backends.gptqmodel import GPTQModelBackend

    monkeypatch.setattr(backend, "defused", lambda model_type: model_type == "phi3")  # the name the backend binds
    from quantize.convert.plan import ROUTER_REASON, LayerPlan
    from quantize.convert.recipe import parse_recipe

    r = parse_recipe(
        {"name": "g", "model": str(tmp_path), "output": str(tmp_path / "o"), "method": "gptq", "scheme": "W4A16",
         "group_size": 64, "backend": "gptqmodel", "calibration": CAL}
    )  # fmt: skip
    ok = LayerPlan(groups={64: ["model.layers.0.mlp.up_proj"]})
    assert GPTQModelBackend().prepare(r, ok) is None
    router = LayerPlan(groups={64: ["model.layers.0.mlp.up_proj"]}, kept={"model.layers.0.mlp.gate": ROUTER_REASON})
    with pytest.raises(UsageError, match=r"keeps 1 layer\(s\) at 16 bits \(e\.g\. model\.layers\.0\.mlp\.gate: router"):
        GPTQModelBackend().prepare(r, router)
    odd = LayerPlan(groups={64: ["a"]}, kept={"b": "in_features 96 is not divisible by 64"})
    with pytest.raises(UsageError, match="input features the group does not divide"):
        GPTQModelBackend().prepare(r, odd)
    phi3 = LayerPlan(groups={64: ["model.layers.0.mlp.gate_up_proj"]}, model_type="phi3")
    with pytest.raises(UsageError, match=r"phi3 model: .*gate_up_proj.*backend: llmcompressor"):
        GPTQModelBackend().prepare(r, phi3)
    assert GPTQModelBackend().prepare(r, LayerPlan(groups=ok.groups, model_type="llama")) is None


@pytest.mark.parametrize("streaming", ["off", "on"], ids=["in-memory", "streamed"])
def test_the_sources_hash_is_its_bytes_never_a_file_beside_them(tmp_path, tiny_model, capsys, streaming):
    """quantize.json's source_model.weights_sha256 was the text of a `weights.sha256` file in the model folder,
    unchecked: left stale after the weights changed, a sweep reused the old weights' output and gated it against
    the new baseline; linked to another file, its text (a token) was written into quantize.json and the card (a
    review's repros). The hash is the weights' own, on both paths and in the sweep's reuse check."""
    from quantize.checkpoint.files import weights_sha256
    from quantize.convert.recipe import load_recipe
    from quantize.sweep.tasks import source_weights

    model = shutil.copytree(tiny_model, tmp_path / "model")
    (model / "weights.sha256").write_text("f" * 64 + "\n")
    fields = {**METHODS["fp8-dyn"], "streaming": streaming}
    recipe = write_recipe(tmp_path, model, "hashed", **fields)
    meta = run_ok(recipe, capsys)
    assert meta["source_model"]["weights_sha256"] == weights_sha256(model) != "f" * 64
    assert source_weights(load_recipe(recipe)[0], None) == weights_sha256(model)


@pytest.mark.parametrize("how", ["config", "side-file"])
@pytest.mark.parametrize("streaming", ["on", "off"])
def test_an_already_quantized_model_is_refused_before_anything_loads(tmp_path, tiny_model, capsys, how, streaming):
    """An FP8 output given as `model:` ended in exit 3 after the load on both paths (a review): no modifier takes a
    quantizer's modules."""
    src = tmp_path / "quantized"
    shutil.copytree(tiny_model, src)
    if how == "config":
        cfg = json.loads((src / "config.json").read_text())
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized"}
        (src / "config.json").write_text(json.dumps(cfg))
    else:
        (src / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    recipe = write_recipe(tmp_path, src, "again", method="fp8", scheme="FP8_DYNAMIC", streaming=streaming)
    assert main(["run", str(recipe), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is already quantized" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_stored_copy_of_a_tied_weight_is_refused_before_streaming_and_converts_in_memory(
    tmp_path, tiny_model, capsys
):
    """A tied embedding with `lm_head.weight` saved beside it: the streamed path wrote the copy and failed its own
    structure check after the whole conversion, exit 3, where the in-memory path converts (a review)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    src = tmp_path / "tied"
    shutil.copytree(tiny_model, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    tensors = load_file(src / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    fields = dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None)
    assert main(["run", str(write_recipe(tmp_path, src, "on", streaming="on", **fields)), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "stores lm_head.weight, which config.json ties" in err and "streaming: off" in err, err
    assert not (tmp_path / "out" / "on").exists()
    meta = run_ok(write_recipe(tmp_path, src, "off", streaming="off", **fields), capsys)
    assert meta["memory_plan"]["path"] == "in-memory"
    with safe_open(tmp_path / "out" / "off" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # transformers tied the equal copy: saved once, as the embedding
