"""Start runs of :mod:`mixed_app` and crash each in its last stage (the mixed-version test's
writer process, of either release): ``python mixed_writer.py TAG COUNT``. Prints each run id.
Settings come from the environment."""

from __future__ import annotations

import contextlib
import importlib
import sys

import mixed_app

_p = importlib.import_module(mixed_app.ROOT + "producers")


def main(tag: str, count: int) -> None:
    mixed_app.CRASH = True
    settings = _p.Settings.from_env()
    for i in range(count):
        runner = _p.Runner.from_settings(settings, source=mixed_app.app.source)
        try:
            h = runner.start_run(mixed_app.workflow, {"q": f"{tag}-{i}"})
            with contextlib.suppress(mixed_app.Abandon):  # the crash: nothing more is appended
                runner.execute(h.session, release=False)
            print(h.run_id, flush=True)
        finally:
            runner.close()  # the lease is not released: it expires, and the sweep finds the run


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
