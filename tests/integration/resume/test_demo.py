"""The seed's story end to end: the demo crashed while uploading the cover resumes through the resumer."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlog.processors.demo.run import DEFAULT_CRASH_AT, run_demo
from runlog.schemas import EventType, Settings
from tests.integration.resume.conftest import accepted, log_of

pytestmark = pytest.mark.integration

STAGES = {"research", "verify", "draft", "visual", "prefill", "publish"}


@pytest.mark.parametrize("sdk", ["sync", "async"])
def test_demo_crashed_at_the_cover_upload_finishes_like_an_uncrashed_run(topics: Settings,
                                                                         tmp_path: Path, sdk: str) -> None:
    r = run_demo(topics, quiet=True, workdir=tmp_path / "demo", sdk=sdk)
    assert r["sdk"] == sdk
    # its work files are the owner's only (issue 38): every file 0600, every directory 0700
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777
             for p in [tmp_path / "demo", *(tmp_path / "demo").rglob("*")]}
    assert any(k.endswith(".db") for k in modes) and any(k.endswith(".log") for k in modes), modes
    assert {k: m for k, m in modes.items() if m != (0o700 if (tmp_path / k).is_dir() else 0o600)} == {}

    assert r["crashed_at"] == DEFAULT_CRASH_AT == "before:EFFECT_RESULT:visual/upload/5"
    assert r["resume"] == "completed"
    assert r["completed"] is True
    ref = r["reference"]
    # what the outside world saw: one article, each image billed once, research run once
    assert r["publishes"] == ref["publishes"] == 1
    assert r["renders_billed"] == ref["renders_billed"] == 3
    assert r["research_calls"] == ref["research_calls"] == 1
    assert r["assets"] == ref["assets"] == 3
    # the cover upload was repeated with the same idempotency key: one more request, no new asset
    assert r["uploads"] == ref["uploads"] + 1

    # the final artifacts, read from the log (not from the receipt), hash like the uncrashed run's
    crashed, reference = log_of(topics, r["run_id"]), log_of(topics, ref["run_id"])
    outputs = {s: a.sha256 for s, a in crashed[-1].state.stage_outputs.items()}
    assert set(outputs) == STAGES
    assert outputs == {s: a.sha256 for s, a in reference[-1].state.stage_outputs.items()}
    assert outputs == r["final_artifacts"] == ref["final_artifacts"]

    # the resume: from the draft checkpoint, reusing the recorded renders and the two body uploads
    done = accepted(crashed)
    assert done[-1].event.type is EventType.RUN_COMPLETED
    assert r["epochs"] == [1, 2]
    draft_cp = next(le.outcome.checkpoint for le in done
                    if le.outcome.checkpoint is not None and le.outcome.checkpoint.stage == "draft")
    assert r["checkpoint_resumed_from"] == draft_cp.checkpoint_id
    assert {"visual/render/0", "visual/render/2", "visual/render/4",
            "visual/upload/1", "visual/upload/3"} <= set(r["reused_calls"])
    assert r["effects_on_resume"] == ["rerun_same_key"]
    after = [le.event for le in done if le.event.epoch == 2]
    assert after[0].type is EventType.LEASE_ACQUIRED
    assert not any(e.type is EventType.TOOL_CALLED and e.tool in ("render", "search") for e in after)
    assert next(e.call_id for e in after if e.type is EventType.EFFECT_RESULT) == "visual/upload/5"
    # research ran before the crash and never again
    assert [le.event.epoch for le in done
            if le.event.type is EventType.STAGE_STARTED and le.event.stage == "research"] == [1]
    # the demo's one-off resumer group is gone from the broker (issue 29: one was left per demo)
    from confluent_kafka.admin import AdminClient

    # a broker busy with the rest of the suite has answered this after more than 30 s
    groups = AdminClient(topics.admin_config()).list_consumer_groups(request_timeout=60).result(120)
    left = [g.group_id for g in groups.valid
            if g.group_id.startswith(topics.topic_prefix) and "runlog-demo-resumer-" in g.group_id]
    assert left == [], left
