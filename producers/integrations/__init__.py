"""What the public integration modules build on (:mod:`runlog.producers.pydantic_ai`,
:mod:`runlog.producers.openai_agents`, :mod:`runlog.producers.otel`).

* :mod:`runlog.producers.integrations._core`: what every durable agent integration shares: the
  ``RunlogAgent`` base (its name, its declared tools, ``tool_for``, ``tools``), the current tool
  call, the model's recorded call, its usage, and the positions of a response's tool calls.
* :mod:`runlog.producers.integrations._pydantic_ai_json`: what a durable Pydantic AI agent records, as JSON.
* :mod:`runlog.producers.integrations._openai_agents_json`: what a durable OpenAI Agents SDK agent records,
  as JSON (and the usage it reports); :mod:`runlog.producers.integrations._openai_agents_run`: its model
  and the state of one run.
"""
