"""What every layer of the SDK is written on; it imports none of them.

The SDK's layers, lowest first: ``base`` (with :mod:`runlog.producers.crash`) < ``define`` < ``log`` <
``calls`` < ``run``, then the public modules and the integrations. A layer imports only the layers
below it (``tests/unit/test_import_graph.py`` checks this).

* :mod:`runlog.producers.base._protocol`: the write protocol written once, as steps either runner drives.
* :mod:`runlog.producers.base._redis_io`: the SDK's Redis round trips, on a sync or an asyncio client.
* :mod:`runlog.producers.base._trace`: trace hooks, a span per run, stage and tool call.
"""
