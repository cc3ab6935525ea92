"""Delivery keys, idempotency keys and canonical JSON."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runlog.producers.calls._keys import canonical_json, delivery_key, idempotency_key, lp_sha256, sha256_hex
from runlog.schemas.errors import WorkflowDefinitionError


def _manual_lp(*fields: str) -> str:
    buf = b"".join(struct.pack(">Q", len(f.encode())) + f.encode() for f in fields)
    return hashlib.sha256(buf).hexdigest()


def test_delivery_key_is_length_prefixed_sha256_of_the_four_fields() -> None:
    k = delivery_key("acct-1", "blog", "posts/hello-world", "3")
    assert k == _manual_lp("acct-1", "blog", "posts/hello-world", "3")
    assert len(k) == 64 and int(k, 16) >= 0


def test_delivery_key_fields_cannot_run_together() -> None:
    assert delivery_key("ab", "c", "x", "1") != delivery_key("a", "bc", "x", "1")
    assert delivery_key("a", "b", "c1", "2") != delivery_key("a", "b", "c", "12")


def test_delivery_key_scope_and_revision() -> None:
    base = delivery_key("acct", "blog", "post-1", "1")
    assert delivery_key("acct", "blog", "post-1", "1") == base
    assert delivery_key("acct", "blog", "post-1", "2") != base  # new revision, new key
    assert delivery_key("other", "blog", "post-1", "1") != base  # account is in the scope
    assert delivery_key("acct", "news", "post-1", "1") != base  # platform too


def test_delivery_key_refuses_empty_fields() -> None:
    with pytest.raises(WorkflowDefinitionError, match="revision"):
        delivery_key("a", "b", "c", "")


def test_utf8_length_counts_bytes() -> None:
    # "é" is 2 bytes: the prefix is the byte length, not the character count
    assert lp_sha256("é") == hashlib.sha256(struct.pack(">Q", 2) + "é".encode()).hexdigest()


def test_idempotency_key_is_deterministic_and_call_specific() -> None:
    h = sha256_hex(canonical_json({"q": "x"}))
    k = idempotency_key("run-1", "visual", "render", 0, h)
    assert k == idempotency_key("run-1", "visual", "render", 0, h)
    assert k == _manual_lp("run-1", "visual", "render", "0", h)
    others = {
        idempotency_key("run-2", "visual", "render", 0, h),
        idempotency_key("run-1", "draft", "render", 0, h),
        idempotency_key("run-1", "visual", "upload", 0, h),
        idempotency_key("run-1", "visual", "render", 1, h),
        idempotency_key("run-1", "visual", "render", 0, sha256_hex(canonical_json({"q": "y"}))),
    }
    assert k not in others and len(others) == 5


def test_canonical_json_sorts_keys_and_drops_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, 2, {"d": None, "c": True}]}) == \
        b'{"a":[1,2,{"c":true,"d":null}],"b":1}'


def test_canonical_json_keeps_unicode_as_utf8() -> None:
    assert canonical_json({"t": "封面"}) == '{"t":"封面"}'.encode()


def test_canonical_json_tuples_are_arrays() -> None:
    assert canonical_json({"x": (1, 2)}) == canonical_json({"x": [1, 2]})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1: "int key"}, {"s": {1, 2}}, b"bytes"])
def test_canonical_json_refuses_non_json(bad: object) -> None:
    with pytest.raises(WorkflowDefinitionError):
        canonical_json(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_canonical_json_ignores_insertion_order(d: dict[str, object]) -> None:
    reordered = dict(reversed(list(d.items())))
    assert canonical_json(d) == canonical_json(reordered)
