"""Our per-expert loader of compressed-tensors MoE checkpoints (quantize/checkpoint/decompressed.py), on tiny seeded
models (tests/moe_models.py, tests/families.py) converted by `quantize run`:

- where transformers' own loader reads the checkpoint (RELOADED families, FP8 dynamic and GPTQ W4A16), ours holds
  the same numbers: every tensor outside the experts equal, every expert's weight equal once rounded to bf16 as
  transformers' DecompressExperts rounds it, and the logits equal (float32, |diff| <= LOGITS_ATOL) once our experts
  compute as transformers' do (that rounding, and without the experts' dynamic activation quantization, which
  transformers' fused experts drop and ours keep);
- a layout transformers misreads (one expert stored at 16 bits among FP8 ones) is read as stored;
- the formats transformers misreads or drops part of on experts (NVFP4, NVFP4A16, FP8 static's input scales, FP8
  block past one block: docs/moe.md) convert, pass the
  reload check through our loader, hold the dequantization compressed-tensors itself gives of the stored tensors,
  and are scored by `quantize eval` and a gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from families import build
from moe_models import make_tiny_moe

from quantize import records
from quantize.checkpoint import loader
from quantize.checkpoint.expert_names import ModelNames
from quantize.checkpoint.files import reads_per_expert
from quantize.cli import main
from quantize.errors import UsageError
from quantize.records import Verdict

from conftest import ROOT, small_golden, suite_file

CAL = {"source": "builtin:jargon", "samples": 2, "seq_len": 32, "seed": 0}
RECIPES = {
    "fp8": dict(method="fp8", scheme="FP8_DYNAMIC", calibration=None),
    "gptq": dict(method="gptq", scheme="W4A16", group_size=128, indivisible="smaller-group", calibration=CAL),
    "nvfp4": dict(method="rtn", scheme="NVFP4", calibration=CAL),
    "nvfp4a16": dict(method="rtn", scheme="NVFP4A16", calibration=None),
    "fp8-static": dict(method="fp8", scheme="FP8", calibration=CAL),
    "fp8-block": dict(method="rtn", scheme="FP8_BLOCK", calibration=None),
}
RELOADED = ("qwen3_moe", "olmoe", "deepseek_v3", "mixtral")  # tests/convert/test_moe.py: transformers reloads them
# measured 2026-12-06 (float32, CPU): at most 1.5e-7 on every family and both formats (0 on DeepSeek-V3); a misplaced
# expert or a dropped scale moves them by more than 1e-3
LOGITS_ATOL = 1e-6
IDS = [[1, 5, 9, 2, 17, 33, 4, 8, 40, 3]]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """`converted(family, recipe)`: the tiny `family` MoE (tests/moe_models.py; "families:NAME" for
    tests/families.py's, whose 128 features fit FP8 block) converted with RECIPES[recipe], built once."""
    base = tmp_path_factory.mktemp("decompressed")
    sources: dict[str, Path] = {}
    outs: dict[tuple[str, str], Path] = {}

    def get(family: str, recipe: str) -> Path:
        if family not in sources:
            name = family.removeprefix("families:")
            where = base / "src" / family.replace(":", "-")
            sources[family] = build(name, where) if family.startswith("families:") else make_tiny_moe(where, name)
        if (family, recipe) not in outs:
            out = base / "out" / f"{family.replace(':', '-')}-{recipe}"
            p = base / f"{out.name}.yaml"
            fields = {"name": out.name, "model": str(sources[family]), "output": str(out), "targets": ["Linear"]}
            p.write_text(yaml.safe_dump(fields | {"ignore": ["lm_head"]} | RECIPES[recipe]))
            assert main(["run", str(p), "--quiet"]) == 0
            outs[family, recipe] = out
        return outs[family, recipe]

    get.sources = sources  # type: ignore[attr-defined]
    return get


def _transformers_own(path: Path):
    """transformers' own loader in float32, every tensor it holds in float32 (it leaves dequantized experts, and
    Mixtral's router, in bf16)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    for p in model.parameters():
        if p.dtype == torch.bfloat16:
            p.data = p.data.float()
    return model.eval()


def _expert_slices(ref, name: str, param):
    """(our per-expert parameter name, transformers' tensor for it) of one fused expert parameter."""
    module = name.rpartition(".")[0]
    for e in range(param.shape[0]):
        if name.endswith("gate_up_proj"):
            half = param.shape[1] // 2
            yield f"{module}.{e}.gate_proj.weight", param[e, :half]
            yield f"{module}.{e}.up_proj.weight", param[e, half:]
        else:
            yield f"{module}.{e}.down_proj.weight", param[e]


@pytest.mark.parametrize("family", RELOADED)
@pytest.mark.parametrize("method", ["fp8", "gptq"])
def test_our_loader_holds_what_transformers_own_loader_holds(converted, family, method):
    import torch

    out = converted(family, method)
    assert reads_per_expert(out)
    ours, _ = loader.load_model(out, dtype=torch.float32)
    ref = _transformers_own(out)
    ids = torch.tensor(IDS)
    with torch.no_grad():  # transformers decompresses its dense layers on the first forward pass
        theirs = ref(input_ids=ids).logits
        kept = ours(input_ids=ids).logits
    held = dict(ours.named_parameters())
    experts = 0
    for name, param in ref.named_parameters():
        if name in held:
            assert torch.equal(held[name], param), name
            continue
        assert param.ndim == 3 and ".mlp.experts." in name, name  # only the fused experts are laid out otherwise
        for ours_name, fused in _expert_slices(ref, name, param):
            assert torch.equal(held[ours_name].bfloat16().float(), fused), ours_name
            experts += 1
    assert experts == 3 * 4 * (1 if family == "deepseek_v3" else 2)  # gate, up, down of 4 experts per MoE layer
    with torch.no_grad():
        for name, module in ours.named_modules():  # our experts as transformers computes its own
            if ".experts." in name and getattr(module, "quantization_scheme", None) is not None:
                module.quantization_enabled = False
                module.weight.data = module.weight.data.bfloat16().float()
        assert (ours(input_ids=ids).logits - theirs).abs().max().item() <= LOGITS_ATOL
    if method == "fp8":  # FP8 dynamic: our experts round their inputs to FP8, as the format says
        assert (kept - theirs).abs().max().item() > 1e-4


def test_an_expert_stored_at_16_bits_among_fp8_ones_is_our_failure(tmp_path, converted, monkeypatch, capsys):
    """The backend skips one expert (planted): the checkpoint would store it at 16 bits, unquantized in its config,
    among FP8 ones. Our loader could read that, but no engine does (transformers stacks a layer's experts under one
    scheme, vLLM reads every expert with expert 0's): the run's own check refuses its output, exit 3 naming the
    expert's missing scale, and nothing is kept."""
    import re

    import quantize.convert.backends.llmcompressor as backend

    planted = "model.layers.1.mlp.experts.2.down_proj"
    compile_modifiers = backend.compile_modifiers

    def skipping(recipe, plan):
        mods = compile_modifiers(recipe, plan)
        for group in mods[0].config_groups.values():
            group.targets = [t for t in group.targets if t != f"re:^{re.escape(planted)}$"]
        return mods

    converted("qwen3_moe", "fp8")  # the source built (and its plain conversion, before the backend is planted)
    src = converted.sources["qwen3_moe"]
    monkeypatch.setattr(backend, "compile_modifiers", skipping)
    p = tmp_path / "planted.yaml"
    fields = {"name": "planted", "model": str(src), "output": str(tmp_path / "planted"), "targets": ["Linear"]}
    p.write_text(yaml.safe_dump(fields | {"ignore": ["lm_head"]} | RECIPES["fp8"]))
    assert main(["run", str(p), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert f"{planted}.weight_scale is missing (the other experts hold it)" in err, err
    assert "quantize's failure" in err and not (tmp_path / "planted").exists()


def test_an_expert_its_config_quantizes_but_stored_without_its_scale_is_refused(tmp_path, converted):
    """The checkpoint's config says FP8 for every expert, and one is stored at 16 bits with no scale: the load is
    strict (exit 2 naming the missing scale and the weight in the wrong dtype), never a weight read without it."""
    import shutil

    from safetensors.torch import load_file, save_file

    planted = "model.layers.1.mlp.experts.2.down_proj"
    mixed = tmp_path / "mixed"
    shutil.copytree(converted("qwen3_moe", "fp8"), mixed)
    tensors = load_file(mixed / "model.safetensors")
    scale = tensors.pop(f"{planted}.weight_scale")
    tensors[f"{planted}.weight"] = (tensors[f"{planted}.weight"].float() * scale.float()).bfloat16()
    save_file(tensors, mixed / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UsageError, match="do not match config.json or each other") as e:
        loader.load_model(mixed)  # from the headers, before anything loads
    assert f"{planted}.weight_scale is missing (the other experts hold it)" in str(e.value)
    assert f"{planted}.weight has shape" in str(e.value)  # 16-bit where its fellows are FP8


@pytest.mark.parametrize(
    ("family", "recipe", "activations"),
    [
        ("qwen3_moe", "nvfp4", "input_global_scale"),
        ("qwen3_moe", "nvfp4a16", None),
        ("qwen3_moe", "fp8-static", "input_scale"),
        ("families:qwen3_moe", "fp8-block", None),  # hidden 128: FP8 block's 128-wide blocks fit
    ],
)
def test_a_format_transformers_cannot_reload_on_experts_is_read_as_compressed_tensors_decompresses_it(
    converted, family, recipe, activations
):
    """The conversion passes (its reload check reads the output through our loader); each expert holds the weight
    compressed-tensors' own decompression gives of its stored tensors (bit for bit, in the checkpoint's bf16), and
    a static activation scale of the format is loaded where it is stored."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors import safe_open

    out = converted(family, recipe)
    qc = QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    model, _ = loader.load_model(out)
    checked = 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        for layer in range(2):
            for e in range(4):
                module = f"model.layers.{layer}.mlp.experts.{e}.down_proj"
                scheme = model.get_submodule(module).quantization_scheme
                state = {k[len(module) + 1 :]: f.get_tensor(k) for k in keys if k.startswith(f"{module}.")}
                dense = BaseCompressor.get_value_from_registry(scheme.format).decompress(state, scheme)["weight"]
                assert torch.equal(model.get_submodule(module).weight, dense), module
                if activations:
                    assert torch.equal(getattr(model.get_submodule(module), activations), state[activations])
                checked += 1
    assert checked == 8 and any(g.format == scheme.format for g in qc.config_groups.values())


def _reading(monkeypatch) -> list[Path]:
    """The checkpoints the one loader reads through the per-expert loader from now on (a spy on it)."""
    from quantize.checkpoint import decompressed

    read: list[Path] = []
    own = decompressed.load_decompressed

    def spy(path, *a, **k):
        read.append(Path(path))
        return own(path, *a, **k)

    monkeypatch.setattr(loader, "load_decompressed", spy)
    return read


def test_eval_scores_an_nvfp4_moe_read_by_our_loader(converted, tmp_path, monkeypatch, capsys):
    out = converted("qwen3_moe", "nvfp4")
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))  # scored now, not found in a cache
    read = _reading(monkeypatch)
    assert main(["eval", str(ROOT / "evaluate" / "smoke.yaml"), str(out), "--quiet"]) == 0, capsys.readouterr().err
    assert read == [out]


def test_offloading_the_per_expert_loader_is_refused(converted, tmp_path):
    with pytest.raises(UsageError, match="does not offload weights to disk"):
        loader.load_model(converted("qwen3_moe", "fp8"), offload_dir=tmp_path / "offload")


def test_mixtral_names_map_to_the_per_expert_model():
    names = ModelNames("mixtral")
    assert names.tensor("model.layers.0.block_sparse_moe.experts.3.w1.weight_scale") == (
        "model.layers.0.mlp.experts.3.gate_proj.weight_scale"
    )
    assert names.target(r"re:^model\.layers\.0(?:\.mlp\.|\.block_sparse_moe\.)experts\.1\.w2$") == (
        r"re:^model\.layers\.0(?:\.mlp\.|\.mlp\.)experts\.1\.down_proj$"
    )
    assert names.target("model.layers.1.block_sparse_moe.gate") == "model.layers.1.mlp.gate"
    assert ModelNames("qwen3_moe").tensor("model.layers.0.mlp.experts.0.w1.weight") == (
        "model.layers.0.mlp.experts.0.w1.weight"
    )


def test_a_gate_on_an_nvfp4_moe_reads_the_candidate_through_our_loader(tmp_path, monkeypatch, capsys):
    """Experts in NVFP4, attention in FP8 (an llm-compressor recipe verbatim): the gate loads the candidate through
    the per-expert loader and gives a verdict on measured evidence."""
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    source = build("qwen3_moe", tmp_path / "src")
    stages = {
        "quant_stage": {
            "quant_modifiers": {
                "QuantizationModifier": {
                    "ignore": ["lm_head", r"re:.*mlp\.gate$"],
                    "scheme": {
                        "NVFP4": [r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"],
                        "FP8_DYNAMIC": [r"re:.*self_attn\.(q|k|v|o)_proj$"],
                    },
                }
            }
        }
    }
    out = tmp_path / "nvfp4"
    recipe = tmp_path / "nvfp4.yaml"
    fields = {"name": "nvfp4", "model": str(source), "output": str(out), "method": "llmcompressor"}
    recipe.write_text(yaml.safe_dump(fields | {"stages": stages, "calibration": CAL}))
    code, said = main(["run", str(recipe), "--quiet"]), capsys.readouterr()
    assert code == 0, said.err
    formats = {
        g["format"]
        for g in json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"].values()
    }
    assert formats == {"nvfp4-pack-quantized", "float-quantized"}
    read = _reading(monkeypatch)
    suite = suite_file(tmp_path / "suite.yaml", small_golden(tmp_path))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"suite: {suite}\nfail_on_inconclusive: false\nrules:\n"
        "  - {task: core_prose, metric: perplexity, max_ratio: 1.5}\n  - {agreement: kl, max: 0.05}\n"
    )
    code = main(["gate", str(policy), "--baseline", str(source), "--candidate", str(out), "--json", "-q"])
    v = records.parse(Verdict, json.loads(capsys.readouterr().out), "stdout")
    assert out in read and source not in read
    assert v.verdict in ("pass", "rejected") and code == v.exit_code
    kl = {r.rule: r for r in v.rules}["agreement kl"].evidence
    assert kl.positions > 0 and kl.upper_bound > 0
