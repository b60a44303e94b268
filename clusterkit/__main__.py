"""``python -m clusterkit``: the CLI, for a login node whose PATH lacks the console script."""

import sys

from clusterkit.cli import main

sys.exit(main())
