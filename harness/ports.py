"""Free loopback ports for tests and benches: the one helper, imported from here.

The code lives in dex_ha.local_cluster because `dex-ha cluster up` needs it too; tests
and the harnesses import it from this module so that there is one name for one job outside
the product.
free_ports(n) gives n distinct free ports (held together while asking);
free_port_range(n) gives the first of n consecutive ones (`cluster up` uses base + i).
A port is free when asked; a test that starts a listener on it later may still lose a
race with another process, and the harnesses that care retry.
"""

from __future__ import annotations

from dex_ha.local_cluster import free_port_range, free_ports

__all__ = ["free_port_range", "free_ports"]
