"""The event log: a run's events appended, delivered and read back, by the writer holding the run's lease.

Above :mod:`~runlog.producers.define` and :mod:`~runlog.producers.base`; the calls and the run build on it.

* :mod:`runlog.producers.log._log`: the event log port and its delivery semantics.
* :mod:`runlog.producers.log._writer`: the Kafka adapter, one idempotent producer per process.
* :mod:`runlog.producers.log._session`: one writer's hold on one run (gapless seq, the epoch, confirmation).
* :mod:`runlog.producers.log._lease`: the single-writer lease on a run (Redis);
  :mod:`runlog.producers.log._lease_beats`: its verifies, coalesced.
* :mod:`runlog.producers.log._cloudevents`: the CloudEvents headers of every record.
* :mod:`runlog.producers.log._metrics`: the writer's Prometheus metrics.
* :mod:`runlog.producers.log._runlog`: reading back a run's first event (an interrupted start).
* :mod:`runlog.producers.log._memory`: in-memory adapters of the ports (event log, lease).
"""
