"""``python -m processors`` runs the ``runlog`` command line."""

import sys

from processors.cli import main

sys.exit(main())
