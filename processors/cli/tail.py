"""``runlog tail RUN``: a run's streamed model output from an offset (runlog.processors.streams)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tail", help="print a run's streamed model output from an offset",
                       description="Print the run's records of the streams topic (BEGIN, DELTA, EVENT, "
                                   "FINAL, SUPERSEDED), each with its offset; the last line (stderr) names "
                                   "the offset to resume from with --from. A record that does not decode is "
                                   "reported on stderr with its reason and sent to the dead-letter topic; "
                                   "the exit code is then 1.")
    p.add_argument("run_id", help="the run")
    p.add_argument("--from", dest="from_offset", type=int, default=0, metavar="OFFSET",
                   help="the first offset to read (default: 0, the oldest kept)")
    p.add_argument("--follow", action="store_true", help="keep printing records as they are written")
    p.add_argument("--until-final", action="store_true",
                   help="with --follow: stop after the run's final answer (once the run has ended: its "
                        "last FINAL record; a stream with no run on the log: its first)")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="with --follow: stop after this long without a record of the run")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    p.set_defaults(func=_tail)


#: a run in one of these states writes no more model output
_ENDED = frozenset({"COMPLETED", "FAILED", "BLOCKED", "CANCELLED"})


def _ended(settings: Settings, run_id: str) -> bool:
    """Whether the run has ended; a stream whose run the log does not know has nothing more coming."""
    from runlog.processors.operate import load_run

    state = load_run(settings, run_id)
    return state is None or state.status.value in _ENDED


def _tail(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    from runlog.processors.cli.resume import _run_known
    from runlog.processors.streams import StreamEntry, StreamReader

    settings = Settings.from_env()
    dlq = Producer(settings.producer_config())
    bad = printed = 0
    with StreamReader(settings, args.run_id, from_offset=args.from_offset, dead_letters=dlq) as reader:
        if reader.partition in reader.trimmed:
            print(f"runlog tail: records before offset {reader.trimmed[reader.partition]} are no longer kept "
                  "(the streams topic's retention); reading from there", file=sys.stderr)
        entries: Iterator[StreamEntry] = (
            reader.follow(idle_timeout=args.idle_timeout, until_final=args.until_final,
                          ended=lambda: _ended(settings, args.run_id)) if args.follow
            else reader.read_to_end())
        try:
            for entry in entries:
                r, err = entry.record, entry.error
                printed += 1
                if r is None:
                    bad += 1
                    assert err is not None
                    print(f"runlog tail: offset {entry.offset}: undecodable stream record ({err.reason}): "
                          f"{err.detail}; sent to {reader.dlq_topic}", file=sys.stderr)
                    if args.json:
                        print(json.dumps({"offset": entry.offset, "error": err.reason, "detail": err.detail}),
                              flush=True)
                    continue
                if args.json:
                    print(json.dumps({"offset": entry.offset, "kind": r.kind.value, "call_id": r.call_id,
                                      "stage": r.stage, "epoch": r.epoch, "attempt": r.attempt,
                                      "index": r.index, "part": r.part, "text": r.text, "data": r.data,
                                      "occurred_at": r.occurred_at}), flush=True)
                else:
                    body = r.text if r.text is not None else (r.data or "")
                    print(f"{entry.offset} {r.kind.value} {r.call_id} epoch={r.epoch} attempt={r.attempt} "
                          f"{body!r}", flush=True)
        except BaseException:
            print(f"runlog tail: next offset {reader.next_offset} (resume with --from {reader.next_offset})",
                  file=sys.stderr)
            raise
        next_offset = reader.next_offset
    if not printed and args.from_offset == 0 and not _run_known(settings, args.run_id):
        print(f"runlog tail: no run {args.run_id!r} in Redis or on the events topic", file=sys.stderr)
        return EXIT_FOUND
    print(f"runlog tail: next offset {next_offset} (resume with --from {next_offset})", file=sys.stderr)
    return EXIT_FOUND if bad else EXIT_OK
