"""The TypeScript SDK's own checks, in the default suite: `npm ci` (when node_modules is
missing or the lockfile changed), `npm run build` (tsc: a type error fails here) and
`npm test` (the unit tests, Node's built-in runner). A failure shows npm's output."""

from __future__ import annotations

import pytest

from harness.typescript_sdk import NpmFailed, install_packages, node_missing, run_npm

pytestmark = pytest.mark.skipif(node_missing() is not None, reason=str(node_missing()))


def test_typescript_sdk_builds_and_its_unit_tests_pass() -> None:
    try:
        install_packages()
        run_npm("run", "build")
        output = run_npm("test")
    except NpmFailed as failed:
        pytest.fail(str(failed), pytrace=False)
    assert "# fail 0" in output, output
    assert "# skipped 0" in output, output  # the prefix check compares with dex_ha: it must run
