"""What the public integration modules build on (:mod:`producers.pydantic_ai`,
:mod:`producers.openai_agents`, :mod:`producers.otel`).

* :mod:`producers.integrations._pydantic_ai_json`: what a durable Pydantic AI agent records, as JSON.
* :mod:`producers.integrations._openai_agents_json`: what a durable OpenAI Agents SDK agent records,
  as JSON (and the usage it reports); :mod:`producers.integrations._openai_agents_run`: its model
  and the state of one run.
"""
