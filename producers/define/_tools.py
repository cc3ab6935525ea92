"""Tools with replay policies, their retry policy, and the information each call receives.

Pure: declaring a tool validates it (``RECONCILE_FIRST`` needs a reconcile
function, effect tools need a target and a delivery-key function) and raises
:class:`~runlog.schemas.errors.WorkflowDefinitionError` at definition time.

A tool function is ``fn(call: CallInfo, **args) -> result``; ``args`` and the
result are JSON data. An effect tool returns the external record, a JSON object
with a string ``"external_id"``. It raises
:class:`~runlog.schemas.errors.RetryableToolError` for transient failures and anything
else (preferably :class:`~runlog.schemas.errors.TerminalToolError`) for terminal ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runlog.producers.base._protocol import Sleep, Steps
from runlog.producers.define._limits import EstimateFn, RateLimit
from runlog.schemas import ReplayPolicy, Usage
from runlog.schemas.errors import RetryableToolError, WorkflowDefinitionError

__all__ = [
    "CallInfo",
    "DeliveryFn",
    "ReconcileFn",
    "RetryPolicy",
    "Tool",
    "ToolFn",
    "UsageFn",
    "retry_steps",
    "tool",
]


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What one tool call is told about itself; ``epoch`` is the fencing token an
    external system can check (reject calls with an epoch lower than one it saw)."""

    run_id: str
    stage: str
    tool: str
    call_id: str
    index: int
    epoch: int
    request_hash: str
    idempotency_key: str | None = None
    """Set for IDEMPOTENT tools: stable across retries and resumes of this call."""
    delivery_key: str | None = None
    """Set for effect tools (after the delivery function ran)."""
    attempt: int = 1


ToolFn = Callable[..., Any]
DeliveryFn = Callable[[Mapping[str, Any], CallInfo], tuple[str, str, str, str]]
"""``(args, call) -> (account, platform, canonical object id, revision)``."""
ReconcileFn = Callable[[str, Mapping[str, Any]], Mapping[str, Any] | None]
"""``(delivery_key, request_args) -> existing external record (with "external_id") or None``."""
UsageFn = Callable[[Any], Usage | None]
"""``(result) -> Usage or None``: what a call spent, read from its (JSON) result."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``attempts`` calls at most; before attempt n+1 sleep
    ``min(backoff * multiplier**(n-1), max_backoff)`` seconds."""

    attempts: int = 1
    backoff: float = 0.0
    multiplier: float = 2.0
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise WorkflowDefinitionError("RetryPolicy.attempts must be >= 1")
        if self.backoff < 0 or self.multiplier < 1 or self.max_backoff < 0:
            raise WorkflowDefinitionError("RetryPolicy backoff must be >= 0 and multiplier >= 1")

    def delays(self) -> Iterator[float]:
        """The sleeps between attempts (``attempts - 1`` of them)."""
        for n in range(self.attempts - 1):
            yield min(self.backoff * self.multiplier**n, self.max_backoff)


@dataclass(frozen=True)
class Tool:
    """A declared tool; call it through ``ctx.call(tool, **args)``."""

    name: str
    fn: ToolFn
    policy: ReplayPolicy
    effect: bool = False
    target: str | None = None
    delivery: DeliveryFn | None = None
    reconcile: ReconcileFn | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    args_by_ref: tuple[str, ...] = ()
    """Arguments stored by reference: each stored once in the artifact store, content-addressed, and
    named by hash in the call's recorded arguments; a list as a hash chain of its items, so a list that
    grows from call to call (a conversation's messages) stores only its new items
    (:mod:`runlog.producers.calls._stored_args`). The request hash is the same either way: it is computed
    over the full arguments. Not for effect tools (their reconcile function reads the recorded ones)."""
    usage: UsageFn | None = None
    """Reads what a call spent from its result (a model request's tokens): recorded with the call's
    ``TOOL_RESULT`` (``RunEvent.usage``), priced by the runner's price table (the App's
    ``prices``). Called once, when the call is made; a recorded result handed back on a replay is
    not new spend and records nothing. None (the default): the tool reports no usage."""
    limit: RateLimit | None = None
    """The rate limit its calls count against (requests and tokens per period, shared by every
    process on the same Redis and prefix: :mod:`runlog.producers.calls._limiter`). None: no limit."""
    estimate: EstimateFn | None = None
    """``(args) -> tokens`` a call is expected to spend, taken from the limit's token budget before
    the call; the tokens its ``usage`` reports settle the difference after it. None: 0 before."""

    def __post_init__(self) -> None:
        where = f"tool {self.name!r}"
        if not self.name or "/" in self.name:
            raise WorkflowDefinitionError(f"{where}: a tool name must be non-empty and without '/'")
        if not isinstance(self.policy, ReplayPolicy):
            raise WorkflowDefinitionError(f"{where}: policy must be a ReplayPolicy")
        if self.policy is ReplayPolicy.RECONCILE_FIRST and self.reconcile is None:
            raise WorkflowDefinitionError(
                f"{where} has replay policy RECONCILE_FIRST but no reconcile function; declare "
                "reconcile=fn(delivery_key, request_args) -> existing external record or None, "
                "so resume can ask the external system before calling it again"
            )
        if self.effect:
            if not self.target:
                raise WorkflowDefinitionError(f"{where} changes the outside world: declare its target "
                                              "(e.g. target='platform:articles')")
            if self.delivery is None:
                raise WorkflowDefinitionError(
                    f"{where} changes the outside world: declare delivery=fn(args, call) -> "
                    "(account, platform, object_id, revision)"
                )
        if self.limit is not None and not isinstance(self.limit, RateLimit):
            raise WorkflowDefinitionError(
                f"{where}: limit must be a RateLimit, not {type(self.limit).__name__}")
        if self.estimate is not None and self.limit is None:
            raise WorkflowDefinitionError(
                f"{where}: estimate= needs limit= (the budget the estimate is taken from)")
        if isinstance(self.args_by_ref, str) or not all(isinstance(a, str) for a in self.args_by_ref):
            raise WorkflowDefinitionError(f"{where}: args_by_ref must be a tuple of argument names")
        object.__setattr__(self, "args_by_ref", tuple(self.args_by_ref))
        if self.args_by_ref and self.effect:
            raise WorkflowDefinitionError(
                f"{where} changes the outside world: its arguments are stored whole (args_by_ref is "
                "for tools without effects), so its reconcile function reads them as they were")


def tool(
    name: str,
    *,
    policy: ReplayPolicy = ReplayPolicy.SAFE,
    effect: bool | None = None,
    target: str | None = None,
    delivery: DeliveryFn | None = None,
    reconcile: ReconcileFn | None = None,
    retry: RetryPolicy | None = None,
    args_by_ref: Sequence[str] = (),
    usage: UsageFn | None = None,
    limit: RateLimit | None = None,
    estimate: EstimateFn | None = None,
) -> Callable[[ToolFn], Tool]:
    """Decorator declaring ``fn(call, **args)`` as a tool.

    ``NEVER`` and ``RECONCILE_FIRST`` tools are always effect tools (``effect=False``
    with them is an error); others are effect tools when ``effect=True``. ``args_by_ref`` names
    arguments stored by reference (:attr:`Tool.args_by_ref`); ``usage`` reads what a call spent
    from its result (:attr:`Tool.usage`); ``limit`` and ``estimate`` count its calls against a
    rate limit the fleet shares (:attr:`Tool.limit`).
    """
    forced = policy in (ReplayPolicy.NEVER, ReplayPolicy.RECONCILE_FIRST)
    if forced and effect is False:
        raise WorkflowDefinitionError(f"tool {name!r}: {policy.value} tools are effect tools; "
                                      "effect=False contradicts the policy")
    is_effect = forced or bool(effect)
    if isinstance(args_by_ref, str):
        raise WorkflowDefinitionError(f"tool {name!r}: args_by_ref must be a tuple of argument names, "
                                      f"not the string {args_by_ref!r}")

    def deco(fn: ToolFn) -> Tool:
        return Tool(name, fn, policy, is_effect, target, delivery, reconcile, retry or RetryPolicy(),
                    tuple(args_by_ref), usage, limit, estimate)

    return deco


def retry_steps(attempt: Callable[[int], Steps[Any]], policy: RetryPolicy,
                before_retry: Callable[[int], Steps[None]]) -> Steps[tuple[Any, int]]:
    """Protocol steps: ``attempt(n)`` until it returns, retrying only RetryableToolError.

    Returns ``(result, attempts used)``. Any other exception propagates at once; the last
    RetryableToolError propagates when the attempts are used up. Between attempts: a
    :class:`~runlog.producers.base._protocol.Sleep` of the policy's delay, then ``before_retry(next_attempt)``
    (the writer checks its lease there).
    """
    delays = policy.delays()
    n = 1
    while True:
        try:
            return (yield from attempt(n)), n
        except RetryableToolError:
            delay = next(delays, None)
            if delay is None:
                raise
        yield from Sleep(delay)
        n += 1
        yield from before_retry(n)
