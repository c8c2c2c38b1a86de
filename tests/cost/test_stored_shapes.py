"""`quantize cost --checkpoint` holds the stored tensors to the model config.json describes, as `run` and `eval` do
(checkpoint/loader.check_against_meta), before it prices anything (a review): a head count spelled as another
family spells it is not read by the config class, whose default was then priced (Qwen3-Next's fixed state 33,792
bytes where the weights hold 19,456, Nemotron-H's 295,424 where they hold 9,728, Qwen3's KV 16 times its own) and
the command exited 0. The shape config.json implies is transformers' own: the model its classes build from the
folder's config.json, on the meta device."""

from __future__ import annotations

import json
import shutil

import families
import pytest
from cost.test_hybrid_cost import hand

from quantize.checkpoint.files import safetensors_files
from quantize.checkpoint.headers import all_tensors
from quantize.cli import main

# family -> the field config.json stores its head count under, and another family's spelling of it, which the
# family's config class does not read (Kimi-Linear's, Granite 4's, a guess)
RESPELT = {
    "qwen3_next": ("linear_num_key_heads", "linear_num_heads"),
    "nemotron_h": ("mamba_num_heads", "mamba_n_heads"),
    "qwen3": ("num_key_value_heads", "num_kv_heads"),
}
CONTEXT = 2048
# what the clean checkpoints' caches hold at CONTEXT, by hand (test_hybrid_cost.hand: 4 layers mixing the kinds);
# Qwen3's 2 layers keep K and V of 2 heads × 32 values, 2 bytes each
PRICED = {"qwen3_next": sum(hand(CONTEXT)["qwen3_next"]), "nemotron_h": sum(hand(CONTEXT)["nemotron_h"])}
PRICED["qwen3"] = 2 * (2 * 2 * 32) * CONTEXT * 2


def respelt(src, dst, family):
    """A copy of the checkpoint `src` whose config.json spells the family's head count the other way."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    field, other = RESPELT[family]
    cfg[other] = cfg.pop(field)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def implied(folder) -> dict[str, list[int]]:
    """Each tensor's shape in the model transformers builds from the folder's config.json (meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return {n: list(t.shape) for n, t in model.state_dict().items()}


def priced(folder, capsys) -> int:
    assert main(["cost", "--checkpoint", str(folder), "--json", "--context", str(CONTEXT)]) == 0
    return json.loads(capsys.readouterr().out)["kv_bytes_per_sequence"]


def refused(folder, capsys) -> tuple[str, list[int], list[int]]:
    """The tensor the cost refuses `folder` for, its stored shape and the shape the message says config.json
    implies (each checked against the headers and transformers' model)."""
    assert main(["cost", "--checkpoint", str(folder), "--context", str(CONTEXT)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err, captured  # no figure, no traceback
    stored, _ = all_tensors(safetensors_files(folder))
    named = [n for n in stored if f"tensor {n} has shape" in captured.err]
    assert len(named) == 1, captured.err
    name, shape = named[0], stored[named[0]].shape
    held = implied(folder)
    want = held.get(name) or held[name.replace("backbone.", "model.", 1)]  # Nemotron-H stores model.* so
    assert f"has shape {shape} in model.safetensors, and config.json implies {want}; fix config.json" in captured.err
    assert shape != want
    return name, shape, want


@pytest.mark.parametrize("family", list(RESPELT))
def test_a_head_count_config_json_does_not_give_is_refused_not_priced(family, tmp_path, capsys):
    clean = families.build(family, tmp_path / family)
    assert priced(clean, capsys) == PRICED[family]  # the clean checkpoint, priced as before
    bad = respelt(clean, tmp_path / "respelt", family)
    name, _, _ = refused(bad, capsys)
    assert ".layers.0." in name  # a layer's tensor carries the head count, not the embedding


def fp8_copy(src, dst):
    """`src` as an FP8 (E4M3, one scale per output channel) compressed-tensors checkpoint, written by hand: every
    2-D projection weight of its decoder layers cast, named and shaped as before, its scale beside it; the norms,
    convolutions, A_log, embedding and output layer left in bf16, as a format leaves them."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in [n for n, t in tensors.items() if ".layers." in n and n.endswith("proj.weight") and t.ndim == 2]:
        w = tensors[name].float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
        tensors[name] = (w / scale).to(torch.float8_e4m3fn)
        tensors[name.removesuffix("weight") + "weight_scale"] = scale.to(torch.bfloat16)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    weights = dict(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head"],
    }
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("family", "dtype"), [("qwen3", "F8_E4M3"), ("qwen3_next", "BF16")])
def test_a_quantized_checkpoint_is_held_to_its_config_too(family, dtype, tmp_path, capsys):
    """The float tensors a quantized checkpoint stores under the model's names are compared: Qwen3's FP8 k_proj
    itself (name and shape kept), Qwen3-Next's bf16 conv1d (never quantized) beside its FP8 projections."""
    clean = fp8_copy(families.build(family, tmp_path / family), tmp_path / "fp8")
    assert priced(clean, capsys) == PRICED[family]
    name, _, _ = refused(respelt(clean, tmp_path / "respelt", family), capsys)
    assert all_tensors(safetensors_files(clean))[0][name].dtype == dtype


@pytest.mark.parametrize(("family", "fp8"), [("nemotron_h", False), ("qwen3", True)])
def test_run_and_eval_refuse_them_by_the_same_check(family, fp8, tmp_path):
    """The loader of `run` and `eval` makes the same comparison: Nemotron-H's tensors stored as save_pretrained
    writes them (`backbone.` for `model.`: they were matched to nothing, and the load's own mismatch report named
    no shape), and a quantized checkpoint's float tensors (they were not compared), before any weight is read."""
    from quantize.checkpoint.loader import load_model
    from quantize.errors import UsageError

    clean = families.build(family, tmp_path / family)
    bad = respelt(fp8_copy(clean, tmp_path / "fp8") if fp8 else clean, tmp_path / "respelt", family)
    with pytest.raises(UsageError, match=r"tensor \S+\.layers\.0\.\S+ has shape \[\d+.*config.json implies"):
        load_model(bad)
