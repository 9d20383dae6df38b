"""Start N Horovod (Gloo) ranks on this host the way a scheduler such as Slurm does: each rank on
its own, with nobody killing the others when one dies. horovodrun, mpirun and torchrun all end the
job when a rank exits, which would hide whether bytesched itself detects a lost rank; this launcher
does not, so whatever ends the surviving ranks is bytesched.

Usage: reliability_launch.py N -- command...   Prints each rank's output prefixed ``[r]`` and,
when rank r exits, ``EXIT rank=r code=c after=<s since the first rank exited>``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer


def main() -> int:
    ranks = int(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1:]
    plan = get_host_assignments(parse_hosts(f"localhost:{ranks}"), ranks)
    server = RendezvousServer()
    port = server.start()
    server.init(plan)
    procs = []
    for slot in plan:
        env = dict(os.environ, HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1", HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
                   HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE="lo",
                   PYTHONUNBUFFERED="1", **create_slot_env_vars(slot))
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    first_exit: list[float] = []
    lock = threading.Lock()

    def pump(rank: int, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            print(f"[{rank}] {line}", end="", flush=True)
        code = proc.wait()
        with lock:
            now = time.monotonic()
            first_exit.append(now) if not first_exit else None
            print(f"EXIT rank={rank} code={code} after={now - first_exit[0]:.1f}", flush=True)

    threads = [threading.Thread(target=pump, args=(r, p)) for r, p in enumerate(procs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.stop()
    return max(abs(p.returncode) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
