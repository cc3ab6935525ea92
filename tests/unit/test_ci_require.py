"""``tests.conftest.require``: a missing service or tool skips a test on a developer's machine and fails
it under ``CI=true``; and the parallel run's groups (``tests.conftest.xdist_group``)."""

from __future__ import annotations

import pytest

from tests.conftest import (
    SERIAL,
    SERIAL_LANES,
    XDIST_GROUPS,
    require,
    require_module,
    serial_lane,
    xdist_group,
)


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_under_ci_a_missing_requirement_fails(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"no chromium .*CI=true"):
        require(None, "no chromium")
    with pytest.raises(pytest.fail.Exception, match="needed to plot"):
        require_module("runlog_no_such_module", "needed to plot")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_elsewhere_a_missing_requirement_skips(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        require("", "no chromium")


def test_a_met_requirement_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    require("/usr/bin/chromium", "no chromium")
    assert require_module("json", "json").dumps([]) == "[]"


def test_groups_keep_shared_services_and_fault_modules_in_one_worker() -> None:
    assert xdist_group("tests/integration/cluster/test_redis_cluster.py::test_x[a]") == "redis-cluster"
    assert xdist_group("tests/integration/cluster/test_tls_cluster.py::test_y") == "redis-cluster"
    assert xdist_group("tests/faults/test_bad_input.py::test_zz_write_bad_input_section") == \
        "tests/faults/test_bad_input.py"
    assert xdist_group("tests/integration/resume/test_waits.py::test_z") is None
    assert all(p.startswith("tests/") for p in [*XDIST_GROUPS, *SERIAL])


def test_every_module_using_the_sasl_broker_shares_its_group() -> None:
    """The SASL/TLS broker is a session fixture: a module asking for it outside the group would make a
    second worker start a broker of its own (a JVM, tens of seconds of the parallel run's two cores)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    users = sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py")
                   if re.search(r"\bsecure_broker\b\s*[:,)]", p.read_text()))
    assert len(users) >= 3, users
    assert {u: xdist_group(u) for u in users} == dict.fromkeys(users, "sasl-broker")


def test_docs_testing_lists_every_serial_entry() -> None:
    """docs/testing.md's table of the serial tests names every entry of ``SERIAL`` (it had listed two
    of eight)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    table = page[page.index("### Serial: after the parallel run"):]
    missing = [p for p in SERIAL if f"| `{p}` |" not in table]
    assert not missing, missing
    lanes = [p for p, lane in SERIAL_LANES.items() if f"| `{p}` | {lane} |" not in table]
    assert not lanes, lanes


def test_every_serial_lane_entry_is_serial_and_the_lanes_hold_the_long_ones() -> None:
    """``SERIAL_LANES`` names serial tests only (a lane entry no ``SERIAL`` entry covers would never run
    in a lane), and what is left alone (lane 0) is the few tests that must not share the machine."""
    assert all(any(p.startswith(s) or s.startswith(p) for s in SERIAL) for p in SERIAL_LANES), SERIAL_LANES
    alone = [s for s in SERIAL if serial_lane(s) == 0]
    assert sorted(a.split("::")[0] for a in alone) == [
        "tests/integration/bench/test_raw_projector.py", "tests/integration/projections/test_redis_store.py",
        "tests/unit/bench/test_openloop_speed.py"], alone
    assert serial_lane("tests/faults/test_chaos.py::test_a_few_minutes") == 1
    assert serial_lane("tests/integration/fleet/test_acceptance.py::test_a_fleet") == 2
    assert serial_lane("tests/unit/anything.py::test_x") == 0
