"""The recipe validator: one test per rule, each asserting the message names the field and what to do."""

from __future__ import annotations

import pytest

from quantize.convert.recipe import Indivisible, Method, Scheme, load_recipe, parse_recipe
from quantize.errors import UsageError

from conftest import ROOT

BASE = {"method": "gptq", "scheme": "W4A16", "group_size": 128}


def bad(**changes) -> str:
    data = {**BASE, **changes}
    data = {k: v for k, v in data.items() if v is not ...}
    with pytest.raises(UsageError) as e:
        parse_recipe(data)
    return str(e.value)


def test_valid_recipe_fills_defaults():
    r = parse_recipe(BASE)
    assert r.method is Method.gptq and r.scheme is Scheme.W4A16
    assert r.indivisible is Indivisible.smaller_group
    assert r.ignore == ["lm_head"] and r.calibration.samples == 64


def test_unknown_key_is_named():
    assert "unknown key `grup_size`" in bad(grup_size=64)


def test_unknown_nested_key_is_named():
    assert "calibration.sample" in bad(calibration={"sample": 3})


def test_wrong_type_names_field_and_value():
    msg = bad(group_size="big")
    assert "group_size" in msg and '"big"' in msg


@pytest.mark.parametrize("g", [0, 7, -128, 96])
def test_group_size_must_be_power_of_two(g):
    msg = bad(group_size=g)
    assert "power of two" in msg and str(g) in msg


def test_unknown_method_lists_choices():
    msg = bad(method="squeeze")
    assert "method" in msg and "gptq" in msg


def test_method_needs_scheme():
    assert "scheme is required" in bad(scheme=...)


def test_smoothquant_requires_8bit_scheme():
    msg = bad(method="smoothquant", scheme="W4A16", group_size=...)
    assert "does not support scheme W4A16" in msg and "W8A8" in msg


def test_fp8_with_group_size_is_refused():
    msg = bad(method="fp8", scheme="FP8_DYNAMIC", group_size=128)
    assert "`group_size` is not a setting of method fp8" in msg and "one scale per output channel" in msg


def test_rtn_per_channel_scheme_with_group_size_is_refused():
    msg = bad(method="rtn", scheme="FP8_DYNAMIC", group_size=128, calibration=None)
    assert "group_size must be empty" in msg and "remove group_size" in msg


@pytest.mark.parametrize(
    "method,scheme,setting",
    [
        ("awq", "W4A16", {"dampening_frac": 0.05}),
        ("fp8", "FP8", {"act_order": True}),
        ("gptq", "W4A16", {"smoothing_strength": 0.5}),
        ("smoothquant", "W8A8", {"awq_grid": 5}),
        ("smoothquant", "W8A8", {"indivisible": "keep"}),
    ],
)
def test_a_setting_of_another_method_is_an_error_naming_it(method, scheme, setting):
    """A flat schema ignored these; the union per method refuses them, naming the key and its method."""
    data = {"method": method, "scheme": scheme, **setting}
    with pytest.raises(UsageError) as e:
        parse_recipe(data)
    (key,) = setting
    assert f"`{key}` is not a setting of method {method}" in str(e.value) and "remove it" in str(e.value)


def test_fp8_asymmetric_is_refused():
    assert "symmetric" in bad(method="fp8", scheme="FP8", group_size=..., symmetric=False)


def test_awq_rejects_w8a8():
    assert "does not support scheme W8A8" in bad(method="awq", scheme="W8A8", group_size=...)


def test_smoothing_strength_range():
    assert "strictly between 0 and 1" in bad(
        method="smoothquant", scheme="W8A8", group_size=..., smoothing_strength=1.5
    )


def test_smoothing_strength_only_for_smoothquant():
    assert "SmoothQuant setting" in bad(smoothing_strength=0.5)


def test_smoothquant_gets_default_strength():
    r = parse_recipe({"method": "smoothquant", "scheme": "W8A8"})
    assert r.smoothing_strength == 0.8


def test_act_order_only_for_gptq():
    assert "GPTQ setting" in bad(method="awq", act_order=True)


def test_awq_grid_only_for_awq():
    assert "AWQ setting" in bad(awq_grid=10)


def test_calibration_required_when_method_needs_data():
    assert "needs calibration data" in bad(calibration=None)


def test_data_free_scheme_accepts_no_calibration():
    r = parse_recipe({"method": "fp8", "scheme": "FP8_DYNAMIC", "calibration": None})
    assert not r.needs_calibration


def test_indivisible_policy_values():
    assert "indivisible" in bad(indivisible="pad")
    assert parse_recipe({**BASE, "indivisible": "keep"}).indivisible is Indivisible.keep


def test_empty_targets_refused():
    assert "targets is empty" in bad(targets=[])


@pytest.mark.parametrize(
    "changes,says",
    [
        ({"targets": ["re:(q_proj"]}, "'re:(q_proj' is not a regular expression"),
        ({"ignore": ["lm_head", "re:*"]}, "'re:*' is not a regular expression"),
        # OverflowError and RecursionError from re.compile, not re.error: exit 3 (a review)
        ({"targets": ["re:a{99999999999}"]}, "targets: 're:a{99999999999}' is not a regular expression"),
        ({"ignore": ["re:" + "(" * 600 + "a" + ")" * 600]}, "groups nested too deeply"),
        ({"overrides": [{"targets": ["re:a{4294967296}"], "scheme": "keep"}]}, "the repetition number is too large"),
        (
            {"overrides": [{"targets": ["re:mlp\\.(up"], "scheme": "keep"}]},
            "overrides.0.targets",
        ),
        ({"calibration": {"seed": 2**64}}, "calibration.seed"),
        (
            {"method": "llmcompressor", "scheme": ..., "group_size": ..., "stages": {"s": {}}, "calibration": None},
            "give a `calibration:` section",
        ),
        # accepted and ignored: the checkpoint said Linear and lm_head whatever the recipe said; `model: ""` read
        # the working folder where the docs said the default model (a review)
        (
            {"method": "llmcompressor", "scheme": ..., "group_size": ..., "stages": {"s": {}}, "ignore": ["x"]},
            "so ignore would change nothing",
        ),
        ({"model": ""}, "model"),
    ],
    ids=[
        "targets-regex",
        "ignore-regex",
        "targets-regex-overflow",
        "ignore-regex-recursion",
        "override-regex-overflow",
        "override-regex",
        "seed-past-torch",
        "verbatim-without-calibration",
        "verbatim-ignore",
        "empty-model",
    ],
)
def test_what_failed_after_the_load_is_refused_with_the_recipe(changes, says):
    """A regex that does not compile (the layer plan's re.error), a seed torch cannot take, a verbatim recipe
    without calibration (an AttributeError): exit 3 after the model loaded, in a review's repros."""
    assert says in bad(**changes)


@pytest.mark.parametrize(
    "method,scheme", [("rtn", "FP8_DYNAMIC"), ("rtn", "NVFP4A16"), ("gptq", "MXFP4A16"), ("rtn", "W4AFP8")]
)
def test_symmetric_false_is_refused_where_the_preset_fixes_its_scales(method, scheme):
    """quantize.json's resolved recipe said symmetric: False and config.json True (a review): the preset ignores it."""
    assert "would change nothing" in bad(method=method, scheme=scheme, group_size=..., symmetric=False)
    parse_recipe({"method": "rtn", "scheme": "W4A16", "group_size": 128, "symmetric": False})  # an int scheme takes it


@pytest.mark.parametrize("method,scheme", [("rtn", "W8A16"), ("fp8", "FP8_DYNAMIC"), ("rtn", "NVFP4A16")])
def test_a_calibration_a_data_free_scheme_would_ignore_is_refused(method, scheme):
    """It was read, recorded in the run's recipe and provenance, and changed nothing (a review)."""
    cal = {"source": "builtin:jargon", "samples": 4, "seq_len": 32}
    assert "is data-free" in bad(method=method, scheme=scheme, group_size=..., calibration=cal)
    parse_recipe({"method": method, "scheme": scheme, "calibration": None})  # null, or absent, is the data-free way
    parse_recipe({"method": method, "scheme": scheme, "calibration": cal, "kv_cache": {"scheme": "FP8"}})


def test_calibration_samples_positive():
    assert "calibration.samples" in bad(calibration={"samples": 0})


def test_verbatim_needs_stages():
    assert "needs `stages:`" in bad(method="llmcompressor", scheme=..., group_size=...)


def test_verbatim_refuses_scheme_fields():
    msg = bad(method="llmcompressor", stages={"quant_stage": {}})
    assert "`scheme` is not a setting of method llmcompressor" in msg and "`group_size` is not a setting" in msg


def test_stages_only_for_verbatim():
    assert "only for method llmcompressor" in bad(stages={"x": {}})


def test_resolved_recipe_holds_only_its_methods_settings():
    from quantize.convert.recipe import resolved_dict

    awq = resolved_dict(parse_recipe({"method": "awq", "scheme": "W4A16", "group_size": 64}))
    assert awq["awq_grid"] == 20 and "dampening_frac" not in awq and "smoothing_strength" not in awq


def test_load_recipe_missing_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_load_recipe_invalid_yaml(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("method: [gptq\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_recipe(p)


def test_load_recipe_not_a_mapping(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("- gptq\n")
    with pytest.raises(UsageError, match="YAML mapping"):
        load_recipe(p)


def test_load_recipe_names_from_file_and_hashes_bytes(tmp_path):
    p = tmp_path / "my-recipe.yaml"
    p.write_text("method: rtn\nscheme: W8A16\ncalibration: null\n")
    r, sha = load_recipe(p)
    p.write_text("method: rtn\nscheme: W8A16\ncalibration: null\n# changed\n")
    _, sha2 = load_recipe(p)
    assert r.name == "my-recipe" and len(sha) == 64 and sha != sha2


def test_every_shipped_recipe_is_valid():

    from quantize.search.spec import load_search

    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    searches = [p for p in recipes if p.stem.startswith("search-")]
    # seven, the six formats of 2026, an FP8 KV cache, GPTQ NVFP4A16, four GGUF recipes (llama.cpp's, method gguf);
    # two searches: int weights (the README's figures, on gates/ci-v1.yaml) and llama.cpp's tensor types
    assert len(recipes) == 20 and len(searches) == 2
    for p in recipes:
        if p in searches:
            spec, _ = load_search(p)
            assert spec.policy.endswith("gates/ci-v1.yaml" if spec.base.method.value == "rtn" else "gates/ci.yaml")
            continue
        r, _ = load_recipe(p)
        assert r.output == f"outputs/{p.stem}"


def test_a_search_recipe_given_to_run_names_the_command_that_takes_it(capsys):

    from quantize.cli import main

    spec = ROOT / "recipes" / "search-w4-w8.yaml"
    assert main(["run", str(spec)]) == 2
    assert "run it with `quantize search FILE`" in capsys.readouterr().err


# --- the name, which names the output folder (outputs/<name>): one path part (quantize/names.py) -------------


@pytest.mark.parametrize(
    "name,says",
    [
        ("/tmp/abs", "path separator"),
        ("../UP", "path separator"),
        ("a/", "path separator"),
        ("./a", "path separator"),
        ("", "is empty"),
        (".", "folder itself"),
        ("w8\n", "control character"),
        ("\ud800", "lone surrogate"),
    ],
)
def test_a_name_that_is_not_one_folder_name_is_refused(name, says):
    msg = bad(name=name)
    assert "name = " in msg and says in msg and "a name is one folder or file name" in msg


def test_an_output_path_with_a_control_character_or_a_lone_surrogate_is_refused():
    assert "output = " in bad(output="out\x00x") and "control characters" in bad(output="out\nx")
    assert "lone surrogate" in bad(output="out/\udcff")


def test_a_name_is_kept_in_its_nfc_form():
    assert parse_recipe({**BASE, "name": "cafe\u0301"}).name == "caf\u00e9"


@pytest.mark.parametrize(
    "line,says",
    [
        ('name: "../UP"', "path separator"),
        ('name: "\\ud800"', "lone surrogate"),  # a YAML escape: strict decoding of the file cannot catch it
        ('name: "\\0"', "control character"),
    ],
)
def test_run_refuses_a_bad_name_before_anything_is_loaded_or_written(tmp_path, monkeypatch, capsys, line, says):
    from quantize.cli import main

    monkeypatch.chdir(tmp_path)
    p = tmp_path / "r.yaml"
    p.write_text(f"{line}\nmethod: rtn\nscheme: W8A16\ncalibration: null\nmodel: {tmp_path / 'nowhere'}\n")
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert says in err and "name = " in err and "Traceback" not in err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.yaml"]  # no outputs/, no UP/


@pytest.mark.parametrize("file", ["..yaml", ".hidden.yaml"])
def test_a_name_taken_from_the_file_is_checked_too(tmp_path, file):
    p = tmp_path / file
    p.write_text("method: rtn\nscheme: W8A16\ncalibration: null\n")
    with pytest.raises(UsageError, match=r"its name \(the file's, as it sets no `name:`\) = .*set `name:` in it"):
        load_recipe(p)
