"""`python -m dex_ha.cli ARGS` = `dex-ha ARGS` (how `cluster up` and the tests start nodes)."""

import sys

from dex_ha.cli.main import main

sys.exit(main())
