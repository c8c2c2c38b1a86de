"""Multi-token-prediction (MTP) layers as DeepSeek-V3/V3.2 and GLM-4.5 publish them: stored after the decoder's
(layers.N for N from num_hidden_layers on, as many as config.json's num_nextn_predict_layers), never loaded by
transformers' causal LM. tests/families.build_mtp saves one seeded model twice, its decoder alone and with an MTP
layer after it: every figure of the decoder (inspect's parts and expert layers, the decode cost, the report's decode
bounds) is the same for both, the MTP layer a part of its own (`mtp`) that no decode step reads, and the checks before
a load accept both. On the old code the MTP layer was a second MoE layer, its experts priced as dense parameters every
step, and `quantize run` refused the folder (exit 2: "the weights hold 3 decoder layers")."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from families import COMMON, build_mtp
from safetensors.torch import load_file, save_file
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from quantize.checkpoint import architecture as arch
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import check_model_dir, safetensors_files
from quantize.checkpoint.headers import all_tensors
from quantize.checkpoint.loader import check_loading_info
from quantize.cli import main
from quantize.cost.bounds import HARDWARE
from quantize.errors import UsageError
from quantize.report.collect import Entry, decode_bounds

from conftest import assert_priced_as_its_decoder

FAMILIES = ("deepseek_v3", "glm4_moe", "deepseek_v32")  # deepseek_v32's config class has no MTP field of its own
N = COMMON["num_hidden_layers"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    built: dict[str, tuple] = {}

    def get(family: str):
        if family not in built:
            built[family] = build_mtp(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


def mtp_tensors(folder):
    return {n: t for n, t in all_tensors(safetensors_files(folder))[0].items() if f".layers.{N}." in n}


@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_makes_the_mtp_layer_a_part_of_its_own_and_no_moe_layer(pair, family, capsys):
    """The MTP layer's every tensor (its experts, embedding and output head included) is part `mtp`, by hand from
    the headers; every other part, the expert layers and the tables a decode step looks a row up in are the
    decoder's. The old code listed layer 2 in expert_layers and its output head in part `other`."""
    decoder, mtp = pair(family)
    d, m = bits_report(decoder), bits_report(mtp)
    layer = mtp_tensors(mtp)
    assert m.bytes_by_part["mtp"]["bytes"] == sum(t.nbytes for t in layer.values())
    assert m.bytes_by_part["mtp"]["parameters"] == sum(math.prod(t.shape) for t in layer.values())
    assert {p: r for p, r in m.bytes_by_part.items() if p != "mtp"} == d.bytes_by_part
    assert m.expert_layers == d.expert_layers and [e.layer for e in m.expert_layers] == [1]
    assert m.gathered == d.gathered  # its own embedding is no table a decode step reads
    assert m.total_bytes == d.total_bytes + m.bytes_by_part["mtp"]["bytes"]
    assert main(["inspect", str(mtp), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [e["layer"] for e in shown["expert_layers"]] == [1] and "mtp" in shown["bytes_by_part"]
    assert any(n.startswith(f"layer {N}: multi-token-prediction (MTP)") for n in shown["notes"])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decode_cost_leaves_the_mtp_layer_out_and_says_so(pair, family, capsys):
    """`quantize cost --checkpoint` prices the MTP checkpoint as its decoder (parameters, active parameters, every
    format's bounds, the MoE layers), and names what it left out: the `mtp` part's bytes and parameters. The old code
    priced the MTP layer's experts as dense parameters every step (934,920 active parameters against 497,284)."""
    decoder, mtp = pair(family)
    assert_priced_as_its_decoder(decoder, mtp, N, capsys)


def test_the_reports_decode_bounds_leave_the_mtp_layer_out(pair):
    """`quantize report`'s decode column prices the MTP checkpoint as its decoder, as `quantize cost` does."""
    decoder, mtp = pair("deepseek_v3")
    bounds = []
    for ckpt in (decoder, mtp):
        r = bits_report(ckpt)
        entry = Entry(str(ckpt), "x", "-", "-", r.total_bytes, r.parameters, 16.0, None, r.bytes_by_role, "0" * 64)
        bounds.append(decode_bounds(entry, None, HARDWARE["seed"], batch=4, context=100))
    assert bounds[0].batch1_ms is not None and bounds[0] == bounds[1]


def test_the_checks_before_a_load_take_the_declared_mtp_layers_and_no_more(pair, tmp_path):
    """config_matches_headers: num_hidden_layers decoder layers, with or without the MTP layers config.json
    declares; a layer past those, or an MTP layer config.json does not declare, is refused (exit 2) naming both
    counts. The old code refused the published layout: "the weights hold 3 decoder layers ... fix config.json"."""
    decoder, mtp = pair("deepseek_v3")
    check_model_dir(decoder)
    check_model_dir(mtp)

    def copy(name: str, **config) -> object:
        folder = tmp_path / name
        shutil.copytree(mtp, folder)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **config}))
        return folder

    undeclared = copy("undeclared", num_nextn_predict_layers=0)
    with pytest.raises(UsageError, match="says num_hidden_layers 2, but the weights hold 3 layers"):
        check_model_dir(undeclared)
    one_more = copy("one-more")
    tensors = load_file(one_more / "model.safetensors")
    more = {
        n.replace(f".layers.{N}.", f".layers.{N + 1}."): t.clone() for n, t in tensors.items() if f".layers.{N}." in n
    }
    save_file({**tensors, **more}, one_more / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"num_nextn_predict_layers 1: layers\.2 to layers\.2\), so 2 or 3 layers"):
        check_model_dir(one_more)
    with pytest.raises(UsageError, match="num_nextn_predict_layers is 'one'"):
        check_model_dir(copy("bad", num_nextn_predict_layers="one"))
    assert "mtp" not in bits_report(tmp_path / "bad").bytes_by_part  # inspect reads it, as written, without one


def test_the_strict_load_lets_the_declared_mtp_layers_go_and_nothing_else(pair):
    """transformers' causal LM has no place for the MTP layer's tensors (its DeepSeek-V3 class ignores layers.61 by
    name; a tiny model's layers.2 comes back unexpected): those of a declared MTP layer are let go, any other
    unexpected tensor is still refused."""
    _, mtp = pair("deepseek_v3")
    check_loading_info(mtp, {"unexpected_keys": sorted(mtp_tensors(mtp))})
    with pytest.raises(UsageError, match="stored tensor"):
        check_loading_info(mtp, {"unexpected_keys": [f"model.layers.{N + 1}.eh_proj.weight"]})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key", ["num_nextn_predict_layers", "num_mtp_layers"])
def test_the_mtp_layers_are_read_as_the_config_class_reads_them(family, key):
    """Either name config.json may give (DeepseekV3Config and Glm4MoeConfig store `num_mtp_layers` under
    num_nextn_predict_layers; DeepseekV32Config has no such field and keeps what config.json says as written):
    the MTP layers are those the family's config class holds, num_hidden_layers on."""
    cfg = {"model_type": family, "num_hidden_layers": N, key: 2}
    held = getattr(CONFIG_MAPPING[family](**cfg), "num_nextn_predict_layers", None)
    assert arch.mtp_layers(cfg) == (range(N, N + held) if held else range(0))
    assert (family, key) != ("deepseek_v3", "num_mtp_layers") or arch.mtp_layers(cfg) == range(N, N + 2)
