"""``runlog erase`` and ``runlog keys``: a subject's data erased by destroying its key; key rotation
(:mod:`runlog.processors.erase`, :mod:`runlog.producers.internal` ``SubjectKeys``)."""

from __future__ import annotations

import argparse
import json
import sys

from runlog.processors.cli.codes import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "erase", help="erase a subject's payloads everywhere by destroying its data key",
        description="Crypto-shredding: destroy the subject's data key in the keyring (RUNLOG_KEYRING), so "
        "every payload sealed under it (events, Redis, artifacts, streams, backups) reads nowhere; block "
        "the subject's open runs (RUN_BLOCKED, reason erased, who and why on the log); delete its stored "
        "artifacts. The log is not rewritten: `runlog audit` still verifies every chain and lists the "
        "subject's runs as erased. Needs RUNLOG_ENCRYPTION=true. Irreversible.")
    p.add_argument("--subject", required=True, help="the subject (the id runs were started with)")
    p.add_argument("--by", required=True, metavar="WHO", help="who is acting (recorded on the log)")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded on the log)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_erase)

    p = sub.add_parser("keys", help="key-encryption keys of the keyring: rotate, retire",
                       description="Rotate makes a new key-encryption key version current and re-wraps "
                       "every subject's data key under it (payloads untouched); older versions still "
                       "unwrap until retired. Retire destroys the versions no wrapped key needs any more.")
    keys = p.add_subparsers(dest="keys_command", metavar="{rotate,retire}")
    k = keys.add_parser("rotate", help="new KEK version; data keys re-wrapped")
    k.add_argument("--json", action="store_true", help="print the result as JSON")
    k.set_defaults(func=_rotate)
    k = keys.add_parser("retire", help="destroy KEK versions no wrapped data key uses")
    k.add_argument("--json", action="store_true", help="print the result as JSON")
    k.set_defaults(func=_retire)
    p.set_defaults(func=_keys_usage)


def _keys_usage(args: argparse.Namespace) -> int:
    print("runlog keys: say rotate or retire", file=sys.stderr)
    return EXIT_USAGE


def _erase(args: argparse.Namespace) -> int:
    from runlog.processors.erase import erase_subject
    from runlog.processors.operate import OperatorRefused

    try:
        res = erase_subject(Settings.from_env(), args.subject, by=args.by, reason=args.reason)
    except OperatorRefused as err:
        print(f"runlog erase: refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(res.to_dict()) if args.json else res.detail)
    return EXIT_OK


def _rotate(args: argparse.Namespace) -> int:
    from runlog.producers.internal import subject_keys

    keys = subject_keys(Settings.from_env())
    version = keys.provider.rotate()
    count = keys.rewrap()
    doc = {"kek_version": version, "rewrapped": count}
    print(json.dumps(doc) if args.json else f"key-encryption key v{version} is current; {count} data keys "
          "re-wrapped (payloads untouched; `runlog keys retire` destroys the older versions)")
    return EXIT_OK


def _retire(args: argparse.Namespace) -> int:
    from runlog.producers.internal import subject_keys

    keys = subject_keys(Settings.from_env())
    used = keys.kek_versions_in_use()
    below = min(used | {keys.provider.current_version()})
    gone = keys.provider.retire(below)
    print(json.dumps({"retired": gone}) if args.json else
          f"retired KEK versions {gone or 'none'} (in use: {sorted(used) or 'none'})")
    return EXIT_OK
