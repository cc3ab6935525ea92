"""``runlog console``: a live web console over runs, their timelines, operator actions and health.

An aiohttp application with Jinja2 templates (package data, like its script and stylesheet):
the run list from the Redis projection, a run's timeline read from the log and followed live
(server-sent events), its checkpoints and effects, buttons for the operator actions (the same
functions as ``runlog resolve|cancel|retry|signal|approve|reject``) and the health of the
projector and resumer groups. See :mod:`runlog.processors.console._guard` for what protects it.
"""

from typing import TYPE_CHECKING

from runlog.schemas.internal import lazy_names

if TYPE_CHECKING:
    from runlog.processors.console._app import make_app, serve
    from runlog.processors.console._console import Console, ConsoleOptions

# imported on first use: ``runlog`` builds its parser from ``_cmd`` without loading aiohttp
__getattr__, __dir__ = lazy_names(__name__, {"make_app": "runlog.processors.console._app",
                                             "serve": "runlog.processors.console._app",
                                             "Console": "runlog.processors.console._console",
                                             "ConsoleOptions": "runlog.processors.console._console"})

__all__ = ["Console", "ConsoleOptions", "make_app", "serve"]
