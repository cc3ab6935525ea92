"""Runlog's processes, by role; each states its delivery guarantee at its top.

* the projector (:mod:`runlog.processors.projector`, a package with its Kafka security): the Faust app
  folding the events topic into Redis and the compacted topics; dead letters
  (:mod:`runlog.processors.dlq`) for records it cannot read;
* resume (:mod:`runlog.processors.resume`): the resumer service and the one resume protocol;
* the audit (:mod:`runlog.processors.audit`): replays the topic and checks every run's chain;
* operators (:mod:`runlog.processors.operate`, :mod:`runlog.processors.signal`,
:mod:`runlog.processors.inspect`,
  :mod:`runlog.processors.console`): act on and look at runs;
* the ``runlog`` CLI (:mod:`runlog.processors.cli`, a module per group of commands) over all of them;
* beside the processes: the benchmark (:mod:`runlog.processors.bench`, a command of its own), the
  crash-and-resume demo (:mod:`runlog.processors.demo`, on the public SDK), and an example consumer that
  uses nothing of Runlog (:mod:`runlog.processors.examples`).
"""

from runlog.schemas.internal import lazy_names

# imported on first use: importing one of this package's modules does not load every command's
__getattr__, __dir__ = lazy_names(__name__, {"main": "runlog.processors.cli"})

__all__ = ["main"]
