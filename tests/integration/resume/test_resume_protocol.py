"""The resume protocol against the real broker, Redis, artifact store and the demo world's services."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.branch import branch_run
from runlog.processors.operate import OperatorRefused, retry_run
from runlog.processors.resume import App, ResumeOutcome, Resumer
from runlog.producers import LocalArtifactStore, Workflow
from runlog.projections import RunStatus
from runlog.schemas import Checkpoint, EventType, RunlogError, Settings
from tests.integration.resume.conftest import (
    DemoWorld,
    accepted,
    crash_run,
    log_of,
    types_of,
)

pytestmark = pytest.mark.integration


def _checkpoints(settings: Settings, run_id: str) -> dict[str, Checkpoint]:
    return {le.outcome.checkpoint.stage: le.outcome.checkpoint for le in log_of(settings, run_id)
            if le.outcome.checkpoint is not None}


def test_crash_between_publish_and_its_result_reconciles_instead_of_publishing_again(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id = crash_run(topics, world, "before:EFFECT_RESULT:publish/publish/0", tmp_path)
    assert world.stats()["publishes"] == 1  # the platform has the article, the log only the intent

    with Resumer(topics, world.app()) as r:
        out = r.resume(run_id)

    assert out.result == "completed", out.detail
    assert [(e.call_id, e.action) for e in out.plan.effects] == [("publish/publish/0", "reconciled")]
    history = log_of(topics, run_id)
    done = accepted(history)
    reconciled = [le.event for le in done if le.event.type is EventType.EFFECT_RECONCILED]
    assert len(reconciled) == 1
    rec = reconciled[0]
    assert rec.call_id == "publish/publish/0" and rec.epoch == 2 and rec.external_id
    # asked, not called: no second EFFECT_INTENT / EFFECT_RESULT for the publish, one article
    assert not [le for le in done if le.event.epoch == 2
                and le.event.type in (EventType.EFFECT_INTENT, EventType.EFFECT_RESULT)]
    stats = world.stats()
    assert stats["publishes"] == 1
    assert stats["renders_billed"] == 3 and stats["research_calls"] == 1
    articles = world.client.get("/articles", delivery_key=rec.delivery_key or "")
    assert [a["article_id"] for a in articles] == [rec.external_id]
    state = history[-1].state
    assert state.status is RunStatus.COMPLETED
    published = LocalArtifactStore(topics.artifact_root).get(state.stage_outputs["publish"])
    assert rec.external_id.encode() in published


def test_never_tool_interrupted_after_its_intent_blocks_the_run(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    # Killed after the intent was acknowledged, before the charge was made: only a person (or the
    # payment provider) can tell. (Killed after the charge returned, the effects ledger already
    # holds its external id and resume reuses it: see test_edges.)
    run_id = crash_run(topics, world, "inside:TOOL:pay/charge/0", tmp_path, workflow="checkout")
    assert world.stats()["charges"] == 0

    with Resumer(topics, world.app()) as r:
        out = r.resume(run_id)
        again = r.resume(run_id)  # a second attempt (say, the sweeper's) leaves the blocked run alone

    assert out.result == "blocked"
    assert again.result == "blocked" and again.epoch == out.epoch  # no lease taken, nothing appended
    assert [(e.call_id, e.action) for e in out.plan.effects] == [("pay/charge/0", "block")]
    assert out.plan.blocked_reason and "charge" in out.plan.blocked_reason
    history = log_of(topics, run_id)
    blocked = [le.event for le in accepted(history) if le.event.type is EventType.RUN_BLOCKED]
    assert len(blocked) == 1
    assert blocked[0].error is not None and "charge" in blocked[0].error.message
    assert "person" in blocked[0].error.message
    assert history[-1].state.status is RunStatus.BLOCKED
    assert world.stats()["charges"] == 0  # nothing charged on a guess
    # nothing but the lease and the block after the crash
    assert {le.event.type for le in accepted(history) if le.event.epoch > 1} == {
        EventType.LEASE_ACQUIRED, EventType.RUN_BLOCKED}
    # a retry is no way around an in-doubt effect: a person resolves it
    with pytest.raises(OperatorRefused, match="runlog resolve"):
        retry_run(topics, world.app(), run_id, by="alice")
    assert len(log_of(topics, run_id)) == len(history)


def test_bad_artifacts_fall_back_to_an_earlier_checkpoint_or_block(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    topics = topics.with_(artifact_inline_bytes=0)  # every payload a file, which this test damages
    run_id = crash_run(topics, world, "inside:STAGE:prefill", tmp_path)
    cps = _checkpoints(topics, run_id)
    assert list(cps) == ["research", "verify", "draft", "visual"]
    store = LocalArtifactStore(topics.artifact_root)
    earlier = {a.sha256 for a in cps["draft"].artifacts}
    image = next(a for a in cps["visual"].artifacts if a.media_type == "image/png")
    assert image.sha256 not in earlier
    research_out = next(a for a in cps["research"].artifacts if a.sha256 not in
                        {x.sha256 for x in cps["visual"].artifacts if x.media_type == "image/png"})
    research_bytes = store.get(research_out)
    visual_output = next(le.event.payload_ref for le in log_of(topics, run_id)
                         if le.event.type is EventType.VERIFIED and le.event.stage == "visual")
    assert visual_output is not None
    store.path_for(image.sha256).write_bytes(b"tampered")      # the latest checkpoint is bad
    store.path_for(research_out.sha256).unlink()                # ... and so is every earlier one

    with Resumer(topics, world.app()) as r:
        blocked = r.resume(run_id)
        assert blocked.result == "blocked"
        assert [c for c, _ in blocked.plan.checkpoints_rejected] == [
            cps[s].checkpoint_id for s in ("visual", "draft", "verify", "research")]
        reasons = [why for _, why in blocked.plan.checkpoints_rejected]
        assert "ArtifactCorrupt" in reasons[0]  # the tampered image, only in the visual checkpoint
        assert all("ArtifactMissing" in why and research_out.sha256 in why for why in reasons)
        assert not any("ArtifactCorrupt" in why for why in reasons[1:])
        assert blocked.plan.blocked_reason and "no checkpoint has intact artifacts" in \
            blocked.plan.blocked_reason
        assert types_of(log_of(topics, run_id))[-2:] == [EventType.LEASE_ACQUIRED, EventType.RUN_BLOCKED]
        assert world.stats()["renders_billed"] == 3

        store.put(research_bytes)  # a person restores the research output; the image stays bad
        n = len(log_of(topics, run_id))
        assert r.resume(run_id).result == "blocked" and len(log_of(topics, run_id)) == n  # left alone
        out = r.resume(run_id, retry=True)  # the person retries it (runlog retry)

    assert out.result == "completed", out.detail
    assert out.plan.checkpoint is not None
    assert out.plan.checkpoint.checkpoint_id == cps["draft"].checkpoint_id
    assert [c for c, _ in out.plan.checkpoints_rejected] == [cps["visual"].checkpoint_id]
    assert "ArtifactCorrupt" in out.plan.checkpoints_rejected[0][1]
    assert out.plan.from_stage == "visual"
    history = log_of(topics, run_id)
    visual_runs = [le.event.epoch for le in accepted(history)
                   if le.event.type is EventType.VERIFIED and le.event.stage == "visual"]
    assert visual_runs == [1, 3]  # visual was verified again, by the third writer
    final = history[-1].state
    assert final.status is RunStatus.COMPLETED
    for ref in final.verified_artifacts:  # it did not continue on bad data
        store.verify(ref)
    store.verify(image)  # the tampered image was stored again, from the recorded render result
    # the same images and assets as before the crash, and no render billed twice: the renders
    # completed after the draft checkpoint are recorded facts, reused although visual is redone
    assert final.stage_outputs["visual"].sha256 == visual_output.sha256
    assert {"visual/render/0", "visual/render/2", "visual/render/4"} <= set(out.plan.reused_calls)
    stats = world.stats()
    assert stats["renders_billed"] == 3
    assert stats["assets"] == 3
    assert stats["publishes"] == 1


def _other_definition() -> App:
    wf = Workflow("content", version="1")

    @wf.stage("research")
    def research(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"sources": []}

    from runlog.processors.demo.pipeline import source
    return App.of([wf], [], source())


def test_changed_workflow_is_refused_and_a_branch_reruns_only_what_depends_on_the_new_input(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id = crash_run(topics, world, "inside:STAGE:draft", tmp_path)

    with Resumer(topics, _other_definition()) as r:
        planned = r.resume(run_id, dry_run=True)
    assert planned.result == "planned"
    assert planned.plan.blocked_reason and "different definition" in planned.plan.blocked_reason

    before = log_of(topics, run_id)
    with Resumer(topics, world.app(version="2")) as r:  # another version: not this App's run to touch
        waits = r.resume(run_id)
    assert (waits.result, waits.waiting_for) == ("not_served", "content@1")
    assert len(log_of(topics, run_id)) == len(before)  # nothing appended, no lease taken

    with Resumer(topics, _other_definition()) as r:  # the same version, another definition: refused
        refused = r.resume(run_id)
    assert refused.result == "blocked"
    assert "strict resume refused" in refused.detail and "different definition" in refused.detail
    history = log_of(topics, run_id)
    assert types_of(history)[-2:] == [EventType.LEASE_ACQUIRED, EventType.RUN_BLOCKED]
    assert not [le for le in accepted(history) if le.event.epoch > 1
                and le.event.type is EventType.STAGE_STARTED]

    with Resumer(topics, world.app()) as r:  # the registered version again: a person retries the run
        assert r.resume(run_id).result == "blocked"  # a plain resume leaves a blocked run alone
        assert r.resume(run_id, retry=True).result == "completed"
    parent = log_of(topics, run_id)
    research_calls = world.stats()["research_calls"]
    assert research_calls == 1

    res = branch_run(topics, world.app(), run_id, {"facts": "v4"})

    assert res.completed
    assert res.first_affected_stage == "verify"
    assert res.inherited_stages == ("research",)
    assert res.rerun_stages == ("verify", "draft", "visual", "prefill", "publish")
    research_cp = next(le.outcome.checkpoint for le in parent if le.outcome.checkpoint is not None)
    assert research_cp.stage == "research"
    assert res.forked_from_seq == research_cp.last_seq
    child = log_of(topics, res.run_id)
    first = child[0].event
    assert first.type is EventType.RUN_STARTED
    assert first.parent_run_id == run_id and first.forked_from_seq == research_cp.last_seq
    assert dict(first.input_versions)["facts"] == "v4"
    done = accepted(child)
    started = [le.event.stage for le in done if le.event.type is EventType.STAGE_STARTED]
    assert started == ["verify", "draft", "visual", "prefill", "publish"]
    inherited = [le.event for le in done
                 if le.event.type is EventType.VERIFIED and le.event.stage == "research"]
    assert len(inherited) == 1 and inherited[0].attributes.get("inherited_from") == run_id
    assert child[-1].state.status is RunStatus.COMPLETED
    store = LocalArtifactStore(topics.artifact_root)
    assert b"c4" in store.get(child[-1].state.stage_outputs["verify"])
    assert world.stats()["research_calls"] == research_calls  # research inherited, not re-run
    # the parent's log is untouched
    assert [(le.offset, le.event.seq) for le in log_of(topics, run_id)] == \
        [(le.offset, le.event.seq) for le in parent]


def test_two_resumers_racing_for_one_run_exactly_one_continues(
        topics: Settings, world: DemoWorld, tmp_path: Path) -> None:
    run_id = crash_run(topics, world, "inside:STAGE:draft", tmp_path)
    before = world.stats()
    resumers = [Resumer(topics, world.app()), Resumer(topics, world.app())]
    barrier = threading.Barrier(2)
    outcomes: list[ResumeOutcome] = []
    errors: list[BaseException] = []
    # Both resumers plan first and then race for the lease at the same moment; without this a
    # fast first resumer can finish the run before the second one even looks at it.
    for r in resumers:
        take_over = r.runner.take_over

        def synced(*args: Any, _take_over: Any = take_over, **kwargs: Any) -> Any:
            barrier.wait(30)
            return _take_over(*args, **kwargs)

        r.runner.take_over = synced  # type: ignore[method-assign]

    def go(r: Resumer) -> None:
        try:
            outcomes.append(r.resume(run_id))
        except (RunlogError, threading.BrokenBarrierError) as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=go, args=(r,)) for r in resumers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for r in resumers:
            r.close()

    assert not errors, errors
    assert sorted(o.result for o in outcomes) == ["completed", "contended"], [
        (o.result, o.detail) for o in outcomes]
    history = log_of(topics, run_id)
    leases = [le.event.epoch for le in accepted(history) if le.event.type is EventType.LEASE_ACQUIRED]
    assert len(leases) == 1
    assert history[-1].state.status is RunStatus.COMPLETED
    after = world.stats()
    assert after["publishes"] == 1
    assert after["renders_billed"] == 3
    assert after["research_calls"] == before["research_calls"] == 1
    assert after["assets"] == 3

