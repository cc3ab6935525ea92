"""Runlog's processes, by role; each states its delivery guarantee at its top.

* the projector (:mod:`processors.projector`, a package with its Kafka security): the Faust app
  folding the events topic into Redis and the compacted topics; dead letters
  (:mod:`processors.dlq`) for records it cannot read;
* resume (:mod:`processors.resume`): the resumer service and the one resume protocol;
* the audit (:mod:`processors.audit`): replays the topic and checks every run's chain;
* operators (:mod:`processors.operate`, :mod:`processors.signal`, :mod:`processors.inspect`,
  :mod:`processors.console`): act on and look at runs;
* the ``runlog`` CLI (:mod:`processors.cli`, a module per group of commands) over all of them;
* beside the processes: the benchmark (:mod:`processors.bench`, a command of its own), the
  crash-and-resume demo (:mod:`processors.demo`, on the public SDK), and an example consumer that
  uses nothing of Runlog (:mod:`processors.examples`).
"""

from processors.cli import main

__all__ = ["main"]
