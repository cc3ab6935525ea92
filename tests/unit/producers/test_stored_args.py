"""Arguments stored by reference (``Tool(args_by_ref=...)``, :mod:`runlog.producers.calls._stored_args`):
stored
once, content-addressed, given back exactly; the request hash is over the full arguments, so runs
recorded with the arguments stored whole replay unchanged and a change anywhere still diverges."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runlog.producers import CallInfo, Tool, Workflow, load_args, tool
from runlog.producers.calls import _stored_args
from runlog.producers.calls._artifacts import InMemoryArtifactStore
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.producers.calls._stored_args import STORED_ARGS, expand_args, stored_args
from runlog.schemas import ArtifactCorrupt, ArtifactMissing, ArtifactRef, Diverged, EventType, ReplayPolicy
from runlog.schemas.errors import WorkflowDefinitionError
from tests.unit.producers._replay import MemoryWorld

T = EventType
BIG = "system prompt " * 200  # 2,800 bytes: a blob of its own


def _expand(form: _stored_args.StoredArgs) -> dict[str, Any]:
    return expand_args(form.recorded, form.blobs.__getitem__)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(args=st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=5), data=st.data())
def test_stored_arguments_are_given_back_exactly(args: dict[str, Any], data: st.DataObject) -> None:
    by_ref = data.draw(st.lists(st.sampled_from(sorted(args)), unique=True) if args else st.just([]))
    saved = _stored_args.BIG_STRING
    _stored_args.BIG_STRING = 4  # most strings become blobs of their own
    try:
        form = stored_args(args, by_ref)
    finally:
        _stored_args.BIG_STRING = saved
    assert canonical_json(_expand(form)) == canonical_json(args)
    for sha, blob in form.blobs.items():
        assert sha256_hex(blob) == sha  # content-addressed


def _msg(i: int, text: str = "") -> dict[str, Any]:
    return {"kind": "request" if i % 2 == 0 else "response", "parts": [{"content": text or f"turn {i}"}]}


def test_a_growing_list_stores_only_its_new_items_and_a_long_string_once() -> None:
    first = [{**_msg(0), "instructions": BIG}, _msg(1)]
    a = stored_args({"model": "m", "messages": first}, ["messages"])
    b = stored_args({"model": "m", "messages": [*first, {**_msg(2), "instructions": BIG}]}, ["messages"])
    assert len(a.blobs) == 3  # the long string, then one node per message
    new = set(b.blobs) - set(a.blobs)
    assert len(new) == 1 and set(a.blobs) <= set(b.blobs)  # one more message, its string already there
    [node] = [json.loads(b.blobs[s]) for s in new]
    assert node["refs"] == [["instructions"]]
    assert node["value"]["instructions"] == sha256_hex(canonical_json(BIG))
    assert node["prev"] == json.loads(a.recorded)["refs"]["messages"]["chain"]  # the list before it
    recorded = json.loads(b.recorded)
    assert recorded == {"runlog.stored_args": 1, "args": {"model": "m"},
                        "refs": {"messages": {"chain": sha256_hex(b.blobs[next(iter(new))]), "length": 3}}}
    assert len(b.recorded) < 200  # a name and a length, whatever the conversation's size
    assert _expand(b)["messages"][2]["instructions"] == BIG


def test_known_nodes_are_not_built_again() -> None:
    first = [_msg(i, BIG if i == 0 else "") for i in range(5)]
    a = stored_args({"messages": first}, ["messages"])
    assert len(a.nodes) == 5
    b = stored_args({"messages": [*first, _msg(5)]}, ["messages"], known=a.nodes)
    whole = stored_args({"messages": [*first, _msg(5)]}, ["messages"])
    assert b.recorded == whole.recorded  # the same chain
    assert list(b.blobs) == list(b.nodes.values()) and len(b.nodes) == 1  # only the new item's node
    assert set(whole.blobs) == set(a.blobs) | set(b.blobs)


def test_an_empty_list_a_value_and_a_long_string_by_reference() -> None:
    args = {"messages": [], "parameters": {"tools": [{"name": "lookup", "doc": BIG}]}, "prompt": BIG}
    form = stored_args(args, ["messages", "parameters", "prompt"])
    assert json.loads(form.recorded)["refs"]["messages"] == {"chain": None, "length": 0}
    assert len(form.blobs) == 3  # BIG once, the parameters, the prompt
    assert _expand(form) == args


def test_a_chain_shorter_than_recorded_is_corrupt_and_a_missing_blob_missing() -> None:
    form = stored_args({"messages": [_msg(0), _msg(1)]}, ["messages"])
    recorded = json.loads(form.recorded)
    recorded["refs"]["messages"]["length"] = 3
    with pytest.raises(ArtifactCorrupt, match="a chain of 2 items, 3 recorded"):
        expand_args(recorded, form.blobs.__getitem__)
    store = InMemoryArtifactStore()
    ref = store.put(form.recorded, STORED_ARGS)
    with pytest.raises(ArtifactMissing):
        load_args(store, ref)
    for blob in form.blobs.values():
        store.put(blob)
    assert load_args(store, ref) == {"messages": [_msg(0), _msg(1)]}
    whole = store.put(canonical_json({"messages": []}))  # stored whole: read as it is
    assert load_args(store, whole) == {"messages": []}


def test_declarations() -> None:
    with pytest.raises(WorkflowDefinitionError, match="args_by_ref is for tools without effects"):
        Tool("send", lambda call, **_: None, ReplayPolicy.IDEMPOTENT, effect=True, target="t",
             delivery=lambda args, call: ("a", "b", "c", "d"), args_by_ref=("body",))
    with pytest.raises(WorkflowDefinitionError, match="tuple of argument names"):
        tool("t", args_by_ref="messages")
    with pytest.raises(WorkflowDefinitionError, match="tuple of argument names"):
        Tool("t", lambda call, **_: None, ReplayPolicy.SAFE, args_by_ref=(1,))  # type: ignore[arg-type]
    t = tool("chat", args_by_ref=["messages"])(lambda call, **_: None)
    assert t.args_by_ref == ("messages",)


# -- through a runner --------------------------------------------------------------------------------


def _chat_tool(by_ref: tuple[str, ...], asked: list[int]) -> Tool:
    def chat(call: CallInfo, model: str, messages: list[Any]) -> dict[str, Any]:
        asked.append(len(messages))
        return {"reply": f"answer {len(messages)}"}

    return Tool("chat", chat, ReplayPolicy.SAFE, args_by_ref=by_ref)


def _conversation(chat: Tool, turns: int, first: str = BIG) -> Workflow:
    wf = Workflow("talk", "1")

    @wf.stage("talk")
    def talk(ctx: Any, inputs: Any) -> dict[str, Any]:
        messages: list[Any] = [_msg(0, first)]
        for _ in range(turns):
            reply = ctx.call(chat, model="m", messages=list(messages))
            messages += [{"kind": "response", "parts": [reply]}, _msg(len(messages) + 1)]
        return {"turns": turns}

    return wf


@pytest.fixture
def world() -> Iterator[MemoryWorld]:
    w = MemoryWorld()
    yield w
    w.runner.close()


def test_each_item_is_stored_once_and_the_request_hash_is_over_the_whole_request(world: MemoryWorld) -> None:
    asked: list[int] = []
    res = world.runner.run(_conversation(_chat_tool(("messages",), asked), 6), {})
    assert res.completed and asked == [1, 3, 5, 7, 9, 11]
    called = [e for e in world.events(res.run_id) if e.type is T.TOOL_CALLED]
    for e in called:
        assert e.payload_ref is not None and e.payload_ref.media_type == STORED_ARGS
        full = load_args(world.store, e.payload_ref)
        assert e.request_hash == sha256_hex(canonical_json(full))  # as if stored whole
        assert full["messages"][0]["parts"][0]["content"] == BIG
    # 11 messages, each stored once (the run's parameters, 6 args artifacts, 6 results, 11 nodes, the
    # first message's long string, the stage output): nothing stored twice, nothing quadratic
    blobs = world.store._blobs
    assert len(blobs) == 1 + 6 + 6 + 11 + 1 + 1
    assert sum(len(b) for b in blobs.values()) < len(BIG) + 6_000


def test_a_run_recorded_with_its_arguments_stored_whole_replays_with_the_same_hashes(
        world: MemoryWorld) -> None:
    asked: list[int] = []
    old = _conversation(_chat_tool((), asked), 4)  # before the tool stored its arguments by reference
    first = world.runner.run(old, {})
    assert first.completed
    called = [e for e in world.events(first.run_id) if e.type is T.TOOL_CALLED]
    assert all(e.payload_ref is not None and e.payload_ref.media_type != STORED_ARGS for e in called)
    new = _conversation(_chat_tool(("messages",), asked), 4)
    res = world.again(first.run_id, new, {}, recorded_calls=world.recorded(first.run_id))
    assert res.completed and res.outputs == first.outputs
    assert asked == [1, 3, 5, 7]  # every recorded call read back, none diverged, none asked again


def test_a_change_in_the_first_item_of_a_long_list_still_diverges(world: MemoryWorld) -> None:
    asked: list[int] = []
    chat = _chat_tool(("messages",), asked)
    first = world.runner.run(_conversation(chat, 3), {})
    recorded = world.recorded(first.run_id)
    changed = _conversation(chat, 3, first=BIG + "!")
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, changed, {}, recorded_calls=recorded)
    assert info.value.call_id == "talk/chat/0"
    # with only call 1 recorded: call 0 is made anew, and call 1, whose new messages are the recorded
    # ones, diverges on its first message (the request hash is over the whole list)
    with pytest.raises(Diverged) as info:
        world.again(first.run_id, changed, {}, recorded_calls={"talk/chat/1": recorded["talk/chat/1"]})
    assert info.value.call_id == "talk/chat/1"
    assert asked == [1, 3, 5, 1]


def test_a_reused_call_reads_its_result_only(world: MemoryWorld) -> None:
    asked: list[int] = []
    wf = _conversation(_chat_tool(("messages",), asked), 5)
    first = world.runner.run(wf, {})
    results = {e.payload_ref for e in world.events(first.run_id) if e.type is T.TOOL_RESULT}
    read: list[ArtifactRef] = []
    get = world.store.get

    def counting(ref: ArtifactRef) -> bytes:
        read.append(ref)
        return get(ref)

    world.store.get = counting  # type: ignore[method-assign]
    res = world.again(first.run_id, wf, {}, recorded_calls=world.recorded(first.run_id))
    assert res.completed and asked == [1, 3, 5, 7, 9]
    assert len(read) == 5 and set(read) == results  # the recorded results, never the arguments


def test_a_tampered_message_of_a_stored_conversation_is_corrupt_not_loaded() -> None:
    """Issue 38, item 6: the message blobs are content-addressed; ``load_args`` reads each through the
    store's hash check, so a message changed in the store is :class:`ArtifactCorrupt`, never loaded."""
    messages = [_msg(0, "what is the capital of France?"), _msg(1, "Paris."), _msg(2, "and of Spain?")]
    form = stored_args({"model": "m", "messages": messages}, ["messages"])
    store = InMemoryArtifactStore()
    refs = {sha: store.put(blob, "application/json") for sha, blob in form.blobs.items()}
    recorded = store.put(form.recorded, STORED_ARGS)
    assert load_args(store, recorded) == {"model": "m", "messages": messages}
    answer = next(sha for sha, blob in form.blobs.items() if b"Paris." in blob)
    store.corrupt(refs[answer], form.blobs[answer].replace(b"Paris.", b"Lyon."))  # still valid JSON
    with pytest.raises(ArtifactCorrupt):
        load_args(store, recorded)
