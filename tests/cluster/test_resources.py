"""What the tasks ask of the cluster against what its nodes have, checked before anything is submitted."""

from __future__ import annotations

import pytest

from quantize.cluster.resources import check_fits
from quantize.cluster.spec import Resources
from quantize.errors import UsageError


def test_a_task_asking_for_a_custom_resource_no_node_offers_is_refused(fake_ray):
    with pytest.raises(UsageError, match=r"resources\.gate asks each task for 1 CPUs, 0 GPUs, 1 big, and no node"):
        check_fits(fake_ray, {"gate": Resources(resources={"big": 1})})
    assert check_fits(fake_ray, {"gate": Resources(num_cpus=2)}) == ["nnnnnnnnnnnn 10.0.0.1 (2 CPUs, 0 GPUs)"]
