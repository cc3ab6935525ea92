"""The step protocol is typed (runlog.producers.base._protocol): mypy checks what a step sends back,
the methods a step names and their arguments. Each wrong snippet must be rejected with its error and
the correct one accepted, so steps that turn ``Any`` again (or a protocol mypy cannot read) fail here."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[3]

PRELUDE = """
from runlog.producers.base._protocol import Steps, io


class Leases:
    def acquire(self, run_id: str, *, force: bool = False) -> int:
        return 1

    async def aacquire(self, run_id: str, *, force: bool = False) -> int:
        return 1

"""

CORRECT = """
def steps(leases: Leases) -> Steps[int]:
    epoch = yield from io(leases.acquire, leases.aacquire, "run-1", force=True)
    return epoch + 1
"""

WRONG = {
    "result_type": ("""
def steps(leases: Leases) -> Steps[str]:
    holder: str = yield from io(leases.acquire, leases.aacquire, "run-1")
    return holder
""", 'Incompatible types in assignment (expression has type "int", variable has type "str")'),
    "argument_type": ("""
def steps(leases: Leases) -> Steps[int]:
    return (yield from io(leases.acquire, leases.aacquire, 7))
""", 'Argument 3 to "io" has incompatible type "int"; expected "str"'),
    "renamed_method": ("""
def steps(leases: Leases) -> Steps[int]:
    return (yield from io(leases.acquire, leases.aacquire_lease, "run-1"))
""", '"Leases" has no attribute "aacquire_lease"'),
    "bare_yield": ("""
def steps(leases: Leases) -> Steps[int]:
    epoch: int = yield io(leases.acquire, leases.aacquire, "run-1")
    return epoch
""", 'Incompatible types in assignment (expression has type "object", variable has type "int")'),
    "nested_protocol": ("""
def inner(leases: Leases) -> Steps[int]:
    return (yield from io(leases.acquire, leases.aacquire, "run-1"))


def outer(leases: Leases) -> Steps[str]:
    name: str = yield from inner(leases)
    return name
""", 'Incompatible types in assignment (expression has type "int", variable has type "str")'),
}


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """mypy's report on every snippet (one run): snippet name -> its lines of the report."""
    root = tmp_path_factory.mktemp("snippets")
    bodies = {"correct": CORRECT, **{name: body for name, (body, _) in WRONG.items()}}
    for name, body in bodies.items():
        (root / f"{name}.py").write_text(PRELUDE + textwrap.dedent(body))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MYPYPATH", str(ROOT))  # this tree's runlog, not an installed one
        out, err, _ = api.run(["--strict", "--no-incremental", "--follow-imports=silent",
                               "--cache-dir", str(root / ".cache"), "--config-file", "",
                               *(str(root / f"{name}.py") for name in bodies)])
    assert not err, err
    return {name: "\n".join(line for line in out.splitlines() if f"{name}.py:" in line) for name in bodies}


def test_a_correct_protocol_type_checks(reported: dict[str, str]) -> None:
    assert reported["correct"] == ""


@pytest.mark.parametrize("case", list(WRONG))
def test_mypy_rejects_a_wrong_step(reported: dict[str, str], case: str) -> None:
    assert WRONG[case][1] in reported[case], reported[case]
