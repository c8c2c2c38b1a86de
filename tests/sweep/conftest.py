"""The sweep tests' shared inputs: `lab` (a sweep's files for planning, over the tiny model) and `no_cluster` (a
sweep that must stop before its cluster; tests/cluster/conftest.py has `fake_ray`, what connecting and sizing call).
This folder is a package (its `__init__.py`), so this conftest loads as `sweep.conftest` and never takes the place
of tests/conftest.py, which test modules import by the name `conftest`."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import small_golden, suite_file

RULES = "rules:\n  - {task: core_facts, metric: acc, margin: 0.5}\n"


class Lab:
    """A sweep's inputs, nothing converted: the tiny model, a policy over a small golden set, a 4-bit RTN recipe
    (`w4`), and recipes and sweep files written on demand."""

    def __init__(self, base: Path, tiny: Path) -> None:
        self.base, self.tiny = base, tiny
        suite = suite_file(base / "suite.yaml", small_golden(base))
        self.policy = base / "p.yaml"
        self.policy.write_text(f"name: p\nsuite: {suite}\n{RULES}")
        self.w4 = base / "w4.yaml"
        self.w4.write_text(
            f"name: w4\nmethod: rtn\nscheme: W4A16\ngroup_size: 32\ncalibration: null\nmodel: {tiny}\n"
            "dtype: bfloat16\n"  # not the machine's timing probe
        )
        # a calibrated recipe, for matrix cells of calibration fields (a data-free one refuses a calibration)
        self.gptq = base / "gptq.yaml"
        self.gptq.write_text(
            f"name: gptq\nmethod: gptq\nscheme: W4A16\ngroup_size: 32\nmodel: {tiny}\n"
            "calibration: {source: builtin:jargon, samples: 8, seq_len: 32}\n"
        )

    def recipe(self, file: str, name: str | None = None, scheme: str = "W8A16") -> Path:
        p = self.base / file
        p.parent.mkdir(parents=True, exist_ok=True)
        named = "" if name is None else f"name: {name}\n"
        p.write_text(f"{named}method: rtn\nscheme: {scheme}\ncalibration: null\nmodel: {self.tiny}\n")
        return p

    def sweep(self, recipes=(), checkpoints=(), name: str = "t", matrix: str = "", extra: str = "") -> Path:
        """sweep.yaml: `recipes` and `checkpoints` listed, `matrix` (its YAML body, indented) and `extra` keys as
        given; its output is BASE/out."""
        f = self.base / "sweep.yaml"
        listed = ", ".join(f"'{r}'" for r in recipes)
        f.write_text(
            f"name: {name}\nmodel: {self.tiny}\nrecipes: [{listed}]\ncheckpoints: [{', '.join(map(str, checkpoints))}]"
            f"\npolicy: {self.policy}\noutput: {self.base / 'out'}\n{extra}" + (f"matrix:\n{matrix}" if matrix else "")
        )
        return f


@pytest.fixture
def lab(tmp_path, tiny_model):
    return Lab(tmp_path, tiny_model)


@pytest.fixture
def no_cluster(monkeypatch):
    """A sweep that must stop at planning: starting a cluster fails the test."""
    from quantize.sweep import run as sweep_run

    def refuse(*args, **kwargs):
        raise AssertionError("the sweep reached its cluster")

    monkeypatch.setattr(sweep_run, "on_cluster", refuse)
