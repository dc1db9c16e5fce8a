"""The `dex-ha` command (console script `dex_ha.cli:main`; `python -m dex_ha.cli` too).

One module per group of commands: node.py (dev, node), cluster.py (cluster up/down),
status.py, members.py (step-down, members), sessions.py, backup.py (backup, restore),
demo.py; main.py builds the parser and runs a command; remote.py finds the active node;
common.py holds the exit codes and shared options.
"""

from dex_ha.cli.main import main

__all__ = ["main"]
