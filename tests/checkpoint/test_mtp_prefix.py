"""Multi-token-prediction (MTP) modules stored under a prefix of their own, as Qwen3-Next and Qwen3.5 publish them
(`mtp.fc`, `mtp.layers.0.*`, `mtp.norm`, ...: tests/families.build_mtp_prefixed), which transformers' model of the
family ignores by name (its `_keys_to_ignore_on_load_unexpected`, copied as compat/transformers_config_names.
MTP_UNEXPECTED). Every figure of the decoder (inspect's parts and expert layers, the decode cost) is the same with
and without the module, which is part `mtp`. On the old code the module's attention was counted as linear attention
(layer 0's, by the index of `mtp.layers.0`), its experts as a second copy of layer 0's, `mtp.fc` as `other`, and
`quantize cost` priced all of it as read every decode step."""

from __future__ import annotations

import json
import math

import pytest
from families import build_mtp_prefixed

from quantize.checkpoint import architecture as arch
from quantize.checkpoint.accounting import bits_report
from quantize.checkpoint.files import check_model_dir, safetensors_files
from quantize.checkpoint.headers import all_tensors
from quantize.cli import main

from conftest import assert_priced_as_its_decoder


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_mtp_prefixed("qwen3_next", tmp_path_factory.mktemp("qwen3_next"))


def test_inspect_makes_the_prefixed_mtp_module_a_part_of_its_own(pair, capsys):
    """Every `mtp.*` tensor is part `mtp`, by hand from the headers; every other part, the expert layers and the
    tables a decode step looks a row up in are the decoder's, and a note says what the part is."""
    decoder, mtp = pair
    d, m = bits_report(decoder), bits_report(mtp)
    module = {n: t for n, t in all_tensors(safetensors_files(mtp))[0].items() if n.startswith("mtp.")}
    assert module and m.bytes_by_part["mtp"]["bytes"] == sum(t.nbytes for t in module.values())
    assert m.bytes_by_part["mtp"]["parameters"] == sum(math.prod(t.shape) for t in module.values())
    assert {p: r for p, r in m.bytes_by_part.items() if p != "mtp"} == d.bytes_by_part
    assert m.expert_layers == d.expert_layers
    assert m.gathered == d.gathered
    assert m.total_bytes == d.total_bytes + m.bytes_by_part["mtp"]["bytes"]
    assert main(["inspect", str(mtp), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert any(n.startswith("mtp.*: multi-token-prediction (MTP) module") for n in shown["notes"])
    check_model_dir(mtp)


def test_the_decode_cost_leaves_the_prefixed_mtp_module_out_and_says_so(pair, capsys):
    decoder, mtp = pair
    assert_priced_as_its_decoder(decoder, mtp, None, capsys, prefixes=("mtp",))


def test_the_mtp_prefix_is_the_familys_own():
    """The prefix is read from the family's ignore patterns (re.search, as transformers matches them): Qwen3-Next's
    `^mtp.*` takes `mtp.*` and nothing of the decoder's; MiMo's `^model\\.mtp\\.` takes `model.mtp.*`; a family
    with no MTP prefix takes none."""
    qwen = arch.mtp_of({"model_type": "qwen3_next"})
    assert qwen.holds("mtp.layers.0.mlp.experts.1.up_proj.weight") and qwen.prefix("mtp.fc.weight") == "mtp"
    assert not qwen.holds("model.layers.0.mlp.experts.1.up_proj.weight")
    mimo = arch.mtp_of({"model_type": "mimo_v2_flash"})
    assert mimo.prefix("model.mtp.layers.0.eh_proj.weight") == "model.mtp"
    assert not arch.mtp_of({"model_type": "llama"}).holds("mtp.fc.weight")
    multimodal = arch.mtp_of({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text"}})
    assert multimodal.holds("mtp.fc.weight") and not multimodal.holds("model.language_model.layers.0.mlp.gate.weight")
