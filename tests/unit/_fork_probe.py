"""A module the fork tests run as ``python -m`` would (tests/unit/test_fork.py)."""

from __future__ import annotations

import os
import signal
import sys
import time


def main(argv: list[str]) -> int:
    what = argv[0]
    if what == "print":
        print(f"name={__name__}")
        print(f"argv={','.join(argv[1:])}")
        print(f"env={os.environ.get('RUNLOG_FORK_PROBE')}")
        print(f"cwd={os.getcwd()}")
        return 0
    if what == "exit":
        return int(argv[1])
    if what == "raise":
        raise RuntimeError("the probe raised")
    if what == "sigkill":
        print("before the kill", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "sleep":
        time.sleep(60)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
