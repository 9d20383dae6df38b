"""A dist_sync worker (the model of mxnet_train.py, through ScheduledKVStore) that kills a server,
or freezes.

Run under ``bytesched launch``. Prints ``PROGRESS rank=<r> step=<s>`` after each step; at step
``--kill-server-at`` worker 0 SIGKILLs server 0 of its own job (found by its ps-lite environment:
``DMLC_ROLE=server`` and this job's ``DMLC_PS_ROOT_PORT``), printing ``FAULT killing server pid=<p>``
first: the launcher may stop this worker as soon as the server is gone, before a later line is out.
Training then goes on: the next push waits for a server that is gone. With ``--freeze-worker-at``
instead, worker 1 prints ``FAULT freezing worker 1`` and stops itself (SIGSTOP) at that step: alive
to the kernel and to ps-lite, silent to everyone else.
"""

from __future__ import annotations

import argparse
import os
import signal

import mxnet as mx
import numpy as np
import psutil
from mxnet import autograd, gluon

from bytesched.plugins.mxnet import ScheduledKVStore
from mxnet_train import model  # tests/scripts is this script's directory


def job_server() -> psutil.Process:
    """This job's first parameter server (the launcher starts its servers in rank order)."""
    port = os.environ["DMLC_PS_ROOT_PORT"]
    servers = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("DMLC_ROLE") == "server" and env.get("DMLC_PS_ROOT_PORT") == port:
            servers.append(proc)
    if not servers:
        raise SystemExit(f"no server of the job on port {port} found")
    return min(servers, key=lambda proc: proc.create_time())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kill-server-at", type=int, default=3)
    parser.add_argument("--freeze-worker-at", type=int, default=None,
                        help="freeze worker 1 at this step instead of killing a server")
    args = parser.parse_args()
    rank = int(os.environ["BYTESCHED_RANK"])
    kv = ScheduledKVStore(mx.kv.create("dist_sync"))
    net = model()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05}, kvstore=kv)
    rng = np.random.RandomState(100 + rank)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(args.steps):
        if args.freeze_worker_at is not None:
            if step == args.freeze_worker_at and rank == 1:
                print("FAULT freezing worker 1", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        elif step == args.kill_server_at and rank == 0:
            server = job_server()
            print(f"FAULT killing server pid={server.pid}", flush=True)
            server.send_signal(signal.SIGKILL)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(rng.rand(16, 32))), mx.nd.array(rng.randint(0, 10, size=16)))
        loss.backward()
        trainer.step(16)
        mx.nd.waitall()
        print(f"PROGRESS rank={rank} step={step + 1}", flush=True)


if __name__ == "__main__":
    main()
