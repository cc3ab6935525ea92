"""What an author declares, before anything runs (pure: no I/O, no clients).

* :mod:`producers.define._workflow`: workflows, their ordered stages, declared inputs and rules.
* :mod:`producers.define._tools`: tools with replay and retry policies, and what each call receives.
* :mod:`producers.define._inputs`: versioned run inputs (a dict, a JSON directory) and the pinned view.
* :mod:`producers.define._app`: the application object a resumer needs (workflows, tools, inputs).
"""
