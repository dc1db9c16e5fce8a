"""The old home of the failpoints: they live in `dex_ha.failpoints` (stdlib only, below every
layer) so that the Worker SDK can use them without importing the Raft package."""

from dex_ha.failpoints import FAILPOINT_ENV, FAILPOINT_EXIT_CODE, Failpoints

__all__ = ["FAILPOINT_ENV", "FAILPOINT_EXIT_CODE", "Failpoints"]
