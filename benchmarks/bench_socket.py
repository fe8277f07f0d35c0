"""What one TCP connection costs on the CPU this runs on: NCCL's socket transport without a NIC.

Usage::

    .venv/bin/python benchmarks/bench_socket.py [--repeats 5] [--json]

NCCL's socket transport (``src/transport/net_socket.cc``) moves data through the kernel's TCP
stack from a proxy thread (and ``NCCL_SOCKET_NTHREADS`` helper threads), each request cut into
tasks of at least 64 KiB (``NCCL_SOCKET_MIN_TASKSIZE``). Over loopback the wire is free, so what
is left is the host's part:

- ``latency_us``: half the round trip of a 1-byte message, ping-pong over one connection
  (two ``send`` + two ``recv`` system calls and the stack, both directions);
- ``stream_GBps``: one connection streaming 64 KiB tasks (send + receive copies on two threads):
  the rate one helper thread's socket reaches when the NIC is not the limit.

Figures: the minimum latency and the maximum rate over ``--repeats`` runs (on a loaded machine
other processes only ever slow a run down). docs/nccl.md records them and where they are used.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

TASK = 1 << 16  # NCCL_SOCKET_MIN_TASKSIZE, bytes


def _pair() -> tuple[socket.socket, socket.socket]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as NCCL's ncclSocketConnect
    return a, b


def _recv_exact(s: socket.socket, n: int, buf: bytearray) -> None:
    view = memoryview(buf)
    got = 0
    while got < n:
        got += s.recv_into(view[got:n])


def latency_us(rounds: int = 2000) -> float:
    a, b = _pair()
    stop = threading.Event()

    def echo() -> None:
        buf = bytearray(1)
        for _ in range(rounds + 100):
            _recv_exact(b, 1, buf)
            b.sendall(buf)
        stop.set()

    t = threading.Thread(target=echo)
    t.start()
    buf = bytearray(1)
    for _ in range(100):  # warm-up
        a.sendall(b"x")
        _recv_exact(a, 1, buf)
    t0 = time.perf_counter()
    for _ in range(rounds):
        a.sendall(b"x")
        _recv_exact(a, 1, buf)
    dt = time.perf_counter() - t0
    t.join()
    a.close()
    b.close()
    return dt / rounds / 2 * 1e6


def stream_GBps(total: int = 1 << 30) -> float:
    a, b = _pair()
    payload = bytes(TASK)

    def sink() -> None:
        buf = bytearray(TASK)
        left = total
        while left:
            left -= b.recv_into(buf, min(TASK, left))

    t = threading.Thread(target=sink)
    t0 = time.perf_counter()
    t.start()
    for _ in range(total // TASK):
        a.sendall(payload)
    t.join()
    dt = time.perf_counter() - t0
    a.close()
    b.close()
    return total / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    lat = [latency_us() for _ in range(a.repeats)]
    bw = [stream_GBps() for _ in range(a.repeats)]
    out = {"latency_us": round(min(lat), 2), "stream_GBps": round(max(bw), 2),
           "latency_us_all": [round(x, 2) for x in lat], "stream_GBps_all": [round(x, 2) for x in bw]}
    if a.json:
        print(json.dumps(out))
        return
    print(f"one TCP connection over loopback ({a.repeats} runs)")
    print(f"  one-way latency, 1 B ping-pong: {out['latency_us']:.2f} us (min; all {out['latency_us_all']})")
    print(f"  one stream, 64 KiB tasks:       {out['stream_GBps']:.2f} GB/s (max; all {out['stream_GBps_all']})")


if __name__ == "__main__":
    main()
