"""A run's lifecycle: starting it, holding it, executing its stages, on a thread or on a loop.

* :mod:`runlog.producers.run._runner`, :mod:`runlog.producers.run._arunner`: the blocking and the asyncio
runner.
* :mod:`runlog.producers.run._protocol`: the write protocol written once, as steps either runner drives.
* :mod:`runlog.producers.run._start`: starting a run (lease, confirmed ``RUN_STARTED``, the key's claim).
* :mod:`runlog.producers.run._core`: executing a run's stages (also for a run a resume continues).
* :mod:`runlog.producers.run._context`: the stage context a stage function receives.
* :mod:`runlog.producers.run._runs`: run idempotency keys (one key names at most one run, ever).
* :mod:`runlog.producers.run._lease`: the single-writer lease on a run (Redis).
* :mod:`runlog.producers.run._active`: the registry of active runs the resumer's sweep reads (Redis).
* :mod:`runlog.producers.run._redis_io`: the SDK's Redis round trips, on a sync or an asyncio client.
* :mod:`runlog.producers.run._trace`: trace hooks, a span per run, stage and tool call.
"""
