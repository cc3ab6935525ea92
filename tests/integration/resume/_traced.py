"""A traced process for the trace tests: its spans go to OpenTelemetry's in-memory exporter and,
after every span that ends, to a JSON file the test reads (a SIGKILLed process keeps what ended).

``python -m tests.integration.resume._traced MODE SPANS_FILE [ARGS...]``, settings from the
environment:

* ``start``: start a run of ``traced`` with ``Runner(tracer=OtelTracer(provider))`` (a provider
  passed in), print its id, execute it (``RUNLOG_CRASH_AT=inside:STAGE:finish`` kills it there);
* ``resumer``: a :class:`ResumerService` on the global tracer provider, until it resumed one run
  (prints the outcome);
* ``cli ARGS...``: ``runlog ARGS...`` (``runlog.processors.cli.main``) on the global tracer provider.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runlog.processors.resume import App, ResumerService
from runlog.producers import DictInputSource, Runner, Workflow, tool
from runlog.producers.crash import arm_from_env
from runlog.producers.otel import OtelTracer
from runlog.producers.run._context import StageContext
from runlog.schemas import Settings

wf = Workflow("traced", "1")


@tool("traced_lookup")
def lookup(call: Any, q: str) -> dict[str, Any]:
    return {"answer": q}


@tool("traced_render")
def render(call: Any, text: str) -> dict[str, Any]:
    return {"text": text.upper()}


@wf.stage("gather")
def gather(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return ctx.call(lookup, q="trace")


@wf.stage("finish")
def finish(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
    return ctx.call(render, text=str(ctx.output_of("gather")["answer"]))


app = App.of([wf], [lookup, render], DictInputSource({}))


def plain(s: ReadableSpan) -> dict[str, Any]:
    assert s.context is not None
    return {"name": s.name, "trace_id": f"{s.context.trace_id:032x}", "span_id": f"{s.context.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent is not None else None,
            "parent_trace": f"{s.parent.trace_id:032x}" if s.parent is not None else None,
            "links": [[f"{x.context.trace_id:032x}", f"{x.context.span_id:016x}"] for x in s.links],
            "kind": s.kind.name, "attributes": dict(s.attributes or {})}


class Dump(SimpleSpanProcessor):
    """Exports to the in-memory exporter, then writes all it holds to ``path``."""

    def __init__(self, exporter: InMemorySpanExporter, path: Path) -> None:
        super().__init__(exporter)
        self.memory, self.path = exporter, path

    def on_end(self, span: ReadableSpan) -> None:
        super().on_end(span)
        doc = [plain(s) for s in self.memory.get_finished_spans()]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)


def provider(path: Path) -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(Dump(InMemorySpanExporter(), path))
    return p


def main(argv: list[str]) -> int:
    mode, out = argv[0], Path(argv[1])
    settings = Settings.from_env()
    if mode == "start":
        arm_from_env()
        tp = provider(out)
        with Runner.from_settings(settings, source=app.source, tracer=OtelTracer(tp)) as r:
            h = r.start_run(wf, {})
            print(h.run_id, flush=True)
            assert h.session is not None
            r.execute(h.session)
        return 0
    trace.set_tracer_provider(provider(out))
    if mode == "resumer":
        with ResumerService(settings, app) as service:
            deadline = time.monotonic() + 90
            service.serve(stop=lambda: bool(service.outcomes) or time.monotonic() > deadline)
            print(json.dumps([o.result for o in service.outcomes]), flush=True)
        return 0
    from runlog.processors.cli import main as runlog

    return runlog(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
