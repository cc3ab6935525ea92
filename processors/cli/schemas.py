"""``runlog schemas register``: publish the Avro contract to a Schema Registry."""

from __future__ import annotations

import argparse
import json
import sys

from runlog.processors.cli.codes import EXIT_OK, EXIT_USAGE
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("schemas", help="the Avro contract: publish it to a Schema Registry")
    ssub = s.add_subparsers(dest="schemas_command", metavar="ACTION", required=True)
    r = ssub.add_parser(
        "register",
        help="register every schema at RUNLOG_SCHEMA_REGISTRY_URL with compatibility BACKWARD",
        description="Registers runlog.RunEvent, runlog.Checkpoint, runlog.Effect and "
        "runlog.ResumeRequest (record name subjects) and sets each subject's compatibility.",
    )
    r.add_argument("--compatibility", default="BACKWARD",
                   help="the compatibility level set on each subject (default: %(default)s)")
    r.add_argument("--json", action="store_true", help="print one JSON array, an object per subject")
    r.set_defaults(func=_register)


def _register(args: argparse.Namespace) -> int:
    from runlog.schemas.registry import register_schemas, registry_client

    settings = Settings.from_env()
    if not settings.schema_registry_url:
        print("runlog schemas register: RUNLOG_SCHEMA_REGISTRY_URL is not set", file=sys.stderr)
        return EXIT_USAGE
    done = register_schemas(registry_client(settings), compatibility=args.compatibility)
    if args.json:
        print(json.dumps([{"subject": d.subject, "schema_id": d.schema_id, "version": d.version,
                           "compatibility": d.compatibility} for d in done]))
    else:
        for d in done:
            print(f"{d.subject}: id {d.schema_id} version {d.version} compatibility {d.compatibility}")
    return EXIT_OK
