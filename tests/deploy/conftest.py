"""Fixtures of the deployment tests: the three-node cluster of tests/e2e (`dex-ha cluster up`)."""

from tests.e2e.conftest import cluster  # noqa: F401  (a fixture, found by pytest through this conftest)
