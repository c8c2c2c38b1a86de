"""The sweep tests: a package, so that its conftest.py loads as `sweep.conftest` beside tests/conftest.py."""
