"""``python -m clusterkit``: the CLI, for a login node whose PATH lacks the console script."""

import sys

from clusterkit.cli.main import main

sys.exit(main())
