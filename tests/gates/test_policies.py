"""The shipped policies: each opens with its suite and golden set, and the bf16 variant of the CI gate stays the CI
gate with one setting changed."""

from __future__ import annotations

import pytest

from quantize.evaluate.suite import load_suite
from quantize.flows.gate import open_policy
from quantize.gates.policy import load_policy

from conftest import ROOT

POLICIES = sorted((ROOT / "gates").glob("*.yaml"))


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_every_shipped_policy_opens_with_its_suite(path):
    policy, suite = open_policy(path)  # the rules against the suite's tasks, the golden set verified
    assert policy.name == path.stem
    assert suite.tasks


def test_the_bf16_ci_gate_is_the_ci_gate_scored_in_bf16():
    ci, bf16 = load_policy(ROOT / "gates" / "ci.yaml"), load_policy(ROOT / "gates" / "ci-bf16.yaml")
    assert bf16.model_dump(exclude={"name", "suite"}) == ci.model_dump(exclude={"name", "suite"})
    (s32, _), (s16, _) = load_suite(ci.suite), load_suite(bf16.suite)
    assert (s32.dtype, s16.dtype) == ("auto", "bfloat16")
    assert s16.model_dump(exclude={"name", "dtype"}) == s32.model_dump(exclude={"name", "dtype"})
