"""``python -m processors.cli`` runs the ``runlog`` command line (as ``python -m processors`` does)."""

import sys

from processors.cli import main

sys.exit(main())
