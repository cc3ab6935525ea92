"""A stage's call positions and its failure: which index the next call takes, and the error that
ended the stage (after which no call takes a position)."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CallPositions"]


class CallPositions:
    """The positions of one stage execution's calls, handed out in the order calls are made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._failure: BaseException | None = None

    @property
    def failure(self) -> BaseException | None:
        """The first error that failed the stage (a tool call's, a divergence), or None."""
        with self._lock:
            return self._failure

    def fail(self, err: BaseException) -> None:
        """Record the stage's failure (the first one stays)."""
        with self._lock:
            if self._failure is None:
                self._failure = err

    def claim(self) -> int:
        """The next position. Raises the stage's failure once there is one."""
        return self.reserve(1)[0]

    def reserve(self, n: int) -> list[int]:
        """The next ``n`` positions at once, in order (a parallel group's, given before any of its
        calls is awaited). Raises the stage's failure once there is one."""
        with self._lock:
            if self._failure is not None:
                raise self._failure
            first = self._next
            self._next += n
            return list(range(first, first + n))

    def claim_if(self, take: Callable[[int], bool]) -> tuple[int, bool]:
        """The next position and ``take(position)``, which decides (under the lock, so no call
        takes it meanwhile) whether the position is claimed. Raises the stage's failure."""
        with self._lock:
            if self._failure is not None:
                raise self._failure
            index = self._next
            taken = take(index)
            if taken:
                self._next += 1
            return index, taken
