"""A run's lifecycle: starting it, holding it, executing its stages, on a thread or on a loop.

Above the SDK's other layers (:mod:`~runlog.producers.calls`, :mod:`~runlog.producers.log`,
:mod:`~runlog.producers.define`, :mod:`~runlog.producers.base`): it builds on them, none of them imports it.

* :mod:`runlog.producers.run._runner`, :mod:`runlog.producers.run._arunner`: the blocking and the asyncio
runner.
* :mod:`runlog.producers.run._start`: starting a run (lease, confirmed ``RUN_STARTED``, the key's claim).
* :mod:`runlog.producers.run._core`: executing a run's stages (also for a run a resume continues).
* :mod:`runlog.producers.run._context`: the stage context a stage function receives.
* :mod:`runlog.producers.run._runs`: run idempotency keys (one key names at most one run, ever).
* :mod:`runlog.producers.run._active`: the registry of active runs the resumer's sweep reads (Redis).
"""
