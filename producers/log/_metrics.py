"""The writer's Prometheus metrics (``runlog_writer_*``), in a registry the application owns.

The SDK starts no HTTP server and never touches ``prometheus_client``'s global registry: a
:class:`~runlog.producers.log._writer.RunWriter` counts only when it is given a registry
(``RunWriter(settings, metrics_registry=registry)``), and the application exposes that
registry as it likes (``prometheus_client.start_http_server(port, registry=registry)``,
``make_wsgi_app(registry)``, ``make_asgi_app(registry)``, or ``generate_latest(registry)``
from a route of its own). Without a registry the cost is one ``None`` check per append.
Several writers given one registry share its metrics.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["CONFIRM_BUCKETS", "WriterMetrics"]

CONFIRM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, WriterMetrics] = weakref.WeakKeyDictionary()


class WriterMetrics:
    """``runlog_writer_appends_total``, ``runlog_writer_confirmed_append_seconds{mode}``,
    ``runlog_writer_delivery_failures_total{error}``, ``runlog_writer_budget_events_total`` and
    ``runlog_writer_stream_records_total{outcome}`` in one registry; use :meth:`of`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.appends = Counter("runlog_writer_appends_total",
                               "Run events handed to the producer (every append, confirmed or not).",
                               registry=registry)
        self.confirmed = Histogram("runlog_writer_confirmed_append_seconds",
                                   "Seconds a confirmed append waited for its delivery report (sync: "
                                   "send_now, async: asend_now; a failed delivery's wait included).",
                                   ["mode"],
                                   buckets=CONFIRM_BUCKETS, registry=registry)
        self.failures = Counter("runlog_writer_delivery_failures_total",
                                "Run events whose delivery failed, by librdkafka error name.", ["error"],
                                registry=registry)
        self.budget = Counter("runlog_writer_budget_events_total",
                              "Model-call budget events by kind: soft (a soft cap reached: a warning on "
                              "the call's TOOL_RESULT), wait (a hard cap reached: the run waits for runlog "
                              "budget), fail (a hard cap reached: the run failed).", ["workflow", "kind"],
                              registry=registry)
        self.stream = Counter("runlog_writer_stream_records_total",
                              "Stream records (streamed model output, runlog.producers.streams) by outcome: "
                              "produced (handed to the producer), dropped (the producer's queue was full: "
                              "never waited for), failed (the broker did not acknowledge it).", ["outcome"],
                              registry=registry)
        self.confirmed_sync = self.confirmed.labels("sync")
        self.confirmed_async = self.confirmed.labels("async")

    @classmethod
    def of(cls, registry: CollectorRegistry) -> WriterMetrics:
        """The writer metrics of ``registry``, registered on first use (shared by its writers)."""
        with _lock:
            m = _by_registry.get(registry)
            if m is None:
                m = _by_registry[registry] = cls(registry)
            return m
