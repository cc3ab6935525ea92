"""``runlog console``: serve the live web console (imports the web stack only when it runs)."""

from __future__ import annotations

import argparse
import logging
import sys

from runlog.processors.cli.codes import EXIT_OK
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "console", help="serve the live web console: runs, live timelines, operator actions, health",
        description=(
            "Serve a web page (on 127.0.0.1 unless --host says otherwise) listing runs by status with "
            "filters and search, each run's timeline as the log has it (updating as events arrive), its "
            "checkpoints and effects, buttons to resolve, signal, approve, reject, cancel and retry "
            "(the same code as the CLI commands), and the lag of the projector and resumer groups with "
            "the dead letters. Every action needs RUNLOG_CONSOLE_TOKEN and the name of the person "
            "acting; without the token, actions are refused and pages can still be read."),
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; another one needs RUNLOG_CONSOLE_TOKEN, "
                   "and pages then ask for it too)")
    p.add_argument("--port", type=int, default=8470, help="port to listen on (default 8470)")
    p.add_argument("--app", default=None, metavar="MODULE:ATTRIBUTE",
                   help="module:attribute of the application (a runlog.App); the retry button needs it")
    p.add_argument("--projector-group", action="append", default=None, metavar="GROUP",
                   help="consumer group of the projector (runlog project --app-id; default "
                   "runlog-projector); repeat for several")
    p.add_argument("--projector-metrics", default=None, metavar="URL",
                   help="the projector's Prometheus endpoint, for its recoveries (default "
                   "http://127.0.0.1:$RUNLOG_METRICS_PORT/metrics)")
    p.set_defaults(func=_console)


def _console(args: argparse.Namespace) -> int:
    from runlog.processors.console import ConsoleOptions, serve
    from runlog.processors.resume import load_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    settings = Settings.from_env()
    app = load_app(args.app) if args.app else None
    opts = ConsoleOptions(host=args.host, port=args.port, app_spec=args.app,
                          projector_groups=tuple(args.projector_group or ("runlog-projector",)),
                          projector_metrics_url=args.projector_metrics)
    serve(settings, opts, app=app)
    return EXIT_OK
