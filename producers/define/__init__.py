"""What an author declares, before anything runs (pure: no I/O, no clients).

Imports only :mod:`~runlog.producers.base` of the SDK (a tool's retries are steps of its protocol).

* :mod:`runlog.producers.define._workflow`: workflows, their ordered stages, declared inputs and rules.
* :mod:`runlog.producers.define._tools`: tools with replay and retry policies, and what each call receives.
* :mod:`runlog.producers.define._inputs`: versioned run inputs (a dict, a JSON directory) and the pinned view.
* :mod:`runlog.producers.define._app`: the application object a resumer needs (workflows, tools, inputs).
"""
