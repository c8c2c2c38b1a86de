"""`--hardware local`: this machine measured (quantize/cost/local.py), kept for the boot, and used by the bounds."""

from __future__ import annotations

import pytest

from quantize import api
from quantize.cli import main
from quantize.cost import local


@pytest.fixture
def small(monkeypatch, isolated_cache):
    monkeypatch.setattr(local, "BUFFER_BYTES", 8 << 20)
    monkeypatch.setattr(local, "N", 64)
    return isolated_cache


def test_the_profile_is_measured_once_per_boot(small, monkeypatch):
    first = local.profile()
    assert first.name == "local" and first.hbm_bytes_per_second > 1e8 and first.peak_dense_flops > 1e6
    assert local.cpu_name() in first.source
    monkeypatch.setattr(local, "read_bandwidth", lambda *a: pytest.fail("measured again"))
    assert local.profile() == first  # the memo of this boot
    monkeypatch.setattr(local, "memo_path", lambda *a: None)  # a machine with no boot id keeps nothing
    monkeypatch.setattr(local, "read_bandwidth", lambda *a: 5e9)
    assert local.profile().hbm_bytes_per_second == 5e9


def test_the_bound_divides_by_the_measured_bandwidth(small, monkeypatch, tiny_model):
    from quantize.cost.bounds import Workload

    monkeypatch.setattr(local, "read_bandwidth", lambda *a: 1e9)
    monkeypatch.setattr(local, "matmul_flops", lambda *a: 1e12)
    cost = api.decode_cost(tiny_model, hardware="local", workload=Workload(context_tokens=16, batch=1))
    m = cost.formats["measured"]
    assert m.batch1_weight_bound_ms == pytest.approx(m.batch1_weight_read_bytes / 1e9 * 1e3)


def test_an_unknown_profile_names_local_among_the_choices(capsys, tiny_model):
    assert main(["cost", "--checkpoint", str(tiny_model), "--hardware", "h300"]) == 2
    err = capsys.readouterr().err
    assert "--hardware 'h300' is unknown" in err and "local" in err
