"""The one record mapping (``runlog.schemas._plain``): its styles on small records, and the two styles
Runlog uses pinned on its own records (the Avro dicts, the projection's JSON text)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import pytest

from runlog.projections._budget import BudgetCaps
from runlog.projections._state import (
    CallRecord,
    CallStatus,
    CheckpointEntry,
    EffectEntry,
    RejectedEvent,
    RunState,
    RunStatus,
    WaitInfo,
    state_from_json,
    state_to_json,
)
from runlog.projections._usage import UsageTotals
from runlog.schemas import (
    ArtifactRef,
    Checkpoint,
    Effect,
    EffectStatus,
    ErrorInfo,
    ReplayPolicy,
    RuleResult,
    StageSpec,
    WorkflowSpec,
)
from runlog.schemas._mapping import KINDS
from runlog.schemas._plain import PlainMapping


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0


@dataclass(frozen=True, slots=True)
class Item:
    name: str
    colour: Colour
    at: Point | None = None


@dataclass(frozen=True, slots=True)
class Box:
    label: str
    items: Mapping[str, Item] = field(default_factory=dict)
    points: tuple[Point, ...] = ()
    pairs: tuple[tuple[int, str], ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    colour: Colour | None = None
    added: int = 7


BOX = Box(
    "b",
    items={"k2": Item("k2", Colour.BLUE), "k1": Item("k1", Colour.RED, Point(1, 2))},
    points=(Point(3, 4), Point(5)),
    pairs=((1, "a"), (2, "b")),
    tags={"t": "v"},
    colour=Colour.RED,
    added=9,
)


def test_dict_style_writes_every_field_and_reads_it_back() -> None:
    m = PlainMapping()
    plain = m.to_plain(Box)(BOX)
    assert plain == {
        "label": "b",
        "items": {"k2": {"name": "k2", "colour": "blue", "at": None},
                  "k1": {"name": "k1", "colour": "red", "at": {"x": 1, "y": 2}}},
        "points": [{"x": 3, "y": 4}, {"x": 5, "y": 0}],
        "pairs": [[1, "a"], [2, "b"]],
        "tags": {"t": "v"},
        "colour": "red",
        "added": 9,
    }
    back = m.from_plain(Box)(json.loads(json.dumps(plain)))
    assert back == BOX and isinstance(back.points, tuple) and isinstance(back.pairs[0], tuple)


def test_positional_and_keyed_styles() -> None:
    m = PlainMapping(positional=(Point,), keyed={(Box, "items"): "name"})
    plain = m.to_plain(Box)(BOX)
    assert plain["points"] == [[3, 4], [5, 0]]
    assert plain["items"] == [  # sorted by key, each value an object
        {"name": "k1", "colour": "red", "at": [1, 2]},
        {"name": "k2", "colour": "blue", "at": None},
    ]
    assert m.from_plain(Box)(plain) == BOX


def test_absent_fields_take_their_defaults_unless_complete() -> None:
    m = PlainMapping(positional=(Point,))
    assert m.from_plain(Box)({"label": "old", "v": 1}) == Box("old")  # unknown keys are ignored
    assert m.from_plain(Point)([4]) == Point(4, 0)  # a trailing item added later
    assert PlainMapping().from_plain(Point)({"x": 4}) == Point(4)
    with pytest.raises(KeyError):
        PlainMapping(complete=True).from_plain(Point)({"x": 4})
    with pytest.raises(KeyError):
        m.from_plain(Box)({"items": {}})  # a field without a default is required


def test_omit_and_extra_keys() -> None:
    m = PlainMapping()
    assert m.to_plain(Point, omit=("y",), extra={"v": 2})(Point(1, 2)) == {"v": 2, "x": 1}
    with pytest.raises(TypeError, match="no field"):
        m.to_plain(Point, omit=("z",))


def test_unknown_types_are_refused() -> None:
    @dataclass(frozen=True)
    class Odd:
        when: set[int]

    with pytest.raises(TypeError, match="no plain mapping"):
        PlainMapping().to_plain(Odd)


def test_the_avro_style_is_fastavros_dict() -> None:
    e = Effect("dk", "run-1", "cms", EffectStatus.DONE, 4, 10, external_id="x", tool="publish", stage="s")
    plain = KINDS[Effect].to_dict(e)
    assert plain == {"delivery_key": "dk", "run_id": "run-1", "target": "cms", "status": "DONE",
                     "seq": 4, "updated_at": 10, "external_id": "x", "tool": "publish", "stage": "s"}
    assert KINDS[Effect].from_dict(plain) == e


def test_an_effect_entry_is_an_effect_with_its_call() -> None:
    entry = EffectEntry("dk", "run-1", "cms", EffectStatus.INTENT, 4, 10, tool="publish", call_id="c1",
                        replay_policy=ReplayPolicy.IDEMPOTENT, opened_at=9)
    assert isinstance(entry, Effect)
    assert entry.to_effect() == Effect("dk", "run-1", "cms", EffectStatus.INTENT, 4, 10, tool="publish")
    assert type(entry.to_effect()) is Effect


ART = ArtifactRef("file:///a", "ab" * 32, 12, "application/json")

# The projection's JSON text of a state with every field set, pinned: states already in Redis are
# read back with this layout, so a change to it must be deliberate (and versioned).
RICH = RunState(
    run_id="run-1",
    status=RunStatus.WAITING,
    stage="draft",
    next_stage="publish",
    last_seq=9,
    epoch=2,
    partition=3,
    offset=40,
    workflow=WorkflowSpec("wf", "1", (StageSpec("draft", ("brief",), ("r1",)), StageSpec("publish"))),
    input_versions={"brief": "v2"},
    parent_run_id="run-0",
    forked_from_seq=5,
    started_at=100,
    params_ref=ART,
    updated_at=120,
    verified_artifacts=(ART,),
    stage_outputs={"draft": ART},
    stage_fingerprints={"draft": "0123456789abcdef", "publish": "fedcba9876543210"},
    traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    tracestate="congo=t61rcWkgMzE",
    completed_stages=("draft",),
    calls={"c1": CallRecord("c1", "publish", ReplayPolicy.IDEMPOTENT, CallStatus.RESULT,
                            "draft", 6, args=ART, result=ART, idempotency_key="ik", delivery_key="dk",
                            request_hash="rh")},
    open_effects={"dk2": EffectEntry("dk2", "run-1", "cms", EffectStatus.INTENT, 8, 110, call_id="c2",
                                     opened_at=108)},
    closed_effects={"dk": EffectEntry("dk", "run-1", "cms", EffectStatus.DONE, 7, 105, external_id="x")},
    checkpoint=Checkpoint("cp1", "run-1", 7, 3, 30, "draft", 106, {"brief": "v2"}, (ART,),
                          (RuleResult("r1", True, "ok"),), "publish", "1"),
    checkpoints=(CheckpointEntry("cp1", "draft", 7, 3, 30, "h7"),),
    last_error=ErrorInfo("Timeout", "slow", True),
    rejected={"gap": 1},
    recent_rejected=(RejectedEvent(12, 2, "TOOL_CALLED", "gap", 41),),
    recent=((9, "d9"),),
    last_hash="h9",
    waiting=WaitInfo("draft/runlog.wait/0", "approve", 500),
    usage=UsageTotals(2, 30, 4, 10, 0, 70, 1),
    stage_usage={"draft": UsageTotals(2, 30, 4, 10, 0, 70, 1)},
    model_usage={"a:m": UsageTotals(1, 20, 3, 10, 0, 70, 0), "b:n": UsageTotals(1, 10, 1, 0, 0, None, 1)},
    inherited_usage=UsageTotals(1, 5, 1, 0, 0, 9, 0),
    usage_budget=BudgetCaps(1000, 5_000_000, 800, None, "wait"),
    labels={"queue": "default", "tenant": "acme"},
    children=("run-c",),
    children_usage={"run-c": UsageTotals(2, 40, 6, 0, 0, 90, 0)},
)

A = '["file:///a","' + "ab" * 32 + '",12,"application/json"]'
RICH_JSON = (
    '{"calls":[{"args":' + A + ',"call_id":"c1","delivery_key":"dk","idempotency_key":"ik",'
    '"policy":"IDEMPOTENT","request_hash":"rh","result":' + A + ',"seq":6,"stage":"draft",'
    '"status":"result","tool":"publish"}],'
    '"checkpoint":{"artifacts":[' + A + '],"checkpoint_id":"cp1","created_at":106,"inputs":{"brief":"v2"},'
    '"last_seq":7,"next_stage":"publish","offset":30,"partition":3,"run_id":"run-1","stage":"draft",'
    '"verified_by":[["r1",true,"ok"]],"workflow_version":"1"},'
    '"checkpoints":[["cp1","draft",7,3,30,"h7"]],"children":["run-c"],'
    '"children_usage":{"run-c":[2,40,6,0,0,90,0]},'
    '"closed_effects":[{"call_id":null,"delivery_key":"dk","external_id":"x","opened_at":null,'
    '"replay_policy":null,"request_hash":null,"run_id":"run-1","seq":7,"stage":null,"status":"DONE",'
    '"target":"cms","tool":null,"updated_at":105}],'
    '"completed_stages":["draft"],"epoch":2,"forked_from_seq":5,"inherited_usage":[1,5,1,0,0,9,0],'
    '"input_versions":{"brief":"v2"},"labels":{"queue":"default","tenant":"acme"},'
    '"last_error":["Timeout","slow",true],"last_hash":"h9","last_seq":9,'
    '"model_usage":{"a:m":[1,20,3,10,0,70,0],"b:n":[1,10,1,0,0,null,1]},"next_stage":"publish","offset":40,'
    '"open_effects":[{"call_id":"c2","delivery_key":"dk2","external_id":null,"opened_at":108,'
    '"replay_policy":null,"request_hash":null,"run_id":"run-1","seq":8,"stage":null,"status":"INTENT",'
    '"target":"cms","tool":null,"updated_at":110}],'
    '"params_ref":' + A + ',"parent_call":null,"parent_run_id":"run-0","partition":3,"recent":[[9,"d9"]],'
    '"recent_rejected":[[12,2,"TOOL_CALLED","gap",41]],"rejected":{"gap":1},"run_id":"run-1","stage":"draft",'
    '"stage_fingerprints":{"draft":"0123456789abcdef","publish":"fedcba9876543210"},'
    '"stage_outputs":{"draft":' + A + '},"stage_usage":{"draft":[2,30,4,10,0,70,1]},"started_at":100,'
    '"status":"WAITING","subject":null,'
    '"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"congo=t61rcWkgMzE",'
    '"updated_at":120,"usage":[2,30,4,10,0,70,1],"usage_budget":[1000,5000000,800,null,"wait"],"v":1,'
    '"verified_artifacts":[' + A + '],"waiting":["draft/runlog.wait/0","approve",500,[],0],'
    '"workflow":{"name":"wf","stages":[["draft",["brief"],["r1"],true],["publish",[],[],true]],"version":"1"}}'
)


def test_the_state_json_layout_is_pinned() -> None:
    assert state_to_json(RICH) == RICH_JSON
    assert state_from_json(RICH_JSON) == RICH


def test_a_state_written_before_later_fields_reads_with_their_defaults() -> None:
    old = json.loads(RICH_JSON)
    for later in ("params_ref", "last_hash", "waiting", "labels", "subject", "children", "parent_call",
                  "children_usage"):
        del old[later]
    old["checkpoints"] = [c[:5] for c in old["checkpoints"]]  # before the anchor's hash
    del old["open_effects"][0]["opened_at"]
    s = state_from_json(json.dumps(old))
    assert (s.params_ref, s.last_hash, s.waiting, s.labels) == (None, None, None, {})
    assert (s.children, s.parent_call, s.children_usage) == ((), None, {})
    assert s.checkpoints[0].last_hash is None and s.open_effects["dk2"].opened_at is None
