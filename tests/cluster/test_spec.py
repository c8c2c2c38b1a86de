"""The cluster and resource schemas a sweep file and a search recipe share: addresses, custom resources, memory."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from quantize.cluster.spec import Cluster, Resources, parse_bytes


@pytest.mark.parametrize(
    "resources,says",
    [({"CPU": 1}, "not a custom resource"), ({"quantize_sweep_slot": 1}, r"quantize_\* are the sweep's")]
    + [({"big": 0}, "above 0"), ({"a b": 1}, "not a custom resource")],
)
def test_custom_resource_names_and_amounts(resources, says):
    with pytest.raises(ValidationError, match=says):
        Resources(resources=resources)


def test_memory_sizes():
    assert parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("512MiB") == 2**29 and parse_bytes(1000) == 1000
    with pytest.raises(ValueError, match="not a memory size"):
        parse_bytes("8 parsecs")
    assert Resources(memory="2GB").memory == 2 * 10**9


@pytest.mark.parametrize("address", ["local", "auto", "ray://head:10001", "ray://head", "10.0.0.1:6379", "h.x-y:1"])
def test_the_cluster_addresses_taken(address):
    assert Cluster(address=address).address == address


@pytest.mark.parametrize(
    "address", ["local\n", "auto ", " local", "head", "head:99999", "ray://", "ray://h:1/x", "hé:1", "h:1\n", "-h:1"]
)
def test_an_address_of_another_form_is_refused(address):
    with pytest.raises(ValidationError, match="give local"):
        Cluster(address=address)


def test_a_local_clusters_resources_are_refused_for_a_running_one():
    assert Cluster(address="local", resources={"big": 2}).resources == {"big": 2}
    with pytest.raises(ValidationError, match="cluster.resources are a local cluster's"):
        Cluster(address="auto", resources={"big": 2})
