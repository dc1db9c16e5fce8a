"""DEX_HA_LONG=1 turns on the long runs (thousands of simulation seeds, the 30-minute
robustness loop, more property examples, the container image build); any other value, or
none, leaves the default suite. One reading for every test, as scripts/test reads it."""

from __future__ import annotations

import os
from collections.abc import Mapping

LONG_RUNS_ENV = "DEX_HA_LONG"


def long_runs(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether DEX_HA_LONG=1 asks for the long runs."""
    return environ.get(LONG_RUNS_ENV, "").strip() == "1"
