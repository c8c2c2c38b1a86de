"""The cluster tests' shared stand-in: `fake_ray` (what connecting and sizing call). This folder is a package (its
`__init__.py`), so this conftest loads as `cluster.conftest` and never takes the place of tests/conftest.py, which
test modules import by the name `conftest`."""

from __future__ import annotations

import pytest


class FakeRay:
    """What connecting and sizing call, over one node of 2 CPUs (nothing is submitted)."""

    def init(self, **opts):
        self.opts = opts

    def nodes(self):
        return [{"Alive": True, "NodeID": "n" * 20, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 2.0}}]

    def shutdown(self):
        pass


@pytest.fixture
def fake_ray():
    return FakeRay()
