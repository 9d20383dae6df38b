"""benchmarks.emulation.cluster: hosts in namespaces joined by shaped veth pairs (or one shaped
loopback), and jobs launched across them. Real namespaces, real Horovod/Gloo, real shaping;
needs root with ``ip`` and ``tc`` (as the benchmarks do) and fails, never skips, without."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.emulation import ShapingUnavailable, cleanup_stale, emulated_cluster, parse_rate, simulator_topology
from benchmarks.emulation.network import PREFIX
from benchmarks.emulation.throughput import aggregate_rate, stream_rates
from conftest import TOKEN_VAR, require, require_shaping, started

RATE = parse_rate("200mbit")
ALLREDUCE_FLOATS = 2_500_000  # 10 MB: a 2-rank ring moves all of it each way over every link

# A Horovod rank: an exactly checkable sum, a timed 10 MB all-reduce, and bytesched's rank-0
# channel (which must reach rank 0's host from every other host).
HOROVOD_RANK = textwrap.dedent(f"""
    import os, time
    import torch
    import horovod.torch as hvd
    from bytesched.core.channel import open_channel
    from bytesched.core.config import from_env

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    summed = hvd.allreduce(torch.arange(1000, dtype=torch.float32) * (rank + 1), op=hvd.Sum, name="check")
    assert torch.equal(summed, torch.arange(1000, dtype=torch.float32) * sum(range(1, size + 1))), summed[:5]
    hvd.allreduce(torch.ones(1000), name="warm")
    big = torch.ones({ALLREDUCE_FLOATS})
    start = time.monotonic()
    out = hvd.allreduce(big, op=hvd.Sum, name="big")
    seconds = time.monotonic() - start
    assert float(out[0]) == size
    channel = open_channel(from_env(), rank, size)
    if rank == 0:
        heard = channel.gather("hello", timeout=30)
        print("CHANNEL heard", sorted(heard), flush=True)
    else:
        channel.report("hello", {{"host": os.environ["HOROVOD_HOSTNAME"]}})
    channel.close()
    print(f"ALLREDUCE OK rank={{rank}} size={{size}} host={{os.environ['HOROVOD_HOSTNAME']}} "
          f"iface={{os.environ['HOROVOD_GLOO_IFACE']}} seconds={{seconds:.3f}}", flush=True)
""")


def ours(pid: int | None = None) -> list[str]:
    """Namespaces this test process (or ``pid``) created that still exist, or whose /etc/netns
    files do."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {line.split()[0] for line in listing.splitlines()}
    names.update(os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else [])
    return sorted(name for name in names if name.startswith(f"{PREFIX}-{pid or os.getpid()}-"))


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_describe_topologies_and_the_simulator_option() -> None:
    require_shaping()
    with emulated_cluster(3, parse_rate("1gbit")) as cluster:
        assert cluster.describe() == "3 hosts, veth pairs shaped to 1 Gbit/s per direction (tc tbf)"
        assert [h.address for h in cluster.hosts] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
        assert len({h.namespace.name for h in cluster.hosts}) == 3
        assert simulator_topology(cluster) == "full-duplex"
        fifth = cluster.place(4, 5)  # ranks 0..4 round-robin over 3 hosts
        assert (fifth.host.index, fifth.local_rank, fifth.local_size, fifth.cross_rank, fifth.cross_size) == \
            (1, 1, 2, 1, 2)
    with emulated_cluster(2, parse_rate("500mbit"), topology="loopback") as cluster:
        assert cluster.describe() == "2 hosts on one loopback shaped to 500 Mbit/s for all traffic together (tc tbf)"
        assert simulator_topology(cluster) == "shared"
    assert ours() == []


def test_bad_arguments_name_the_culprit(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="topology 'star'"):
        with emulated_cluster(2, RATE, topology="star"):
            pass
    with pytest.raises(ValueError, match="bits_per_second"):
        with emulated_cluster(2, "1gbit"):  # type: ignore[arg-type]
            pass
    with monkeypatch.context() as patch:
        patch.setattr("os.geteuid", lambda: 1000)
        with pytest.raises(ShapingUnavailable, match="needs root"):
            with emulated_cluster(2, RATE):
                pass
    require_shaping()
    with pytest.raises(ValueError, match="hosts must be"):
        with emulated_cluster(0, RATE):
            pass
    with emulated_cluster(1, RATE) as cluster:
        with pytest.raises(ValueError, match="ranks must be"):
            cluster.launch_torch_distributed(python("pass"), env={}, ranks=0)
    assert ours() == []


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_veth_is_full_duplex_and_loopback_is_one_shared_medium() -> None:
    """Two streams at once, host 0 -> 1 and 1 -> 0: on veth pairs each gets the rate, on the
    shaped loopback they split it."""
    require_shaping()
    nbytes = 10_000_000  # 0.4 s at 200 Mbit/s
    with emulated_cluster(2, RATE) as cluster:
        a, b = cluster.hosts
        one_way = stream_rates([(a, b)], nbytes)[0].rate
        both = [t.rate for t in stream_rates([(a, b), (b, a)], nbytes)]
    # Under load a stream may lose some speed (noisy machine), but never exceeds the rate, and
    # two directions at once carry far more than one shared medium could.
    assert 0.75 * RATE < one_way < 1.1 * RATE, one_way
    assert all(0.6 * RATE < rate < 1.1 * RATE for rate in both), both
    assert sum(both) > 1.4 * RATE, both
    with emulated_cluster(2, RATE, topology="loopback") as cluster:
        a, b = cluster.hosts
        shared = aggregate_rate(stream_rates([(a, b), (b, a)], nbytes))
    assert 0.6 * RATE < shared < 1.1 * RATE, shared
    assert ours() == []


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_horovod_allreduce_crosses_the_shaped_links(tmp_path: Path) -> None:
    require_shaping()
    require("horovod.torch", "Horovod with PyTorch")
    script = tmp_path / "rank.py"
    script.write_text(HOROVOD_RANK)
    with emulated_cluster(2, RATE) as cluster:
        job = cluster.launch_horovod([sys.executable, str(script)], env={}, ranks=2)
        status = job.wait(timeout=75)
    log = "\n".join(job.output)
    assert status == 0, log
    assert "[rank 0] CHANNEL heard [1]" in log, log
    done = [line for line in job.output if "ALLREDUCE OK" in line]
    assert len(done) == 2, log
    assert "[rank 0] ALLREDUCE OK rank=0 size=2 host=host0 iface=eth0" in log
    assert "[rank 1] ALLREDUCE OK rank=1 size=2 host=host1 iface=eth0" in log
    # 10 MB each way over 200 Mbit/s links needs 0.4 s; unshaped it takes a few ms.
    seconds = [float(line.rsplit("seconds=", 1)[1]) for line in done]
    assert min(seconds) > 0.3, seconds
    assert ours() == []


@pytest.mark.multiproc
@pytest.mark.timeout(30)
def test_a_failing_rank_stops_the_job() -> None:
    require_shaping()
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)"
    with emulated_cluster(2, RATE) as cluster:
        job = cluster.launch_torch_distributed(python(code), env={}, ranks=2)
        assert job.wait(timeout=20) == 3
    assert "[job] rank 1 exited with status 3; stopping the job" in job.output


def namespaces_of_role(role: str) -> dict[str, str]:
    """This test's ps-lite processes of ``role`` -> the namespace each runs in (by DMLC_NODE_HOST)."""
    found = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get(TOKEN_VAR) == os.environ[TOKEN_VAR] and env.get("DMLC_ROLE") == role:
                found[env["DMLC_NODE_HOST"]] = subprocess.run(["ip", "netns", "identify", str(proc.pid)],
                                                              capture_output=True, text=True).stdout.strip()
    return found


@pytest.mark.multiproc
@pytest.mark.timeout(30)
def test_ps_places_servers_after_workers_and_a_timeout_names_what_ran() -> None:
    require_shaping()
    code = ("import os, time\nprint(os.environ['DMLC_NODE_HOST'], os.environ['BYTESCHED_RANK'], flush=True)\n"
            "time.sleep(60)")
    with emulated_cluster(4, RATE) as cluster:
        job = cluster.launch_ps(python(code), env={}, workers=2, servers=2)
        deadline = time.monotonic() + 10
        want = {h.address: h.namespace.name for h in cluster.hosts[2:]}  # servers get hosts 2 and 3
        while (namespaces_of_role("server") != want or "[worker 1] 10.213.0.2 1" not in job.output) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert namespaces_of_role("server") == want
        assert "[worker 1] 10.213.0.2 1" in job.output  # worker 1 runs on host 1
        with pytest.raises(TimeoutError, match="still running: .*worker 0, worker 1"):
            job.wait(timeout=0.5)
    assert job.labels == ["scheduler", "server 0", "server 1", "worker 0", "worker 1"]


@pytest.mark.multiproc
@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_removes_namespaces_and_processes(sig: signal.Signals) -> None:
    require_shaping()
    holder = textwrap.dedent("""
        import os, sys
        from benchmarks.emulation import emulated_cluster, parse_rate
        with emulated_cluster(2, parse_rate("1gbit")) as cluster:
            sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
            job = cluster.launch_torch_distributed(sleeper, env={}, ranks=2)
            print(os.getpid(), flush=True)
            job.wait(timeout=60)
    """)
    with started(python(holder)) as process:
        assert process.stdout is not None
        pid = int(process.stdout.readline())
        assert ours(pid) == [f"{PREFIX}-{pid}-0-sw", f"{PREFIX}-{pid}-1-h0", f"{PREFIX}-{pid}-2-h1"]
        process.send_signal(sig)
        # SIGTERM becomes SystemExit(128 + 15); Ctrl-C a KeyboardInterrupt that ends Python by SIGINT.
        assert process.wait(timeout=20) == (128 + 15 if sig == signal.SIGTERM else -signal.SIGINT)
    assert ours(pid) == []
    # The leftover-process guard (conftest) fails this test if a rank outlived the holder.


def test_cleanup_stale_deletes_only_leftovers_of_dead_runs() -> None:
    require_shaping()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale, live = f"{PREFIX}-{dead}-0-h0", f"{PREFIX}-{os.getpid()}-999-h0"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    os.makedirs(f"/etc/netns/{stale}", exist_ok=True)
    try:
        deleted = cleanup_stale()
        assert stale in deleted and live not in deleted
        assert ours() == [live] and not os.path.exists(f"/etc/netns/{stale}")
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
