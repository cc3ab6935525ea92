"""The audit report as one self-contained, static HTML page (inline CSS, no scripts, no external files)."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["render_html"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1d232a;background:#fafbfc}
h1{font-size:1.6em;margin:0 0 .2em}h2{font-size:1.15em;margin:0}
.summary{display:flex;gap:1.5em;margin:1em 0 2em}.summary div{background:#fff;border:1px solid #d8dde3;
border-radius:6px;padding:.6em 1em}.summary b{display:block;font-size:1.4em}
.ok{color:#1a7f37}.bad{color:#cf222e}
section.run{background:#fff;border:1px solid #d8dde3;border-radius:8px;padding:1em 1.2em;margin:0 0 1.5em}
section.run.has-findings{border-color:#cf222e;box-shadow:0 0 0 2px #ffd8d3}
.status{font-size:.8em;padding:.1em .5em;border-radius:4px;background:#eef1f4;margin-left:.5em}
.status.COMPLETED{background:#dafbe1}.status.BLOCKED,.status.FAILED{background:#ffebe9}
.status.RUNNING{background:#fff8c5}
.meta{color:#57606a;margin:.3em 0 .8em}
ul.findings{margin:.4em 0 1em;padding:0;list-style:none}
li.finding{background:#ffebe9;border-left:4px solid #cf222e;padding:.35em .7em;margin:.25em 0;
font-family:ui-monospace,monospace;font-size:.9em}
li.finding .kind{font-weight:700;margin-right:.6em}
ol.timeline{list-style:none;padding:0;margin:0;border-left:3px solid #d8dde3}
ol.timeline>li{margin:.3em 0 .3em .8em}
li.stage{border:1px solid #d8dde3;border-radius:6px;padding:.3em .6em;background:#f6f8fa}
li.stage.verified{border-color:#1a7f37}li.stage.failed{border-color:#cf222e}
li.stage.interrupted{border-color:#bf8700;border-style:dashed}
.stage-head{font-weight:600}.stage-head .outcome{font-weight:400;color:#57606a;margin-left:.4em}
ol.events{list-style:none;padding:0;margin:.2em 0 0 .4em}
li.event{font-family:ui-monospace,monospace;font-size:.85em;white-space:pre-wrap}
li.event .seq{display:inline-block;width:3.5em;color:#57606a}
li.event.lease{color:#8250df;font-weight:600}li.event.effect{color:#9a6700}
li.event.checkpoint{color:#1a7f37;font-weight:600}li.event.tool{color:#0969da}
li.event.rejected{background:#ffebe9;color:#cf222e;text-decoration:line-through}
li.event.flagged{background:#ffebe9;outline:2px solid #cf222e}
li.event.duplicate{color:#8c959f}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em}
td,th{border:1px solid #d8dde3;padding:.2em .5em;text-align:left;font-family:ui-monospace,monospace}
h3{font-size:1em;margin:1em 0 .2em}
"""

KIND_CLASS = {
    "LEASE_ACQUIRED": "lease", "RUN_STARTED": "lease", "RUN_BRANCHED": "lease",
    "TOOL_CALLED": "tool", "TOOL_RESULT": "tool",
    "EFFECT_INTENT": "effect", "EFFECT_RESULT": "effect", "EFFECT_RECONCILED": "effect",
    "VERIFIED": "checkpoint",
}


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def event_classes(ev: Mapping[str, Any], flagged: set[int],
                  kinds: Mapping[str, str] = KIND_CLASS) -> list[str]:
    """The CSS classes of one audit entry: its type, its kind, and how the fold took it."""
    classes = ["event", f"type-{ev['type']}", kinds.get(ev["type"], "other")]
    if ev["outcome"].startswith("rejected"):
        classes.append("rejected")
    elif ev["outcome"] == "duplicate":
        classes.append("duplicate")
    elif ev["seq"] in flagged:
        classes.append("flagged")
    return classes


def event_bits(ev: Mapping[str, Any], extra: Iterable[str] = ()) -> list[str]:
    """The words of one audit entry's line (``extra`` goes before the outcome, when not accepted)."""
    bits = [ev["type"]]
    bits.extend(str(ev[k]) for k in ("stage", "call_id", "policy", "target") if ev.get(k))
    if ev.get("external_id"):
        bits.append(f"external_id={ev['external_id']}")
    if ev["type"] == "LEASE_ACQUIRED":
        bits.append(f"epoch {ev['epoch']} writer={ev.get('writer') or '?'}")
    if ev["type"] == "VERIFIED":
        bits.append(f"{ev.get('artifacts', 0)} artifacts; rules: {', '.join(ev.get('rules', []))}")
    if ev.get("error"):
        bits.append(str(ev["error"]))
    if ev.get("by"):  # a person's event: what they decided, who, why
        bits.append(" ".join(x for x in (ev.get("action") or "", ev.get("decision") or "",
                                         f"by {ev['by']}", f"({ev['why']})" if ev.get("why") else "") if x))
    bits.extend(extra)
    if ev["outcome"] != "accepted":
        bits.append(f"[{ev['outcome']}: {ev.get('reason')}]")
    return bits


def _event_li(ev: dict[str, Any], flagged: set[int]) -> str:
    classes = event_classes(ev, flagged)
    return (f'<li class="{" ".join(classes)}" data-seq="{ev["seq"]}" data-epoch="{ev["epoch"]}" '
            f'data-offset="{ev["offset"]}"><span class="seq">{ev["seq"]}</span>e{ev["epoch"]} '
            f'{_e(" ".join(event_bits(ev)))}</li>')


def _timeline(run: dict[str, Any]) -> str:
    flagged = {f["seq"] for f in run["findings"] if f["seq"] is not None}
    blocks = run["stages"]
    items: list[tuple[str, Any]] = []  # ("event", ev) or ("stage", index)
    members: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(blocks))}
    current: int | None = None
    for ev in run["events"]:
        if ev["outcome"] == "accepted":
            current = next((i for i, b in enumerate(blocks) if b["from_seq"] <= ev["seq"] <= b["to_seq"]),
                           None)
            if current is not None and ev["seq"] == blocks[current]["from_seq"]:
                items.append(("stage", current))
            if current is not None:
                members[current].append(ev)
                if ev["seq"] == blocks[current]["to_seq"]:
                    current = None
            else:
                items.append(("event", ev))
        elif current is not None:
            members[current].append(ev)
        else:
            items.append(("event", ev))
    out = ['<ol class="timeline">']
    for kind, v in items:
        if kind == "event":
            out.append(_event_li(v, flagged))
            continue
        b = blocks[v]
        out.append(f'<li class="stage {b["outcome"]}" data-stage="{_e(b["stage"])}" '
                   f'data-outcome="{b["outcome"]}" data-seq="{b["from_seq"]}">'
                   f'<div class="stage-head">{_e(b["stage"])}<span class="outcome">{b["outcome"]} · seq '
                   f'{b["from_seq"]}-{b["to_seq"]} · epoch {b["epoch"]}</span></div><ol class="events">')
        out.extend(_event_li(ev, flagged) for ev in members[v])
        out.append("</ol></li>")
    out.append("</ol>")
    return "\n".join(out)


def _run_section(run: dict[str, Any]) -> str:
    wf = run["workflow"]
    has = bool(run["findings"])
    epochs = sorted({e["epoch"] for e in run["events"] if e["outcome"] == "accepted"})
    parts = [f'<section class="run{" has-findings" if has else ""}" id="run-{_e(run["run_id"])}" '
             f'data-run="{_e(run["run_id"])}" data-status="{_e(run["status"])}">',
             f'<h2>{_e(run["run_id"])}<span class="status {_e(run["status"])}">'
             f'{_e(run["status"])}</span></h2>',
             f'<p class="meta">{_e(wf["name"] + "@" + wf["version"]) if wf else "unknown workflow"} · '
             f'seq {run["last_seq"]} · epochs {_e(", ".join(map(str, epochs)))} · '
             f'{len(run["events"])} events · partition {run["partition"]}'
             f'{" · partial (began before the range)" if run["partial"] else ""}'
             f'{" · branched from " + _e(run["parent_run_id"]) if run["parent_run_id"] else ""}</p>']
    if has:
        parts.append('<ul class="findings">')
        for f in run["findings"]:
            seq = f" seq {f['seq']}" if f["seq"] is not None else ""
            parts.append(f'<li class="finding kind-{_e(f["kind"])}" data-kind="{_e(f["kind"])}">'
                         f'<span class="kind">{_e(f["kind"])}{seq}</span>{_e(f["detail"])}</li>')
        parts.append("</ul>")
    else:
        parts.append('<p class="ok">no findings</p>')
    parts.append(_timeline(run))
    if run["checkpoints"]:
        parts.append("<h3>Checkpoints</h3><table><tr><th>checkpoint</th><th>stage</th><th>next</th>"
                     "<th>offset</th><th>artifacts</th></tr>")
        for c in run["checkpoints"]:
            parts.append(f'<tr class="checkpoint"><td>{_e(c["checkpoint_id"])}</td><td>{_e(c["stage"])}</td>'
                         f'<td>{_e(c["next_stage"])}</td><td>{c["offset"]}</td>'
                         f'<td>{len(c["artifacts"])}</td></tr>')
        parts.append("</table>")
    if run["effects"]:
        parts.append("<h3>Effects</h3><table><tr><th>delivery key</th><th>tool</th><th>target</th>"
                     "<th>status</th><th>external id</th><th>seq</th></tr>")
        for x in run["effects"]:
            parts.append(f'<tr class="effect {_e(x["status"])}"><td>{_e(x["delivery_key"][:16])}</td>'
                         f'<td>{_e(x["tool"])}</td><td>{_e(x["target"])}</td><td>{_e(x["status"])}</td>'
                         f'<td>{_e(x["external_id"])}</td><td>{x["seq"]}</td></tr>')
        parts.append("</table>")
    parts.append("</section>")
    return "\n".join(parts)


def render_html(report: dict[str, Any]) -> str:
    """The page for a report as :meth:`runlog.processors.audit.AuditReport.to_dict` gives it."""
    n = len(report["findings"])
    verdict = f'<span class="{"bad" if n else "ok"}">{n} finding{"s" if n != 1 else ""}</span>'
    head = (f'<div class="summary"><div><b>{len(report["runs"])}</b>runs</div>'
            f'<div><b>{report["events"]}</b>events</div>'
            f'<div><b>{report["rejected_events"]}</b>rejected events</div>'
            f'<div><b>{verdict}</b>findings</div></div>')
    body = "\n".join(_run_section(r) for r in report["runs"])
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Runlog audit of {_e(report['topic'])}</title><style>{_CSS}</style></head><body>"
            f"<h1>Runlog audit</h1><p class=\"meta\">topic {_e(report['topic'])} · made {made} · "
            f"{report['records']} records read in {report['seconds']}s</p>{head}\n{body}\n</body></html>\n")
