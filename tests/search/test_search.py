"""`quantize search`: true bytes per option, the knapsack, sensitivity with a planted fragile layer group,
mixed-precision checkpoints that reload with the planned bits, and the search end to end on a tiny model."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from quantize.cli import main
from quantize.search.allocate import knapsack, random_allocation

from conftest import make_tiny_llama, tiny_gate

OPTIONS = ["W4A16", "W8A16", "keep"]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("search")
    suite, policy = tiny_gate(base)
    return base, suite, policy


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path_factory.getbasetemp() / "qcache-search"))


def spec(path: Path, model: Path, policy: Path, out: Path, **extra) -> Path:
    doc = {
        "model": str(model),
        "base": {"method": "rtn", "scheme": "W4A16", "group_size": 64, "calibration": None},
        "options": OPTIONS,
        "budget": 13.0,
        "policy": str(policy),
        "measure": {"per_task": 2, "holdout_per_task": 2, "top_k": 5, "random_allocations": 2},
        "max_gates": 1,
        "output": str(out),
        **extra,
    }
    path.write_text(json.dumps(doc))
    return path


# --- the knapsack -----------------------------------------------------------------------------------


def test_knapsack_is_optimal_and_never_over_budget():
    rng = random.Random(0)
    for _ in range(30):
        n = 5
        by = [{"a": rng.randint(100, 200), "b": rng.randint(300, 500), "c": rng.randint(600, 900)} for _ in range(n)]
        dmg = [{"a": rng.random(), "b": rng.random() / 4, "c": 0.0} for _ in range(n)]
        cap = rng.randint(sum(b["a"] for b in by), sum(b["c"] for b in by))
        got = knapsack(by, dmg, cap, resolution=1)
        assert sum(by[u][o] for u, o in enumerate(got)) <= cap
        best = min(
            (sum(dmg[u][o] for u, o in enumerate(c)), c)
            for c in itertools.product("abc", repeat=n)
            if sum(by[u][o] for u, o in enumerate(c)) <= cap
        )
        assert sum(dmg[u][o] for u, o in enumerate(got)) == pytest.approx(best[0])
        coarse = knapsack(by, dmg, cap, resolution=64)  # rounding bytes up: still within the budget
        assert sum(by[u][o] for u, o in enumerate(coarse)) <= cap
    assert knapsack([{"a": 10}], [{"a": 0.0}], 9) is None


def test_random_allocation_fills_but_never_exceeds():
    by = [{"W4A16": 10, "W8A16": 20}] * 6
    a = random_allocation(by, 90, "W4A16", "W8A16", seed=1)
    assert sum(by[0][o] for o in a) <= 90 and a.count("W8A16") == 3


# --- bytes and reload ---------------------------------------------------------------------------------


def test_a_mixed_checkpoint_has_the_planned_bytes_and_bits_per_layer(tmp_path, tiny_model, capsys):
    """The byte model equals the written checkpoint's headers, and `inspect --modules` reads back each
    layer group's bits."""
    from quantize.checkpoint.loader import meta_model
    from quantize.convert.recipe import parse_recipe
    from quantize.search.units import layout

    base = parse_recipe({"method": "rtn", "scheme": "W4A16", "group_size": 64, "calibration": None})
    lay = layout(meta_model(tiny_model, False), tiny_model, base, OPTIONS, "block-part")
    assert [u.name for u in lay.units] == [
        "model.layers.0.self_attn",
        "model.layers.0.mlp",
        "model.layers.1.self_attn",
        "model.layers.1.mlp",
    ]
    alloc = dict(zip([u.name for u in lay.units], ["W8A16", "W4A16", "W4A16", "keep"], strict=True))
    from quantize.search.run import recipe_for
    from quantize.search.spec import SearchRecipe

    s = SearchRecipe(base=base, options=OPTIONS, budget=9.0, policy="gates/ci.yaml")
    out = tmp_path / "mixed"
    r = recipe_for(s, tiny_model, alloc, lay, out)
    (tmp_path / "mixed.yaml").write_text(json.dumps(r))
    assert main(["run", str(tmp_path / "mixed.yaml"), "--quiet"]) == 0
    capsys.readouterr()
    meta = json.loads((out / "quantize.json").read_text())
    assert meta["bits"]["total_bytes"] == lay.total(alloc)
    assert meta["layer_plan"]["schemes"] == {"W8A16": 4} and len(meta["layer_plan"]["kept_16bit"]) == 3
    assert main(["inspect", str(out), "--modules", "--json"]) == 0
    mods = {m["module"]: m for m in json.loads(capsys.readouterr().out)["modules"]}
    assert round(mods["model.layers.0.self_attn.q_proj"]["bits_per_weight"]) == 8
    assert round(mods["model.layers.1.self_attn.q_proj"]["bits_per_weight"]) == 4
    assert mods["model.layers.1.mlp.up_proj"]["bits_per_weight"] == 16
    from quantize.checkpoint.loader import load_model

    model, _ = load_model(out, dtype="float32")  # reloads strictly
    assert model is not None


# --- sensitivity --------------------------------------------------------------------------------------


def test_sensitivity_ranks_a_planted_fragile_layer_group_first(world, tmp_path):
    """Layer 1's MLP reads input channel 0 through a norm weight of 0, so a huge weight in that column changes
    nothing until it is quantized: with min-max scales per group of 64, every other weight of the group then
    rounds to 0. The planted group must come out as the most sensitive."""
    import torch
    from safetensors.torch import load_file, save_file

    from quantize.checkpoint.loader import load_model, meta_model
    from quantize.convert.recipe import parse_recipe
    from quantize.evaluate.agreement import Scorer, baseline_topk, requests
    from quantize.evaluate.suite import open_suite
    from quantize.search.sensitivity import sensitivities
    from quantize.search.units import layout

    fragile = make_tiny_llama(tmp_path / "fragile", seed=2)
    f = fragile / "model.safetensors"
    t = load_file(f)
    norm = t["model.layers.1.post_attention_layernorm.weight"].clone()
    norm[0] = 0
    t["model.layers.1.post_attention_layernorm.weight"] = norm
    for proj in ("gate_proj", "up_proj"):
        w = t[f"model.layers.1.mlp.{proj}.weight"].float()
        w[:, 0] = w.abs().max() * 1000
        t[f"model.layers.1.mlp.{proj}.weight"] = w.to(torch.bfloat16)
    # and make the MLP matter: a random tiny model's MLP barely moves the residual stream
    t["model.layers.1.mlp.down_proj.weight"] = (t["model.layers.1.mlp.down_proj.weight"].float() * 50).to(
        torch.bfloat16
    )
    save_file(t, f, metadata={"format": "pt"})
    base = parse_recipe({"method": "rtn", "scheme": "W4A16", "group_size": 64, "calibration": None})
    lay = layout(meta_model(fragile, False), fragile, base, OPTIONS, "block-part")
    _, suite_path, _ = world
    suite = open_suite(suite_path)
    model, tok = load_model(fragile, dtype="float32")
    scorer = Scorer(model, tok, 4, 512)
    reqs = requests(suite.golden, suite.golden.tasks, 3)
    top = baseline_topk(scorer, reqs, 5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sens = sensitivities(scorer, reqs, top, model, lay.units, OPTIONS, progress=False)
    assert max(sens, key=lambda u: sens[u]["W4A16"]) == "model.layers.1.mlp", sens
    assert all(s["W8A16"] < s["W4A16"] and s["keep"] == 0 for s in sens.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights restored


# --- the command ---------------------------------------------------------------------------------------


def test_a_budget_below_the_smallest_model_is_refused_before_any_model_loads(
    world, tiny_model, tmp_path, capsys, monkeypatch
):
    import quantize.checkpoint.loader

    monkeypatch.setattr(quantize.checkpoint.loader, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    _, _, policy = world
    s = spec(tmp_path / "s.yaml", tiny_model, policy, tmp_path / "out", budget=1.5)
    assert main(["search", str(s)]) == 2
    err = capsys.readouterr().err
    assert "below the smallest model these options make" in err and not (tmp_path / "out").exists()


def test_a_base_dtype_of_another_size_than_the_source_is_refused_before_any_model_loads(
    world, tiny_model, tmp_path, capsys, monkeypatch
):
    """The byte model counts the source's stored bytes: `dtype: bfloat16` over an fp32 source predicted 1,467,568
    bytes where the tries wrote 789,168 (search.json's bytes not the written ones; a budget it meets refused).
    A dtype of the source's own size, or float32 (cast back to the source's dtype on save), is taken: the budget
    check after it is reached."""
    import shutil

    from safetensors.torch import load_file, save_file

    import quantize.checkpoint.loader

    _, _, policy = world
    fp32 = Path(shutil.copytree(tiny_model, tmp_path / "fp32"))
    tensors = {k: v.float() for k, v in load_file(str(tiny_model / "model.safetensors")).items()}
    save_file(tensors, str(fp32 / "model.safetensors"))
    monkeypatch.setattr(quantize.checkpoint.loader, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    base = {"method": "rtn", "scheme": "W4A16", "group_size": 64, "calibration": None}
    for model, dtype, says in (
        (fp32, "bfloat16", "sets dtype: bfloat16, and"),
        (tiny_model, "float16", "below the smallest model"),  # the tiny model is stored in BF16: the same size
        (tiny_model, "float32", "below the smallest model"),
    ):
        s = spec(tmp_path / "s.yaml", model, policy, tmp_path / "out", budget=1.5, base={**base, "dtype": dtype})
        assert main(["search", str(s)]) == 2
        assert says in capsys.readouterr().err, (model, dtype)


def test_an_output_that_cannot_be_written_is_refused_before_any_model_loads(
    world, tiny_model, tmp_path, capsys, monkeypatch
):
    """A dangling link at `output:` ran the whole search, then stranded its result in `.tries` (exit 2 "Not a
    directory"); an output below a file failed after the measurements."""
    import quantize.checkpoint.loader

    monkeypatch.setattr(quantize.checkpoint.loader, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    _, _, policy = world
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    (tmp_path / "afile").write_text("x")
    for out, says in (
        (tmp_path / "link", "is a link"),
        (tmp_path / "afile" / "found", "is not a writable folder"),
    ):
        assert main(["search", str(spec(tmp_path / "s.yaml", tiny_model, policy, out))]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
    assert not (tmp_path / "nowhere").exists() and not list(tmp_path.glob("*.tries"))


def test_a_model_that_computes_nan_is_exit_2_naming_the_layer_groups(world, tiny_model, tmp_path, capsys):
    """A NaN model's sensitivities ended in exit 3, "report this as a bug" (its record could not be written)."""
    import shutil

    from conftest import nan_copy

    _, _, policy = world
    bad = Path(shutil.copytree(tiny_model, tmp_path / "nan"))
    nan_copy(tiny_model / "model.safetensors", bad / "model.safetensors")
    assert main(["search", str(spec(tmp_path / "s.yaml", bad, policy, tmp_path / "found")), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the KL to the model is not finite" in err and "report this" not in err


def test_search_end_to_end_on_a_tiny_model(world, tiny_model, tmp_path, capsys):
    _, _, policy = world
    out = tmp_path / "found"
    s = spec(tmp_path / "s.yaml", tiny_model, policy, out)
    assert main(["search", str(s), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["result"] == str(out) and (out / "search.json").is_file()
    run = json.loads((out / "quantize.json").read_text())
    assert run["search"]["report"] == "search.json" and run["search"]["try_index"] >= 1
    passed = next(t for t in report["tries"] if t["checkpoint"] == str(out))
    assert passed["verdict"] == "pass" and passed["true_bytes"] == passed["allocation"]["bytes"]
    assert passed["allocation"]["bits_per_weight"] <= 13.0
    # bisection gates the largest frontier allocation first: with one gate, that is the one that passed
    candidates = [t for t in report["tries"] if not t["note"].startswith("outside")]
    assert passed["allocation"]["bytes"] == max(t["allocation"]["bytes"] for t in candidates)
    labels = [c["label"] for c in report["comparisons"]]
    assert labels[0].startswith("heuristic") and "searched (same bytes)" in labels
    same = {c["bytes"] for c in report["comparisons"][1:]}
    assert max(same) <= report["comparisons"][0]["bytes"]  # compared at no more bytes than the heuristic
    # no held-out items: nothing measured there, so nothing claimed (quantize.json said 0.0, the text was exit 3)
    none = tmp_path / "none"
    measure = {"per_task": 2, "holdout_per_task": 0, "top_k": 5, "random_allocations": 2}
    assert main(["search", str(spec(tmp_path / "n.yaml", tiny_model, policy, none, measure=measure))]) == 0
    assert "held-out KL" in capsys.readouterr().out
    assert json.loads((none / "quantize.json").read_text())["search"]["holdout_kl"] is None


def test_a_sensitivity_entry_is_sealed_and_holds_its_whole_key(tmp_path, monkeypatch):
    """Sensitivity entries were read as found: another entry (its own key inside) copied over a path, or figures
    edited, were served to the next search; and the key left out the libraries that compute them."""
    import shutil

    from quantize import cache as files
    from quantize.errors import UsageError
    from quantize.evaluate import cache
    from quantize.evaluate.suite import open_suite
    from quantize.records import SensitivityRecord

    from conftest import ROOT

    monkeypatch.setenv("QUANTIZE_CACHE", str(tmp_path / "cache"))
    suite = open_suite(ROOT / "evaluate" / "smoke.yaml")
    one, two = (cache.sensitivity_key(suite, m, {"options": ["W4A16"]}) for m in ("a" * 64, "b" * 64))
    cache.store_sensitivity(SensitivityRecord(key=one, kl={"layer": {"W4A16": 0.5}}, seconds=1.0))
    assert cache.lookup_sensitivity(one).kl == {"layer": {"W4A16": 0.5}} and cache.lookup_sensitivity(two) is None
    src, dst = cache.sensitivity_path(one), cache.sensitivity_path(two)
    shutil.copy(src, dst)  # the first model's entry, digest and all, where the second's would be
    shutil.copy(files.digest_path(src), files.digest_path(dst))
    with pytest.raises(UsageError, match="were stored under key"):
        cache.lookup_sensitivity(two)
    path = cache.sensitivity_path(one)
    path.write_text(path.read_text().replace("0.5", "0.0"))
    with pytest.raises(UsageError, match="does not hash to the sha256"):
        cache.lookup_sensitivity(one)
    monkeypatch.setattr(cache, "library_versions", lambda: (("torch", "0.0"),))
    assert cache.sensitivity_key(suite, "a" * 64, {"options": ["W4A16"]}) != one


# --- gating the frontier in rounds ------------------------------------------------------------------------------


def _old_bisection(n: int, passes) -> list[int]:
    """The bisection `quantize search` ran before rounds (the largest, then midpoints), as the reference order."""
    gated, lo, hi, order, found = [], 0, n - 1, [n - 1], False
    while order:
        i = order.pop()
        gated.append(i)
        if passes(i):
            found, hi = True, i - 1
        else:
            lo = i + 1
            if not found and i == n - 1:
                break
        if lo <= hi:
            order.append((lo + hi) // 2)
    return gated


def _rounds(n: int, passes, k: int) -> tuple[int | None, list[list[int]]]:
    from quantize.search.run import round_points, settle

    lo, hi, first, best, rounds = 0, n - 1, True, None, []
    while lo <= hi:
        points = round_points(lo, hi, k, first)
        assert points and all(lo <= i <= hi for i in points) and len(points) <= k
        rounds.append(points)
        outcomes = {i: passes(i) for i in points}
        if first and not outcomes[n - 1]:
            break
        lo, hi, found = settle(lo, hi, outcomes)
        best = found if found is not None else best
        first = False
    return best, rounds


def test_rounds_find_the_smallest_passing_point_and_one_a_round_is_the_old_bisection():
    """On every monotone frontier (a pass from index t on) of up to 12 points: k points a round find t (None when
    nothing passes), with k = 1 gating exactly what bisection gated, and k > 1 never taking more rounds."""
    for n in range(1, 13):
        for t in range(n + 1):
            passes = lambda i, t=t: i >= t  # noqa: E731
            want = t if t < n else None
            best, rounds = _rounds(n, passes, 1)
            assert best == want and [r[0] for r in rounds] == _old_bisection(n, passes)
            for k in (2, 3, 4):
                got, more = _rounds(n, passes, k)
                assert got == want and len(more) <= len(rounds), (n, t, k)


@pytest.mark.slow  # 41 s on a local Ray cluster; the rounds themselves are tested without Ray just above
def test_a_search_gates_a_round_of_tries_at_once_on_ray(world, tiny_model, tmp_path, capsys):
    """max_parallel: 2 and two gates: one round of the largest frontier point and the midpoint below it, converted
    and gated as sweep tasks on a local cluster, each verdict the one a gate in this process gives the same try."""
    pytest.importorskip("ray")
    from quantize.flows.gate import run_gate

    _, _, policy = world
    out = tmp_path / "found"
    s = spec(
        tmp_path / "s.yaml",
        tiny_model,
        policy,
        out,
        max_gates=2,
        max_parallel=2,
        cluster={"address": "local", "num_cpus": 2},
    )
    assert main(["search", str(s), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    gated = [t for t in report["tries"] if t["gated"]]
    assert len(gated) == 2 and report["result"] == str(out)
    assert list((tmp_path / "found.tries" / "state").glob("*/gate-try-*.start"))  # ran as Ray tasks
    for t in gated:
        ckpt = Path(t["checkpoint"]) if Path(t["checkpoint"]).exists() else out
        assert run_gate(policy, tiny_model, ckpt).verdict == t["verdict"]
    passing = [t for t in gated if t["verdict"] == "pass"]
    assert min(passing, key=lambda t: t["allocation"]["bytes"])["checkpoint"] == str(out)


@pytest.mark.parametrize("name,says", [("../UP", "path separator"), ('"\\ud800"', "lone surrogate"), ("''", "empty")])
def test_a_search_name_that_is_not_one_folder_name_is_refused(tmp_path, name, says):
    """The name is the output folder's (outputs/<name>, and <name>.tries beside it)."""
    from quantize.errors import UsageError
    from quantize.search.spec import load_search

    p = tmp_path / "s.yaml"
    p.write_text(
        f"name: {name}\nbase: {{method: rtn, scheme: W4A16, group_size: 128, calibration: null}}\n"
        "budget: 9.5\npolicy: p.yaml\n"
    )
    with pytest.raises(UsageError, match=f"name = .*{says}"):
        load_search(p)


@pytest.mark.parametrize("budget", ["true", "[8, true]"])
def test_a_boolean_budget_is_refused_not_read_as_one_bit(tmp_path, budget):
    """Found beside a sweep fix (session 44): `budget: true` was read as 1.0 bits per weight."""
    from quantize.errors import UsageError
    from quantize.search.spec import load_search

    p = tmp_path / "s.yaml"
    p.write_text(
        f"name: s\nbase: {{method: rtn, scheme: W4A16, group_size: 128, calibration: null}}\n"
        f"budget: {budget}\npolicy: p.yaml\n"
    )
    with pytest.raises(UsageError, match="is not a number of bits per weight"):
        load_search(p)
