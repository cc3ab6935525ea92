"""Runlog's processes: the ``runlog`` CLI, the Faust projector, dead letters, the resumer."""

from processors.cli import main

__all__ = ["main"]
