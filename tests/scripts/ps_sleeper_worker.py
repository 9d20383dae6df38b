"""A worker that never finishes, for the launcher's stop paths (timeout, Ctrl-C, a peer's crash).

Each worker forks a grandchild that sleeps too, so the tests can check that stopping reaches
the whole process group, not only the process the launcher started. Options:

  --ignore-sigterm-rank R   worker R ignores SIGTERM (the launcher must escalate to SIGKILL)
  --crash-rank R            worker R exits with code 3 once everyone is up
  --kvstore                 also create a dist_sync KVStore (blocks: a crashed peer never joins)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ignore-sigterm-rank", type=int, default=-1)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--kvstore", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["BYTESCHED_RANK"])

    if rank == args.ignore_sigterm_rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"ready rank={rank} grandchild={child.pid}", flush=True)

    if rank == args.crash_rank:
        time.sleep(0.5)
        print("crashing with exit code 3", flush=True)
        sys.exit(3)
    if args.kvstore:
        import mxnet as mx

        kv = mx.kv.create("dist_sync")  # waits for every worker; the crashed one never comes
        kv.init(0, mx.nd.zeros((4,)))
        print("FAIL: the KVStore formed without the crashed worker", flush=True)
        return 1
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
