#!/usr/bin/env python3
"""SANDBOX STAND-IN for what torch.distributed, NCCL and Gloo do when a multi-node engine starts.
This is NOT NCCL: no collective runs. It opens the connections the real stack opens, over the
sandbox's real interfaces and veth cables, so an environment that would not initialise on real
Sparks does not initialise here either. Standard library only; installed beside the stand-in
engines (`vllm`, `tensorfold`) in the sandbox's serving image.

`form_cluster` does, on every rank, in the real stack's order:

1. rendezvous: node rank 0 hosts a store on `master_port` (torch's TCPStore listens on every
   address); the others connect to `master_addr:master_port` (a name or address every rank must
   reach) and post their endpoints;
2. NCCL bootstrap: each rank listens on the address of the interface `NCCL_SOCKET_IFNAME`
   selects (NCCL's own rules: prefix list, `=` exact, `^` exclude; unset: the first interface
   that is not `lo` or `docker*`); every rank connects to rank 0's listener (the root) and to the
   next rank's (bootstrap ring);
3. Gloo: a TCP full mesh between the addresses of `GLOO_SOCKET_IFNAME`;
4. vLLM's message queue: every rank connects to `VLLM_HOST_IP` of rank 0, which must be an
   address of rank 0 (it binds there);
5. NCCL's RDMA connections: for each HCA of `NCCL_IB_HCA` (prefix/`=`/`^`/`:port` as NCCL
   reads it; unset: every HCA) the GID NCCL would use -- `NCCL_IB_GID_INDEX` when set, else the
   HCA's IPv4-mapped RoCE v2 entry, else (no IPv4 on it) entry 0, link-local RoCE v1 -- read from
   the rank's sysfs (fixtures: `$SANDBOX_SYSFS_ROOT`, default /sandbox/sysfs). A GID that is not
   an IPv4 RoCE v2 entry fails as `ibv_modify_qp` does (22). Peers: the ring neighbours with
   `NCCL_ALGO=Ring`, every pair otherwise (trees and PAT connect non-neighbours). A pair connects
   through an HCA of each side whose GID addresses share a link: a TCP connection from the local
   GID's IPv4 address to the peer's, i.e. over the cable, with the fabric subnet fenced in each
   rank. No usable HCA at all: `NCCL_NET=IB` fails; otherwise NCCL falls back to sockets and the
   data connections use the bootstrap addresses.

Every failure is reported to the store, and every rank returns the first one (the real stack
aborts or hangs on all ranks when one connection fails) with the real stack's words and the pair.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

CONNECT_TIMEOUT_S = 3.0
ROCE_V2 = "RoCE v2"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
SIOCGIFADDR = 0x8915


# ---------------------------------------------------------------- this rank's interfaces

def ipv4_of(ifname: str) -> str | None:
    """The interface's (first) IPv4 address, as `ip addr` shows it; None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def nccl_ifname_match(spec: str | None, names: list[str]) -> list[str]:
    """NCCL_SOCKET_IFNAME as NCCL reads it: `^` excludes, `=` matches exactly, else prefixes;
    unset: every interface but lo and docker*."""
    if not spec:
        return [n for n in names if n != "lo" and not n.startswith("docker")]
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    wanted = [w for w in spec.lstrip("=").split(",") if w]

    def hit(name: str) -> bool:
        return any(name == w if exact else name.startswith(w) for w in wanted)

    return [n for n in names if hit(n) != exclude]


def socket_address(env: Mapping[str, str], names: list[str] | None = None) -> tuple[str | None, str]:
    """NCCL's bootstrap address: the first selected interface that has an IPv4 address."""
    names = interfaces() if names is None else names
    spec = env.get("NCCL_SOCKET_IFNAME")
    for name in nccl_ifname_match(spec, names):
        ip = ipv4_of(name)
        if ip and (spec or not ip.startswith("127.")):
            return ip, name
    return None, ""


# ---------------------------------------------------------------- HCAs and GIDs (sysfs)

def sysfs_root() -> Path:
    return Path(os.environ.get("SANDBOX_SYSFS_ROOT", "/sandbox/sysfs"))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def gid_entry(hca_dir: Path, index: int) -> tuple[str, str]:
    """(gid, type) of entry `index` of port 1; a missing type reads as '' (EINVAL on a real box)."""
    port = hca_dir / "ports" / "1"
    return _read(port / "gids" / str(index)) or ZERO_GID, _read(port / "gid_attrs" / "types" / str(index))


def ipv4_of_gid(gid: str) -> str | None:
    parts = gid.split(":")
    if len(parts) != 8 or parts[:6] != ["0000"] * 5 + ["ffff"]:
        return None
    raw = bytes.fromhex(parts[6] + parts[7])
    return socket.inet_ntoa(raw)


def nccl_gid_index(hca_dir: Path, env: Mapping[str, str]) -> int:
    """The GID index NCCL uses on this HCA: the pinned one, else the IPv4 RoCE v2 entry, else 0."""
    pinned = env.get("NCCL_IB_GID_INDEX")
    if pinned not in (None, ""):
        return int(pinned)
    gids = hca_dir / "ports" / "1" / "gids"
    count = len(list(gids.iterdir())) if gids.is_dir() else 0
    for i in range(count):
        gid, kind = gid_entry(hca_dir, i)
        if kind == ROCE_V2 and ipv4_of_gid(gid):
            return i
    return 0


def selected_hcas(spec: str | None, names: list[str]) -> list[str]:
    """NCCL_IB_HCA as NCCL reads it (port suffixes ignored: a Spark's HCAs have port 1 only)."""
    if not spec:
        return sorted(names)
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    wanted = [w.split(":")[0] for w in spec.lstrip("=").split(",") if w]
    hit = (lambda n: n in wanted) if exact else (lambda n: any(n.startswith(w) for w in wanted))
    return [n for n in sorted(names) if hit(n) != exclude]


def rdma_endpoints(env: Mapping[str, str]) -> tuple[list[dict], list[str]]:
    """([{hca, index, gid, type, ip}] of the ACTIVE HCAs NCCL would use, [problems])."""
    root = sysfs_root() / "class" / "infiniband"
    names = [p.name for p in root.iterdir()] if root.is_dir() else []
    found, problems = [], []
    for hca in selected_hcas(env.get("NCCL_IB_HCA"), names):
        hca_dir = root / hca
        if not _read(hca_dir / "ports" / "1" / "state").endswith("ACTIVE"):
            continue  # NCCL skips a port that is down
        index = nccl_gid_index(hca_dir, env)
        gid, kind = gid_entry(hca_dir, index)
        ip = ipv4_of_gid(gid)
        if kind != ROCE_V2 or ip is None:
            what = ("an empty entry" if gid == ZERO_GID else
                    f"{gid} {kind or 'no type'}, not an IPv4 RoCE v2 entry")
            problems.append(f"NET/IB : {hca}:1 GID index {index} is {what}: "
                            f"ibv_modify_qp failed with 22 Invalid argument")
            continue
        found.append({"hca": hca, "index": index, "gid": gid, "type": kind, "ip": ip})
    return found, problems


# ---------------------------------------------------------------- listeners and connections

class Listener:
    """A TCP listener that accepts and holds connections until closed (one per endpoint)."""

    def __init__(self, ip: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, 0))
        self.sock.listen(64)
        self.ip, self.port = ip, self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        try:  # wakes the accept() above; a bare close() would leave the port listening
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def reach(ip: str, port: int, source: str | None = None) -> str | None:
    """None when a TCP connection opens, else the OS's reason."""
    try:
        with socket.create_connection((ip, port), timeout=CONNECT_TIMEOUT_S,
                                      source_address=(source, 0) if source else None):
            return None
    except socket.timeout:
        return "Connection timed out"
    except OSError as e:
        return e.strerror or str(e)


def any_reaches(tried: list[tuple[str, str, int]]) -> bool:
    """Whether any (source, ip, port) connects, all tried at once: NCCL opens its HCA pairs in
    parallel too, and a pair across two ring links waits out CONNECT_TIMEOUT_S before failing."""
    answers: queue.Queue = queue.Queue()
    for src, ip, port in tried:
        threading.Thread(target=lambda a=(ip, port, src): answers.put(reach(*a)), daemon=True).start()
    for _ in tried:
        if answers.get() is None:
            return True
    return False


# ---------------------------------------------------------------- the store (rendezvous)

def _send(conn: socket.socket, obj) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")


def _recv(reader) -> dict:
    line = reader.readline()
    if not line:
        raise ConnectionError("the store closed the connection")
    return json.loads(line)


class Store:
    """Node rank 0's store: collects every rank's endpoints, hands out the table, then collects
    every rank's verdict and hands out the list of problems (a barrier, like NCCL's init)."""

    def __init__(self, port: int, nnodes: int):
        self.nnodes = nnodes
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", port))  # torch's TCPStore listens on every address
        self.sock.listen(64)
        self.clients: dict[int, tuple[socket.socket, object]] = {}

    def gather(self, deadline: float, stop: threading.Event) -> int:
        """Waits for the other ranks to post their endpoints; returns how many joined."""
        self.sock.settimeout(0.2)
        while len(self.clients) < self.nnodes - 1 and time.monotonic() < deadline and not stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            conn.settimeout(None)
            reader = conn.makefile("r")
            try:
                hello = _recv(reader)
            except (ConnectionError, ValueError, OSError):
                conn.close()
                continue
            self.clients[int(hello["rank"])] = (conn, reader, hello["endpoints"])
        return len(self.clients) + 1

    def exchange(self, table: dict, mine: list[str]) -> dict[int, list[str]]:
        """Sends the table to every client, reads each one's problems: {rank: problems}."""
        out = {0: mine}
        for conn, _, _ in self.clients.values():
            _send(conn, {"table": table})
        for rank, (conn, reader, _) in sorted(self.clients.items()):
            try:
                out[rank] = _recv(reader)["problems"]
            except (ConnectionError, ValueError, OSError, KeyError):
                out[rank] = ["went away during the check"]
        return out

    def close(self) -> None:
        for conn, _, _ in self.clients.values():
            conn.close()
        self.sock.close()


# ---------------------------------------------------------------- real NCCL's words
# Recorded with NCCL 2.28.9 and torch 2.11 on a real GPU (tests/fixtures/nccl/messages.json, made
# by scripts/record_nccl_messages.py); tests/test_standin_dist.py compares these with the recording.
NCCL_VERSION = "2.28.9"
NO_NET_PLUGIN = "Failed to initialize any NET plugin"  # NCCL_NET=IB, no usable RDMA device
NO_SOCKET_INTERFACE = "Bootstrap : no socket interface found"  # NCCL_SOCKET_IFNAME matches nothing
# Where torch raises each (its C10D_NCCL_CHECK site), as the message names it.
INVALID_USAGE_AT = {NO_NET_PLUGIN: "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93",
                    NO_SOCKET_INTERFACE: "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3135"}


def invalid_usage(last_error: str) -> str:
    """torch.distributed's error for an NCCL init that ends in ncclInvalidUsage, as raised."""
    return (f"torch.distributed.DistBackendError: NCCL error in: {INVALID_USAGE_AT[last_error]}, "
            f"invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version {NCCL_VERSION}\n"
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
            f"Last error:\n{last_error}")


def as_pynccl(message: str | None) -> str | None:
    """The same failure as vLLM's engine meets it: vLLM builds its own NCCL communicator through
    ctypes (vllm/distributed/device_communicators/pynccl_wrapper.py, NCCL_CHECK) before torch's
    process group runs a collective, and raises ncclGetErrorString's words plus NCCL's last error."""
    for last_error in INVALID_USAGE_AT:
        if message and message == invalid_usage(last_error):
            return ("RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)\n"
                    f"Last error:\n{last_error}")
    return message


# ---------------------------------------------------------------- the checks

def endpoints(env: Mapping[str, str], node_rank: int) -> tuple[dict, list[Listener], list[str]]:
    """This rank's listeners (bootstrap, gloo, message queue, one per usable HCA) and problems."""
    problems, listeners, ep = [], [], {"rank": node_rank, "rdma": []}
    boot_ip, boot_if = socket_address(env)
    if boot_ip is None:
        problems.append("NCCL WARN " + NO_SOCKET_INTERFACE)  # NCCL names no value (recorded)
    gloo_if = env.get("GLOO_SOCKET_IFNAME")
    gloo_ip = ipv4_of(gloo_if) if gloo_if else _hostname_ip()
    if gloo_ip is None:
        problems.append("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/"
                        f"device.cc:83] ifa != nullptr. Unable to find address for: {gloo_if}")
    host_ip = env.get("VLLM_HOST_IP") or gloo_ip or boot_ip
    for kind, ip in (("bootstrap", boot_ip), ("gloo", gloo_ip), ("mq", host_ip)):
        if not ip:
            continue
        try:
            listener = Listener(ip)
        except OSError as e:
            problems.append(f"{kind}: cannot bind {ip} ({e.strerror}): "
                            + ("zmq.error.ZMQError: Cannot assign requested address "
                               f"(VLLM_HOST_IP={ip} is not an address of this rank)"
                               if kind == "mq" else "not an address of this rank"))
            continue
        listeners.append(listener)
        ep[kind] = [ip, listener.port]
    found, rdma_problems = rdma_endpoints(env)
    problems += rdma_problems
    for hca in found:
        try:
            listener = Listener(hca["ip"])
        except OSError as e:
            problems.append(f"NET/IB : {hca['hca']} GID {hca['ip']}: {e.strerror}")
            continue
        listeners.append(listener)
        ep["rdma"].append({**hca, "port": listener.port})
    ep["net"] = env.get("NCCL_NET", "")
    return ep, listeners, problems


def _hostname_ip() -> str | None:
    """Gloo without GLOO_SOCKET_IFNAME: the address the host name resolves to."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def ring_only(env: Mapping[str, str]) -> bool:
    algos = [a.strip().lower() for a in env.get("NCCL_ALGO", "").split(",") if a.strip()]
    return algos == ["ring"]


def rdma_peers(rank: int, n: int, env: Mapping[str, str]) -> list[int]:
    if ring_only(env):
        return sorted({(rank - 1) % n, (rank + 1) % n} - {rank})
    return [p for p in range(n) if p != rank]


def check_all(me: dict, table: dict[int, dict], env: Mapping[str, str]) -> list[str]:
    """The connections this rank makes, given every rank's endpoints; the problems found."""
    rank, n = me["rank"], len(table)
    problems = []

    def fail(kind: str, peer: int, ip: str, port: int, why: str) -> None:
        problems.append(f"{kind} (rank {rank} -> rank {peer}): connect to {ip}<{port}> failed : {why}")

    root = table[0].get("bootstrap")
    nxt = table[(rank + 1) % n].get("bootstrap")
    for peer, ep in ((0, root), ((rank + 1) % n, nxt)):
        if ep and peer != rank and (why := reach(*ep)):
            fail("NCCL WARN Bootstrap", peer, ep[0], ep[1], why)
    for peer, other in table.items():
        ep = other.get("gloo")
        if peer != rank and ep and (why := reach(*ep)):
            fail("Gloo connectFullMesh", peer, ep[0], ep[1], why)
    mq = table[0].get("mq")
    if rank != 0 and mq and (why := reach(*mq)):
        fail("vLLM message queue (VLLM_HOST_IP of rank 0)", 0, mq[0], mq[1], why)
    problems += data_connections(me, table, env)
    return problems


def data_connections(me: dict, table: dict[int, dict], env: Mapping[str, str]) -> list[str]:
    rank, n = me["rank"], len(table)
    if not me["rdma"]:
        if env.get("NCCL_NET", "").upper() == "IB":
            return ["NCCL WARN " + NO_NET_PLUGIN]  # NCCL_NET=IB: no fallback to sockets
        return []  # NCCL's socket transport; the bootstrap connections already cover its routes
    tree = "" if ring_only(env) else " (ncclTransportTreeConnect: NCCL_ALGO unset builds trees too)"
    problems = []
    for peer in rdma_peers(rank, n, env):
        theirs = table[peer].get("rdma") or []
        tried = [(mine["ip"], ep["ip"], ep["port"]) for mine in me["rdma"] for ep in theirs]
        if not any_reaches(tried):
            where = ", ".join(f"{m['hca']} {m['ip']}" for m in me["rdma"])
            there = ", ".join(f"{e['hca']} {e['ip']}" for e in theirs) or "no usable HCA"
            problems.append(f"NCCL WARN NET/IB : Got completion from peer with status="
                            f"IBV_WC_RETRY_EXC_ERR(12): rank {rank} ({where}) cannot reach rank "
                            f"{peer} ({there}) over RDMA{tree}")
    return problems


# ---------------------------------------------------------------- the whole start

def form_cluster(*, node_rank: int, nnodes: int, master_addr: str, master_port: int,
                 env: Mapping[str, str], timeout_s: float, stop: threading.Event,
                 log: Callable[[str], None]) -> str | None:
    """What torch.distributed / NCCL / Gloo do at start across `nnodes` ranks, over the real
    network: returns None when every connection the real stack makes succeeded, else the real
    stack's error message naming the pair. nnodes == 1 returns None at once."""
    if nnodes <= 1:
        return None
    deadline = time.monotonic() + timeout_s
    me, listeners, problems = endpoints(env, node_rank)
    try:
        if node_rank == 0:
            return _as_root(me, problems, nnodes, master_port, env, deadline, stop, log)
        return _as_member(me, problems, master_addr, master_port, env, deadline, stop, log)
    finally:
        for listener in listeners:
            listener.close()


def _verdict(problems: dict[int, list[str]], rank: int) -> str | None:
    """This rank's first problem (else the first rank's with one), naming the rank, and a count."""
    flat = [(r, p) for r in sorted(problems) for p in problems[r]]
    if not flat:
        return None
    # NCCL's bootstrap ring forms only once the root has heard from every rank: while a rank cannot
    # reach the root, no rank gets as far as its ring or data connections, so that failure is the one
    rooted = [(r, p) for r, p in flat if p.startswith("NCCL WARN Bootstrap") and "-> rank 0)" in p]
    first = next(((r, p) for r, p in rooted or flat if r == rank), (rooted or flat)[0])
    if first[0] == rank and first[1].startswith("NCCL WARN "):
        last_error = first[1][len("NCCL WARN "):]
        if last_error in INVALID_USAGE_AT:  # fails in this rank's own NCCL init: torch's own words
            return invalid_usage(last_error)
    more = f"\n({len(flat) - 1} more problem(s) on ranks {sorted({r for r, _ in flat})})" \
        if len(flat) > 1 else ""
    return ("torch.distributed.DistBackendError: NCCL error: unhandled system error "
            f"(run with NCCL_DEBUG=INFO for details). Last error:\nrank {first[0]}: {first[1]}{more}")


def _as_root(me, problems, nnodes, port, env, deadline, stop, log) -> str | None:
    started = time.monotonic()
    try:
        store = Store(port, nnodes)
    except OSError as e:
        return ("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                f"local network address. port: {port}, useIpv6: false, message: {e.strerror}")
    try:
        joined = store.gather(deadline, stop)
        if joined < nnodes:
            return (f"torch.distributed.DistStoreError: Timed out after "
                    f"{time.monotonic() - started:.0f} seconds waiting for clients. "
                    f"{joined}/{nnodes} clients joined.")
        table = {0: me, **{r: c[2] for r, c in store.clients.items()}}
        log(f"rendezvous: {nnodes} nodes joined; checking NCCL bootstrap, Gloo and RDMA peers")
        problems = store.exchange(table, problems + check_all(me, table, env))
        for rank, (conn, _, _) in store.clients.items():
            try:
                _send(conn, {"error": _verdict(problems, rank)})
            except OSError:
                pass
        return _verdict(problems, 0)
    finally:
        store.close()


def _as_member(me, problems, master_addr, port, env, deadline, stop, log) -> str | None:
    conn, started = None, time.monotonic()
    while conn is None:
        try:
            conn = socket.create_connection((master_addr, port), timeout=CONNECT_TIMEOUT_S)
            if conn.getsockname() == conn.getpeername():  # TCP self-connect to a free port
                conn.close()
                conn = None
                raise ConnectionRefusedError
        except OSError:
            if time.monotonic() > deadline or stop.is_set():
                ms = round(time.monotonic() - started, 1) * 1000
                return ("torch.distributed.DistNetworkError: The client socket has timed out after "
                        f"{ms:.0f}ms while trying to connect to ({master_addr}, {port}).")
            time.sleep(0.3)
    with conn:
        conn.settimeout(max(1.0, deadline - time.monotonic()) + 30)
        reader = conn.makefile("r")
        try:
            _send(conn, {"rank": me["rank"], "endpoints": me})
            table = {int(k): v for k, v in _recv(reader)["table"].items()}
            _send(conn, {"problems": problems + check_all(me, table, env)})
            verdict = _recv(reader)
        except (ConnectionError, ValueError, OSError, KeyError) as e:
            return f"torch.distributed.DistNetworkError: lost the store at ({master_addr}, {port}): {e}"
    return verdict.get("error")
