"""A tool call and the effects ledger: recorded before its result is used, an effect done once.

Above :mod:`~runlog.producers.log` (a call appends through the run's session), below
:mod:`~runlog.producers.run`.

* :mod:`runlog.producers.calls._call_steps`: a tool call as protocol steps (guard, ledger, retries, waits).
* :mod:`runlog.producers.calls._call_ledger`: the ledger's steps of an effect tool's call.
* :mod:`runlog.producers.calls._calls`: what a call records and hands back (calls, sources, outputs, errors).
* :mod:`runlog.producers.calls._keys`: canonical JSON and the keys derived from it (delivery, idempotency).
* :mod:`runlog.producers.calls._ledger`: one effects ledger for all runs (Redis).
* :mod:`runlog.producers.calls._ledger_topic`: the ledger's last source, the compacted effects topic.
* :mod:`runlog.producers.calls._artifacts`: the content-addressed artifact store (calls' arguments, results),
  on the filesystem or in memory.
"""
