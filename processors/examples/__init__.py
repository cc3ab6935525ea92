"""Examples of other services consuming Runlog's topics with plain Kafka clients."""

__all__: list[str] = []
