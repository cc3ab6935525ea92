"""What model calls cost: the price table an :class:`~runlog.producers.App` declares (pure).

A :class:`Price` is per million tokens, in US dollars, as providers publish them: input tokens not
read from or written to the cache, output tokens, and, when the provider bills them differently,
cache reads and cache writes (each defaults to the input price). :meth:`PriceTable.cost_nanos`
prices one call's :class:`~runlog.schemas.Usage` in billionths of a dollar (an integer, so totals add up
exactly); a model the table does not name has no cost (None), never a guessed one.

A model is looked up by the name its usage records (``"openai:gpt-5.2"``: provider, colon, the
model's name) and then by the part after the first colon (``"gpt-5.2"``), so a table may name
models either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from runlog.schemas import Usage
from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["Price", "PriceTable", "check_usage", "usage_of"]

_NANOS_PER_TOKEN = Decimal(1_000)  # dollars per million tokens -> billionths of a dollar per token


def _rate(name: str, value: float | int | str | Decimal | None, what: str) -> Decimal | None:
    if value is None:
        return None
    try:
        d = Decimal(str(value)) if not isinstance(value, Decimal) else value
    except ArithmeticError:
        d = Decimal("NaN")
    if isinstance(value, bool) or not d.is_finite() or d < 0:
        raise WorkflowDefinitionError(f"price of {name!r}: {what} must be a finite number >= 0 (US dollars "
                                      f"per million tokens), got {value!r}")
    return d


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens of one model.

    Args:
        input: input tokens (those not read from or written to the cache).
        output: output tokens.
        cache_read: input tokens read from the cache (default: ``input``).
        cache_write: input tokens written to the cache (default: ``input``).
    """

    input: float | int | str | Decimal
    output: float | int | str | Decimal
    cache_read: float | int | str | Decimal | None = None
    cache_write: float | int | str | Decimal | None = None

    def rates(self, name: str = "?") -> tuple[Decimal, Decimal, Decimal, Decimal]:
        """(input, output, cache read, cache write) in dollars per million tokens, checked."""
        i = _rate(name, self.input, "input")
        o = _rate(name, self.output, "output")
        if i is None or o is None:
            raise WorkflowDefinitionError(f"price of {name!r}: input and output are required (US dollars "
                                          "per million tokens)")
        r = _rate(name, self.cache_read, "cache_read")
        w = _rate(name, self.cache_write, "cache_write")
        return i, o, i if r is None else r, i if w is None else w


@dataclass(frozen=True, eq=False)
class PriceTable(Mapping[str, Price]):
    """Model name -> :class:`Price`; prices a call's usage (see the module docstring).

    Raises:
        WorkflowDefinitionError: a name that is not a non-empty string, a price that is not a
            :class:`Price`, or a rate that is negative or not a finite number.
    """

    prices: Mapping[str, Price] = field(default_factory=dict)
    _rates: dict[str, tuple[Decimal, Decimal, Decimal, Decimal]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rates = {}
        for name, price in dict(self.prices).items():
            if not isinstance(name, str) or not name:
                raise WorkflowDefinitionError(f"a price table names models by non-empty strings, "
                                              f"got {name!r}")
            if not isinstance(price, Price):
                raise WorkflowDefinitionError(f"price of {name!r} must be a Price(input=..., output=...), "
                                              f"got {type(price).__name__}")
            rates[name] = price.rates(name)
        object.__setattr__(self, "prices", dict(self.prices))
        object.__setattr__(self, "_rates", rates)

    @classmethod
    def of(cls, prices: PriceTable | Mapping[str, Price] | None) -> PriceTable:
        """``prices`` as a table (an empty one for None)."""
        return prices if isinstance(prices, PriceTable) else cls(prices or {})

    def __getitem__(self, model: str) -> Price:
        return self.prices[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self.prices)

    def __len__(self) -> int:
        return len(self.prices)

    def price_of(self, model: str) -> Price | None:
        """The price of ``model``: by its full name, else by the part after its first colon."""
        p = self.prices.get(model)
        if p is None and ":" in model:
            p = self.prices.get(model.split(":", 1)[1])
        return p

    def cost_nanos(self, usage: Usage) -> int | None:
        """What ``usage`` costs in billionths of a US dollar (rounded half to even), or None when
        the table has no price for its model."""
        model = usage.model
        rates = self._rates.get(model)
        if rates is None and ":" in model:
            rates = self._rates.get(model.split(":", 1)[1])
        if rates is None:
            return None
        i, o, r, w = rates
        cached = usage.cache_read_tokens + usage.cache_write_tokens
        plain = max(usage.input_tokens - cached, 0)
        total = (plain * i + usage.output_tokens * o + usage.cache_read_tokens * r
                 + usage.cache_write_tokens * w) * _NANOS_PER_TOKEN
        return int(total.to_integral_value(rounding=ROUND_HALF_EVEN))

    def priced(self, usage: Usage) -> Usage:
        """``usage`` with its cost from this table (a cost it already has is kept)."""
        if usage.cost_nanos is not None:
            return usage
        return replace(usage, cost_nanos=self.cost_nanos(usage))


def check_usage(usage: object, where: str) -> Usage:
    """``usage`` when it is a :class:`~runlog.schemas.Usage` with a model name and counts that are
    non-negative integers; else :class:`~runlog.schemas.errors.WorkflowDefinitionError` naming ``where``."""
    if not isinstance(usage, Usage):
        raise WorkflowDefinitionError(f"{where}: usage must be a runlog Usage, got {type(usage).__name__}")
    counts = (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens)
    if not isinstance(usage.model, str) or not usage.model:
        raise WorkflowDefinitionError(f"{where}: usage needs the model's name")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
        raise WorkflowDefinitionError(f"{where}: token counts must be integers >= 0, got {counts}")
    if usage.cost_nanos is not None and (not isinstance(usage.cost_nanos, int) or usage.cost_nanos < 0
                                         or isinstance(usage.cost_nanos, bool)):
        raise WorkflowDefinitionError(f"{where}: cost_nanos must be an integer >= 0 or None")
    return usage



def usage_of(read: Callable[[Any], Usage | None] | None, result: Any, prices: PriceTable,
             where: str) -> Usage | None:
    """What a call spent: ``read(result)`` (a tool's ``usage``), checked and priced by ``prices``;
    None when the tool reports no usage."""
    if read is None:
        return None
    usage = read(result)
    return None if usage is None else prices.priced(check_usage(usage, where))
