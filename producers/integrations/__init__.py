"""What the public integration modules build on (:mod:`producers.pydantic_ai`, :mod:`producers.otel`).

* :mod:`producers.integrations._pydantic_ai_json`: what a durable Pydantic AI agent records, as JSON.
"""
