"""The public names of each package are pinned: changing them is a deliberate act."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["schemas", "producers", "projections", "processors"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    mod = importlib.import_module(name)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert sorted(exported) == sorted(set(exported)), "duplicates in __all__"
    for n in exported:
        assert hasattr(mod, n), f"{name}.{n} is in __all__ but missing"


def test_schemas_public_api_is_pinned() -> None:
    import schemas

    assert set(schemas.__all__) >= {
        "RunEvent", "Checkpoint", "Effect", "ResumeRequest", "ArtifactRef", "Codec",
        "EventType", "ReplayPolicy", "EffectStatus", "Settings", "Topics", "RunlogError",
        "DecodeError", "LeaseLost", "ConfigError", "ArtifactError", "ResumeBlocked",
    }
