"""NCCL's socket transport (Ethernet without RDMA): what a NIC moves, and what a message costs.

Without an RDMA NIC (InfiniBand or RoCE with GPUDirect), NCCL falls back to ``NET/Socket``
(``src/transport/net_socket.cc``, NCCL 2.30): data is staged in host memory (``ptrSupport =
NCCL_PTR_HOST``) and pushed through the kernel's TCP stack by CPU threads. Per connection (one per
channel and peer) NCCL opens ``nSocks = NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS`` data
sockets served by ``NCCL_SOCKET_NTHREADS`` helper threads (at most 16 threads, 64 sockets; a
larger product is cut to ``64 // threads`` sockets per thread). Both default to an auto-detection
by the NIC's PCI vendor: AWS ENA (0x1d0f) 2 threads x 8 sockets, Google gVNIC (0x1ae0) 4 x 1,
anything else 0 helper threads, i.e. the proxy thread sends on the connection itself. A request is
cut into tasks of ``max(64 KiB, size / nSocks)`` (``NCCL_SOCKET_MIN_TASKSIZE``).

NCCL's tuner does not know any of this: the NIC reports its line rate (``/sys/class/net/*/speed``)
and no latency (``props->latency = 0``), so NCCL picks algorithms as on an RDMA network with the
same line rate (``tuning.cc``'s NET latencies). What differs is how the transfer runs:

- rate (:func:`socket_rate`): a thread moves at most :data:`STREAM_GBPS` (one TCP stream's
  copies, measured), a flow at most the NIC's ``flow_Gbps`` where the network caps one 5-tuple
  (AWS: 5 Gb/s, 10 Gb/s inside a cluster placement group, per the EC2 "instance network
  bandwidth" documentation), and the NIC at its line rate;
- latency (:data:`STACK_LATENCY_US`): each message crosses the sender's and the receiver's TCP
  stack, measured one way over loopback.

NB: the rate is per NIC from one connection per GPU it serves (the proxy thread drives all of a
GPU's channels when there are no helper threads; with helper threads several channels would open
several connections, which this ignores: conservative by up to the channel count). Without helper
threads one proxy thread serves both directions of every channel; each direction is still given
the full stream rate (optimistic by up to 2x when a GPU sends and receives at once). The extra PCIe
crossing of staging through host memory is ignored (PCIe is far faster than the Ethernet links
that take this path). The stack latency sits on the NIC's cables, so it reaches NCCL's latency
model as any stated cable latency does (:func:`ncclshim.graph.extra_latency_us`) and can tip
NCCL's choice at small sizes where the real tuner, which does not know it, would not.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_SOCKETS", "MAX_THREADS", "STREAM_GBPS", "STACK_LATENCY_US", "CLOUD_AUTO", "SocketSpec",
           "socket_streams", "socket_rate"]

MAX_SOCKETS = 64
"""``MAX_SOCKETS`` in net_socket.cc: data sockets per connection."""
MAX_THREADS = 16
"""``MAX_THREADS`` in net_socket.cc: helper threads per connection."""

CLOUD_AUTO: dict[str, tuple[int, int]] = {"aws": (2, 8), "gcp": (4, 1), "other": (0, 1)}
"""``ncclNetSocketGetNsockNthread``'s auto-detection, (threads, sockets per thread) by NIC vendor:
AWS ENA (PCI vendor 0x1d0f), Google gVNIC (0x1ae0), anything else."""

STREAM_GBPS = 2.3
"""One TCP connection streaming 64 KiB tasks, GB/s: benchmarks/bench_socket.py, loopback, max of
5 runs on one vCPU pair of an "Intel(R) Xeon(R) Processor" cloud VM (18 Gb/s). NB: over loopback
the sender's and receiver's copies share the machine; a NIC's offloads (checksum, segmentation)
make a real stream no slower, so this is a floor per thread. Measure your hosts and state it."""

STACK_LATENCY_US = 4.0
"""One-way time of a 1-byte message through the sender's and receiver's TCP stacks, us:
benchmarks/bench_socket.py, loopback ping-pong with TCP_NODELAY (as NCCL sets it), min of 5."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SocketSpec:
    """How NCCL's socket transport runs on a NIC without RDMA (the YAML ``socket:`` of a NIC)."""

    threads: int = CLOUD_AUTO["other"][0]
    """``NCCL_SOCKET_NTHREADS`` (0: the proxy thread sends itself)."""
    socks_per_thread: int = CLOUD_AUTO["other"][1]
    """``NCCL_NSOCKS_PERTHREAD``."""
    stream_bw: float = STREAM_GBPS * 1e9
    """What one thread's TCP stream moves, B/s."""
    flow_bw: float = 0.0
    """The network's cap on one flow (5-tuple), B/s; 0: none."""
    latency: float = STACK_LATENCY_US * 1e-6
    """One message through both TCP stacks, s."""


def socket_streams(threads: int, socks_per_thread: int) -> tuple[int, int]:
    """NCCL's (threads, sockets) of one connection, clamped as ``ncclNetSocketGetNsockNthread``."""
    nt = min(threads, MAX_THREADS)
    ns = socks_per_thread * nt
    if ns > MAX_SOCKETS:
        ns = (MAX_SOCKETS // nt) * nt
    return nt, ns


def socket_rate(line_bw: float, gpus: int, s: SocketSpec) -> float:
    """B/s one NIC without RDMA moves per direction for ``gpus`` GPUs, one connection each.

    A connection moves ``min(max(threads, 1) x stream_bw, max(sockets, 1) x flow_bw)`` (threads
    copy, flows are capped by the network); the NIC carries at most its line rate.

    Example: a 100 Gb/s NIC serving 1 GPU with NCCL's generic default (0 helper threads): the
    proxy's one stream, 2.3 GB/s. On AWS (2 threads x 8 sockets, 10 Gb/s flows): min(4.6, 16 x
    1.25) = 4.6 GB/s.
    """
    nt, ns = socket_streams(s.threads, s.socks_per_thread)
    conn = max(nt, 1) * s.stream_bw
    if s.flow_bw > 0:
        conn = min(conn, max(ns, 1) * s.flow_bw)
    return min(line_bw, max(gpus, 1) * conn)
