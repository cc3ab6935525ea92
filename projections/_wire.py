"""A pipeline of commands packed by hiredis and sent over one pooled connection of a standalone client.

The projector sends one ``EVALSHA`` of about fifty arguments per run a batch touches. redis-py's
pipeline packs each argument through its encoder in Python (a type check, an ``encode`` and a
generator step per argument) before hiredis joins them: about 50 us per command on the machines
the bench runs on, as much as folding and encoding the run's state together. ``hiredis.pack_command``
takes ``str``, ``int`` and ``bytes`` as they are and packs a command in about 8 us
(docs/performance.md, "Where a record's lag went at a fifth of capacity").

:func:`pipeline` does what a non-transactional redis-py pipeline with ``raise_on_error=False`` does
for such commands, below its command stack: it takes a connection from the client's pool (connected,
authenticated, TLS as configured), sends every command in one write, reads one reply per command
(an error reply in place, as the pipeline returns it) and gives the connection back. A connection
that fails is dropped and the whole send is tried again under the connection's own retry policy, as
redis-py does; what a retried command already did is the caller's to make harmless (the apply
script's offset compare-and-set). Any other client (a cluster, a client holding a single
connection, no hiredis) goes through redis-py's own pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

_pack: Callable[[Any], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis]); kept working without
    _pack = None

__all__ = ["Command", "packs_fast", "pipeline"]

Command = Sequence[str | int | bytes]


def packs_fast(client: Any) -> bool:
    """Whether :func:`pipeline` packs ``client``'s commands itself (else redis-py's pipeline does)."""
    return (_pack is not None and type(client) is redis.Redis
            and getattr(client, "connection", None) is None)


def pipeline(client: Any, commands: Sequence[Command]) -> list[Any]:
    """Each command's reply, in order; an error reply is the exception in its place (not raised).

    Replies are as the server sends them: for commands redis-py converts (``SET`` to a bool, ...)
    the two paths differ, so this is for commands it leaves alone (``EVALSHA``, integer replies).

    Raises:
        redis.ConnectionError, redis.TimeoutError: the server did not answer, after the connection's
            retries.
        redis.DataError: a value hiredis cannot pack (as redis-py's encoder refuses it).
    """
    if not commands:
        return []
    if not packs_fast(client):
        pipe = client.pipeline(transaction=False)
        for c in commands:
            pipe.execute_command(*c)
        return list(pipe.execute(raise_on_error=False))
    assert _pack is not None
    try:
        packed = [b"".join([_pack(tuple(c)) for c in commands])]  # one write, as redis-py joins them
    except (TypeError, UnicodeError) as err:  # a value hiredis cannot pack: redis-py's DataError
        raise redis.DataError(f"cannot pack a command: {err}") from err
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        return conn.retry.call_with_retry(lambda: _send(conn, packed, len(commands)), _dropper(conn))  # type: ignore[no-any-return]
    finally:
        pool.release(conn)


def _send(conn: Any, packed: list[bytes], n: int) -> list[Any]:
    conn.send_packed_command(packed)
    out: list[Any] = []
    try:
        for _ in range(n):
            try:
                out.append(conn.read_response())
            except redis.ResponseError as err:
                out.append(err)
    except BaseException:
        conn.disconnect()  # replies of the rest may still be on the socket: never hand it on
        raise
    return out


def _dropper(conn: Any) -> Callable[[Exception], None]:
    def fail(_err: Exception) -> None:
        conn.disconnect()  # the next try connects again

    return fail
