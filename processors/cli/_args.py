"""Option values the ``runlog`` commands share, parsed after argparse (a bad value is a
:class:`~runlog.schemas.errors.ConfigError`: one line naming the option, exit 2)."""

from __future__ import annotations

import json
from typing import Any

from runlog.schemas.errors import ConfigError

__all__ = ["json_object"]


def json_object(text: str, option: str = "--params") -> dict[str, Any]:
    """A JSON object (``--params '{"to": "ada"}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{option} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option} must be a JSON object, not {type(value).__name__}")
    return value
