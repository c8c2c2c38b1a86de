"""The cluster tests: a package, so that its conftest.py loads as `cluster.conftest` beside tests/conftest.py."""
