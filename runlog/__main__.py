"""``python -m runlog`` runs the ``runlog`` command line."""

import sys

from runlog.processors.cli import main

sys.exit(main())
