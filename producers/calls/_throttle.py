"""One call's dealings with its tool's rate limit, as protocol steps (the stage context's part for
:attr:`runlog.producers.Tool.limit`; the limits themselves: :mod:`runlog.producers.calls._limiter`).

Before each attempt the call takes one request and its estimated tokens, waiting until the limiter
grants them: a wait of at most the limiter's ``durable_after_s`` in the call's thread (in slices of
at most :data:`MAX_PAUSE_S`, the lease checked between them), a longer one durably where the call may
(``park``: the call reserves its request and tokens, :meth:`Limiter.reserve`, so its place is kept and
later callers wait behind it, then the call site appends ``RUN_WAITING`` for signal :data:`LIMIT` with
the time the budget covers the reservation and lets go of the run; the resumed call does not take
again: its reservation is its take);
a
:class:`~runlog.producers.RateLimited` from the tool blocks the limit's key for its ``Retry-After``
for every process sharing it; after the call the tokens its usage reports settle the estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runlog.producers.base._protocol import Invoke, Sleep, Steps
from runlog.producers.calls._limiter import Limiter
from runlog.producers.define._limits import RateLimit
from runlog.producers.define._tools import Tool
from runlog.schemas import Usage
from runlog.schemas.errors import RateLimited, WorkflowDefinitionError

__all__ = ["LIMIT", "LIMIT_SINCE", "MAX_PAUSE_S", "Metered", "Park", "limit_since_key", "metered"]

MAX_PAUSE_S = 1.0
"""The longest one pause of a waiting call: it asks the limiter again (and checks its lease) after it."""

LIMIT = "runlog.limit"
"""The signal a run waits for while a call waits durably for its rate limit (``RUN_WAITING``
attributes ``limit``: the limit's key, ``since_ms``: when the call began to wait, ``deadline_ms``: when
the limiter said it may fit). Nothing sends it: the fleet's timers wake the run at the deadline."""

LIMIT_SINCE = "since_ms"
"""The ``RUN_WAITING`` attribute of a durable limit wait holding when the call began to wait (epoch ms),
so the ``limit_wait_ms`` its ``TOOL_RESULT`` records counts every wait, in threads and durable."""


def limit_since_key(call_id: str) -> str:
    """The key under which a resume hands a call its durable limit wait's ``since_ms`` (beside the
    wait's deadline under ``call_id`` in the stage's deadlines; not a call position)."""
    return f"{call_id}#since"


Park = Callable[[float], Steps[None]]
"""``park(wait_s)``: append the durable wait and let go of the run (raises, never returns)."""


class Metered:
    """A call counted against ``limit``: what it took, waited and was refused."""

    def __init__(self, limiter: Limiter, limit: RateLimit, tokens: int, check: Callable[[], None]) -> None:
        self.limiter = limiter
        self.limit = limit
        self.tokens = tokens
        self.check = check
        self.waited_s = 0.0
        self.refusals = 0

    def take(self, park: Park | None = None) -> Steps[None]:
        """Wait until the limit grants one request and the estimated tokens: in this thread, or, for
        a wait longer than the limiter's ``durable_after_s`` when ``park`` is given, durably."""
        while True:
            wait: float = yield from Invoke(self.limiter.take, (self.limit, self.tokens))
            if wait <= 0:
                return
            if park is not None and wait > self.limiter.durable_after_s:
                # its place kept: taken now into debt, called once the budget covers it (no second take)
                due: float = yield from Invoke(self.limiter.reserve, (self.limit, self.tokens))
                yield from park(max(due, 0.001))  # RUN_WAITING appended, the run let go (RunWaits)
            self.check()  # a writer whose lease was taken meanwhile waits no longer (LeaseLost)
            pause = min(wait, MAX_PAUSE_S)
            yield from Sleep(pause)
            self.waited_s += pause

    def refused(self, err: RateLimited) -> Steps[None]:
        """The provider said 429: nobody sharing the key calls it before ``Retry-After``."""
        self.refusals += 1
        yield from Invoke(self.limiter.block, (self.limit, err.retry_after_s))

    def settle(self, spent: Usage | None) -> Steps[None]:
        """The tokens the call spent, as its usage reports them, against those it took."""
        if spent is not None and self.limit.tokens is not None:
            yield from Invoke(self.limiter.settle, (self.limit, self.tokens,
                                                    spent.input_tokens + spent.output_tokens))

    def attributes(self) -> dict[str, str]:
        """Recorded on the call's ``TOOL_RESULT``."""
        return {"limit": self.limit.key, "limit_wait_ms": str(round(self.waited_s * 1000)),
                "rate_limited": str(self.refusals)}


def metered(limiter: Limiter | None, tool: Tool, args: Mapping[str, Any],
            check: Callable[[], None]) -> Metered | None:
    """The call's meter when its tool has a limit and the runner a limiter (None: not counted).

    Raises:
        WorkflowDefinitionError: the tool's estimate is not a non-negative int.
    """
    if tool.limit is None or limiter is None:
        return None
    tokens = tool.estimate(args) if tool.estimate is not None else 0
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise WorkflowDefinitionError(
            f"tool {tool.name!r}: estimate must return a token count (an int >= 0), got {tokens!r}")
    return Metered(limiter, tool.limit, tokens, check)
