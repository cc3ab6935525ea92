"""A user's test of the tutorial's workflow with :mod:`runlog.testing`: crashed in the middle of its
effect, resumed, in-process, without Kafka or Redis (no socket may be opened), in under a second.

The workflow is ``greet.py`` as docs/getting-started.md gives it, so the tutorial and this test
cannot drift apart."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from runlog.schemas import EventType, Settings
from runlog.testing import CrashPointNotReached, InMemoryWorld
from tests.docs._examples import DOCS, blocks


class SocketOpened(AssertionError):
    pass


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka and Redis are nowhere, and any connection attempt fails the test."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9/0")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise SocketOpened(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def greet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The tutorial's ``greet.py``, imported in a working directory of its own (its outbox is there)."""
    [block] = [b for b in blocks(DOCS / "getting-started.md") if b.kind == "file" and b.arg == "greet.py"]
    path = tmp_path / "greet.py"
    path.write_text(block.code)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location(f"greet_{tmp_path.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(params=["clear", "encrypted"])
def world_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """The world's settings: payloads in clear, or sealed under a keyring of the test's own."""
    if request.param == "clear":
        return Settings(tracing=False)
    return Settings(tracing=False, encryption=True, keyring=str(tmp_path / "keyring"))


def test_the_tutorial_crashed_before_its_effect_result_resumes_sending_once(
        greet: ModuleType, offline: None, world_settings: Settings) -> None:
    t0, cpu0 = time.perf_counter(), time.process_time()
    world = InMemoryWorld(greet.app, settings=world_settings)
    result = world.crash_and_resume(greet.wf, {"to": "grace"}, at="before:EFFECT_RESULT")
    took, cpu = time.perf_counter() - t0, time.process_time() - cpu0

    assert result.crashed_at == "before:EFFECT_RESULT:deliver/send/0"
    assert result.events_at_crash[-1].type is EventType.EFFECT_INTENT  # sent, but the log never knew
    assert result.completed and result.outcome.result == "completed"
    assert result.executions["send"] == 1  # the resume asked the outbox and did not send again
    assert result.executions["compose"] == 1  # its recorded result was reused
    assert len(list(Path("outbox").iterdir())) == 1
    assert EventType.EFFECT_RECONCILED in result.types()
    # under a second of work (CPU time: the machine running the suite is shared and busy), and no wait
    # hidden in it (a lease's ttl, a poll) on the wall clock either
    assert cpu < 1.0 and took < 3.0, f"crash and resume took {cpu:.3f} s of CPU, {took:.3f} s"


def test_a_safe_tool_whose_result_was_not_recorded_runs_again(greet: ModuleType, offline: None,
                                                              world_settings: Settings) -> None:
    """The counts are what ran, not what the log says: compose ran, its result was lost in the crash."""
    world = InMemoryWorld(greet.app, settings=world_settings)
    result = world.crash_and_resume(greet.wf, {"to": "ada"}, at="before:TOOL_RESULT:write/compose/0")
    assert result.completed
    assert result.executions == {"compose": 2, "send": 1}
    assert result.executed_calls == ("write/compose/0", "write/compose/0", "deliver/send/0")


def test_a_crash_before_the_tool_is_entered_counts_one_execution(greet: ModuleType, offline: None) -> None:
    world = InMemoryWorld(greet.app)
    result = world.crash_and_resume(greet.wf, {"to": "ada"}, at="inside:TOOL:deliver/send/0")
    assert result.completed and result.executions["send"] == 1
    assert len(list(Path("outbox").iterdir())) == 1


def test_without_an_app_the_tools_are_given(greet: ModuleType, offline: None) -> None:
    world = InMemoryWorld()
    result = world.crash_and_resume(greet.wf, {"to": "ada"}, at="before:EFFECT_RESULT",
                                    tools=[greet.compose, greet.send])
    assert result.completed and result.executions["send"] == 1


def test_a_point_the_run_never_reaches_fails_the_test(greet: ModuleType, offline: None) -> None:
    world = InMemoryWorld(greet.app)
    with pytest.raises(CrashPointNotReached, match="before:RUN_FAILED"):
        world.crash(greet.wf, {"to": "ada"}, at="before:RUN_FAILED")
    (run_id,) = world.log.run_ids()
    assert world.events(run_id)[-1].type is EventType.RUN_COMPLETED  # it simply ran


def test_the_crashed_worker_loses_its_lease_and_the_resume_goes_on(greet: ModuleType, offline: None) -> None:
    world = InMemoryWorld(greet.app)
    run_id, point = world.crash(greet.wf, {"to": "ada"}, at="after:TOOL_CALLED:deliver/send/0")
    assert point == "after:TOOL_CALLED:deliver/send/0"
    assert world.events(run_id)[-1].type is EventType.TOOL_CALLED
    assert world.executions(run_id)["send"] == 0
    assert run_id not in world.leases.held  # expired: a resumer may take the run at once
    outcome = world.resume(run_id)
    assert outcome.result == "completed" and world.executions(run_id)["send"] == 1
    state = world.state(run_id)
    assert state is not None and state.epoch == 2
    stored = world.store.load_state(run_id)  # the projection a projector would have written
    assert stored is not None and stored.last_seq == state.last_seq


def test_a_dead_worker_appends_nothing_from_its_finally_blocks(offline: None) -> None:
    from runlog import StageContext, Workflow, tool

    @tool("note")
    def note(call: object, text: str) -> dict[str, str]:
        return {"text": text}

    wf = Workflow("tidy", version="1")

    @wf.stage("work")
    def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        try:
            return ctx.call(note, text="work")
        finally:  # runs as the simulated crash unwinds (a SIGKILL would not get here)
            ctx.call(note, text="cleanup")

    world = InMemoryWorld()
    run_id, _ = world.crash(wf, {}, at="before:TOOL_RESULT:work/note/0")
    assert world.events(run_id)[-1].type is EventType.TOOL_CALLED
    assert [e.call_id for e in world.events(run_id) if e.type is EventType.TOOL_CALLED] == ["work/note/0"]
    outcome = world.resume(run_id, tools=[note])
    assert outcome.result == "completed"


def test_a_plain_run_counts_its_tools(greet: ModuleType, offline: None) -> None:
    world = InMemoryWorld(greet.app)
    result = world.run(greet.wf, {"to": "ada"})
    assert result.completed and world.executions(result.run_id) == {"compose": 1, "send": 1}


def test_the_public_names_are_pinned() -> None:
    import runlog.testing

    assert sorted(runlog.testing.__all__) == [
        "CrashPointNotReached", "CrashResult", "InMemoryArtifactStore", "InMemoryEffectLedger",
        "InMemoryEventLog", "InMemoryLease", "InMemoryLeaseManager", "InMemoryLeaseTable", "InMemoryWorld",
        "LoggedEvent", "MemoryStore", "SimulatedCrash",
    ]
    for name in runlog.testing.__all__:
        assert getattr(runlog.testing, name).__doc__, name


def test_the_how_to_page_shows_the_tutorials_workflow_as_it_is() -> None:
    def greet_of(page: str) -> str:
        [block] = [b for b in blocks(DOCS / page) if b.kind == "file" and b.arg == "greet.py"]
        return block.code

    assert greet_of("how-to/unit-test-workflows.md") == greet_of("getting-started.md")


def test_with_encryption_on_no_payload_is_readable_in_the_events_and_all_of_them_open(
        greet: ModuleType, offline: None, tmp_path: Path) -> None:
    """The planted name is in the parameters, the composed text and the sent message: the events (what
    the topic would hold, every inline ref included) never show it, while the run reads them all back."""
    from runlog.producers.internal import SealedArtifactStore

    settings = Settings(tracing=False, encryption=True, keyring=str(tmp_path / "keyring"))
    world = InMemoryWorld(greet.app, settings=settings)
    planted = "zebulon-q7x2"
    result = world.crash_and_resume(greet.wf, {"to": planted}, at="before:EFFECT_RESULT")
    assert result.completed and result.executions["send"] == 1
    (run_id,) = world.log.run_ids()
    dumped = "\n".join(repr(e) for e in world.events(run_id))
    assert planted not in dumped
    state = world.state(run_id)
    assert state is not None and state.params_ref is not None
    assert isinstance(world.artifacts, SealedArtifactStore)
    assert planted.encode() not in world.artifacts.base.get(state.params_ref)  # the envelope
    assert planted in world.artifacts.get(state.params_ref).decode()  # opened with the keyring
    outputs = [world.artifacts.get(ref).decode() for ref in state.stage_outputs.values()]
    assert any(planted in o for o in outputs)
    keyring = tmp_path / "keyring"
    assert keyring.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in keyring.rglob("*") if p.is_file())


def test_a_stage_that_raises_a_plain_error_on_resume_fails_the_run_not_the_resumer() -> None:
    """A bug in a stage (a KeyError here) is the run's failure, recorded as FAILED: the resume's
    outcome says so, and nothing escapes to end the resumer member that was serving it."""
    from runlog.producers import Workflow
    from runlog.testing import InMemoryWorld

    wf = Workflow("buggy", "1")

    @wf.stage("first")
    def first(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    @wf.stage("second")
    def second(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"x": ctx.output_of("first")["missing"]}  # KeyError

    world = InMemoryWorld()
    res = world.crash_and_resume(wf, {}, at="before:STAGE_STARTED:second")
    assert res.outcome.result == "failed" and "KeyError" in res.outcome.detail
    assert res.types()[-1] is EventType.FAILED
