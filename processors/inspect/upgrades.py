"""How a ``RUN_UPGRADED`` event reads (``runlog show``, the audit report, the console)."""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["describe_upgrade"]


def _names(text: str | None) -> list[str]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def describe_upgrade(attributes: Mapping[str, str]) -> str:
    """``upgrade 1 -> 2 from checkpoint cp-... (kept pick, pay; re-runs notify)``, from the event's
    attributes (``from``, ``to``, ``checkpoint``, ``completed``, ``rerun``)."""
    kept, rerun = _names(attributes.get("completed")), _names(attributes.get("rerun"))
    cp = attributes.get("checkpoint") or ""
    where = f"from checkpoint {cp}" if cp else "from its first stage"
    return (f"upgrade {attributes.get('from') or '?'} -> {attributes.get('to') or '?'} {where} "
            f"(kept {', '.join(kept) or 'none'}; re-runs {', '.join(rerun) or 'none'})")
