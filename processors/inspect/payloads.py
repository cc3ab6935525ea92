"""Payloads shown safely, for ``runlog show`` and the other operator views: a JSON value or text
with whatever looks like a credential masked (by key name and by shape: private keys, bearer
tokens, passwords in URLs, known API key formats), long strings and lists cut, and an artifact
read from the store as a JSON value or as lines for the terminal."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from runlog.producers.internal import label
from runlog.schemas import ArtifactRef, Settings

if TYPE_CHECKING:
    from runlog.producers import ArtifactStore

__all__ = ["MAX_ITEMS", "MAX_LINES", "MAX_STRING", "REDACTED", "inline_refs_named", "payload_text",
           "payload_value", "redact", "redact_text", "text_opener"]

_SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?$|^pwd$|secret|token|api[-_]?key|apikey|auth(orization)?$|credential|"
    r"private[-_]?key|cookie|session[-_]?id|signature|access[-_]?key|client[-_]?secret", re.I)
_SECRET_TEXT = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
     "[redacted private key]"),
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.I), r"\1 [redacted]"),
    (re.compile(r"([a-z][a-z0-9+.-]*://)([^/\s:@]+):([^/\s@]+)@", re.I), r"\1\2:[redacted]@"),
    (re.compile(r"\b(sk|rk|pk)_(live|test)_[A-Za-z0-9]{8,}"), "[redacted]"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "[redacted]"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "[redacted]"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "[redacted]"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "[redacted]"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "[redacted]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "[redacted]"),
    (re.compile(r"\b(password|passwd|pwd|secret|token|api[-_]?key|access[-_]?key)(\s*[=:]\s*)"
                r"(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)", re.I), r"\1\2[redacted]"),
]
MAX_STRING = 300
MAX_ITEMS = 50
MAX_LINES = 40
REDACTED = "[redacted]"


_SEALED_TEXT = re.compile(r"rlenc1:[A-Za-z0-9+/=]+")
"""A sealed text field (:mod:`runlog.producers.base._envelope`) left unopened: shown as ``[sealed]``."""


def text_opener(settings: Settings) -> Callable[[str], str]:
    """Opens the sealed free text of events (error messages, operators' reasons) with the keyring when
    encryption is on (``[erased]`` for an erased subject; a text whose key this keyring lacks stays
    sealed); as they are otherwise. What is left sealed :func:`redact_text` shows as ``[sealed]``."""
    if not settings.encryption:
        return str
    from runlog.producers.internal import store_from_settings

    return store_from_settings(settings, inline=False).open_text


def redact_text(text: str) -> str:
    """``text`` with whatever looks like a credential replaced by ``[redacted]``, and a sealed text that
    was not opened (no keyring here) by ``[sealed]``."""
    text = _SEALED_TEXT.sub("[sealed]", text)
    for pattern, repl in _SECRET_TEXT:
        text = pattern.sub(repl, text)
    return text


def redact(value: Any, *, max_string: int | None = MAX_STRING, max_items: int | None = MAX_ITEMS) -> Any:
    """A JSON value with credential-looking fields and strings masked, long strings and lists cut."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if max_items is not None and i >= max_items:
                out["…"] = f"{len(value) - max_items} more keys"
                break
            secret = _SECRET_KEY.search(str(k)) is not None
            if secret and v is not None and not isinstance(v, (bool, int, float, Mapping, list)):
                out[str(k)] = REDACTED
            elif secret and isinstance(v, list) and all(isinstance(x, str) for x in v):
                out[str(k)] = [REDACTED for _ in v]
            else:
                out[str(k)] = redact(v, max_string=max_string, max_items=max_items)
        return out
    if isinstance(value, list):
        items = value if max_items is None else value[:max_items]
        out_l = [redact(v, max_string=max_string, max_items=max_items) for v in items]
        if len(items) < len(value):
            out_l.append(f"… {len(value) - len(items)} more items")
        return out_l
    if isinstance(value, str):
        text = redact_text(value)
        if max_string is not None and len(text) > max_string:
            text = f"{text[:max_string]}… ({len(value)} chars)"
        return text
    return value


def inline_refs_named(doc: Any) -> Any:
    """``doc`` (a JSON value, e.g. a run state's) with every inline artifact ref's ``data:`` URI (an
    object with ``uri`` and ``sha256``, or a run state's ``[uri, sha256, size, media type]``), which is
    the payload itself, replaced by its name (media type and hash, as :func:`label` gives): a view
    that shows refs never shows payloads that way, unmasked."""
    if isinstance(doc, dict):
        uri, sha, media = doc.get("uri"), doc.get("sha256"), doc.get("media_type")
        named = {k: inline_refs_named(v) for k, v in doc.items()}
        if isinstance(uri, str) and uri.startswith("data:") and isinstance(sha, str):
            named["uri"] = label(ArtifactRef(uri, sha, int(doc.get("size") or 0), str(media or "")))
        return named
    if isinstance(doc, list):
        if len(doc) == 4 and isinstance(doc[0], str) and doc[0].startswith("data:") \
                and isinstance(doc[1], str) and isinstance(doc[2], int) and isinstance(doc[3], str):
            return [label(ArtifactRef(doc[0], doc[1], doc[2], doc[3])), *doc[1:]]  # a state's ref
        return [inline_refs_named(v) for v in doc]
    return doc


def payload_value(store: ArtifactStore, ref: ArtifactRef | None) -> Any:
    """An artifact as a JSON value for ``--json`` output: parsed and redacted when it is JSON,
    redacted text when it is text, a description otherwise (or of why it cannot be read)."""
    from runlog.schemas import ArtifactError

    if ref is None:
        return None
    try:
        data = store.get(ref)
    except ArtifactError as err:
        return {"unavailable": str(err), "uri": label(ref)}
    if "json" in ref.media_type:
        try:
            return redact(json.loads(data))
        except ValueError:
            pass
    if ref.media_type.startswith("text/") or "json" in ref.media_type:
        return redact(data.decode("utf-8", "replace"), max_string=MAX_STRING * 10)
    return {"media_type": ref.media_type, "size": ref.size, "sha256": ref.sha256}


def payload_text(store: ArtifactStore, ref: ArtifactRef | None, *, max_lines: int = MAX_LINES) -> str:
    """An artifact for the terminal: pretty JSON (or text), redacted, at most ``max_lines`` lines."""
    if ref is None:
        return "(none recorded)"
    if "json" not in ref.media_type and not ref.media_type.startswith("text/"):
        return f"<{ref.media_type}, {ref.size} bytes, sha256 {ref.sha256}>"
    value = payload_value(store, ref)
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    lines = text.splitlines() or [""]
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"… {len(lines) - max_lines} more lines"]
    return "\n".join(lines)
