#!/usr/bin/env python3
"""SANDBOX STAND-IN for the `ray` CLI, as a vLLM image on Ray uses it. This is NOT Ray: no
GCS, no object store, no scheduling. It is installed as `/usr/local/bin/ray` in the sandbox's
`sandbox-vllm` image so the kit's `multinode: ray` can be exercised end to end. Standard library
only.

What it mimics:
- `ray start --head --port=P --node-ip-address=IP`: starts the "head" (a daemon holding the
  node list, listening on P) and returns, like Ray's head start;
- `ray start --address=HOST:P --node-ip-address=IP --block`: joins the head (retrying while the
  head is not up yet, up to SANDBOX_RAY_JOIN_S, default 60) and blocks; exits 1 when the head goes
  away, 0 on SIGTERM -- a worker's container ends with its head;
- `ray --version`.
The stand-in `vllm serve --distributed-executor-backend ray` asks the head (RAY_ADDRESS, else
127.0.0.1:6379) how many nodes joined and waits for tensor x pipeline parallel of them, as
vLLM waits for its placement group.

Each `ray start` writes a record (SANDBOX_RAY_RECORD, default /var/log/sandbox-vllm/ray.json):
{"argv", "env", "role": "head"|"worker", "address"} for tests to assert on.
Protocol (line-based TCP): `JOIN <ip>` keeps a connection open as one node; `NODES` answers the
number of live nodes, the head included; `FORM <master_addr> <master_port>` (from the stand-in
vLLM on the head, once its placement group is ready) hands each joined worker a node rank -- by
node IP, as vLLM orders its Ray workers after the driver's node -- and the rendezvous: the worker then opens the connections NCCL and Gloo would open from
its node (standin_dist.form_cluster, with the worker container's environment), and exits 1 with
the real stack's message when one fails -- as a Ray worker of vLLM would die.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import standin_dist  # noqa: E402  (installed beside this file)

VERSION = "2.49.0"
DEFAULT_PORT = 6379
DEFAULT_RECORD = "/var/log/sandbox-vllm/ray.json"


def log(msg: str) -> None:
    print(f"[ray stand-in] {msg}", file=sys.stderr, flush=True)


def options(argv: list[str]) -> dict:
    """`--key=value`, `--key value` and bare `--flag` into a dict."""
    out: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            out[key.replace("-", "_")] = value if (eq or value) else True
        i += 1
    return out


def record(argv: list[str], role: str, address: str) -> None:
    path = os.environ.get("SANDBOX_RAY_RECORD", DEFAULT_RECORD)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"argv": argv, "env": dict(os.environ), "role": role, "address": address}, f, indent=2)


# ---------------------------------------------------------------- the head

def head_server(port: int, own_ip: str) -> None:
    """Runs in the daemon: the node list is the set of open JOIN connections, plus the head."""
    nodes: dict[int, str] = {}
    workers: dict[int, tuple[str, socket.socket]] = {}
    lock = threading.Lock()
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)

    def client(conn: socket.socket) -> None:
        with conn:
            line = conn.makefile("r").readline().strip()
            if line == "NODES":
                with lock:
                    conn.sendall(f"{len(nodes) + 1} {own_ip} {' '.join(nodes.values())}\n".encode())
                return
            if line.startswith("FORM "):
                _, master, port = line.split()
                with lock:  # vLLM ranks Ray workers driver first, then by node IP
                    members = [conn for _, conn in sorted(workers.values(), key=lambda w: _ip_key(w[0]))]
                for rank, member in enumerate(members, start=1):
                    form = {"node_rank": rank, "nnodes": len(members) + 1,
                            "master_addr": master, "master_port": int(port)}
                    member.sendall(f"FORM {json.dumps(form)}\n".encode())
                conn.sendall(b"OK\n")
                return
            if line.startswith("JOIN "):
                with lock:
                    nodes[id(conn)] = line[5:]
                    workers[id(conn)] = (line[5:], conn)
                conn.sendall(b"OK\n")
                try:
                    while conn.recv(1):  # until the worker goes away
                        pass
                except OSError:
                    pass
                with lock:
                    nodes.pop(id(conn), None)
                    workers.pop(id(conn), None)

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=client, args=(conn,), daemon=True).start()


def _ip_key(ip: str) -> tuple:
    try:
        return (0, int(ipaddress.ip_address(ip)))
    except ValueError:
        return (1, ip)


def start_head(port: int, own_ip: str) -> int:
    if os.fork() == 0:  # daemon: a new session, output to a log, parent returns at once
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        pidfile = os.environ.get("SANDBOX_RAY_HEAD_PIDFILE")  # for tests outside a container
        if pidfile:
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
        logf = open(os.environ.get("SANDBOX_RAY_HEAD_LOG", "/tmp/ray-head.log"), "a")
        os.dup2(logf.fileno(), 1)
        os.dup2(logf.fileno(), 2)
        head_server(port, own_ip)
        os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            log(f"Ray runtime started. head at {own_ip}:{port}")
            return 0
        except OSError:
            time.sleep(0.05)
    log(f"the head did not open port {port}")
    return 1


# ---------------------------------------------------------------- a worker

def join(address: str, own_ip: str) -> int:
    host, _, port = address.rpartition(":")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deadline = time.monotonic() + float(os.environ.get("SANDBOX_RAY_JOIN_S", "60"))
    while True:
        try:
            conn = socket.create_connection((host, int(port or DEFAULT_PORT)), timeout=2)
            break
        except OSError as e:
            if time.monotonic() > deadline or stop.is_set():
                log(f"cannot reach the Ray head at {address}: {e}")
                return 1
            time.sleep(0.5)
    conn.sendall(f"JOIN {own_ip}\n".encode())
    conn.settimeout(None)
    log(f"Ray runtime started. joined {address} as {own_ip}; blocking")
    gone, failed = threading.Event(), []

    def watch() -> None:
        try:
            for line in conn.makefile("r"):
                if line.startswith("FORM "):
                    threading.Thread(target=form, args=(json.loads(line[5:]),), daemon=True).start()
        except (OSError, ValueError):
            pass
        gone.set()

    def form(spec: dict) -> None:
        """This node's vLLM worker joins the collectives the driver on the head sets up."""
        problem = standin_dist.form_cluster(**spec, env=os.environ, timeout_s=60, stop=stop, log=log)
        if problem:
            failed.append(problem)
            log(problem)
            gone.set()
        else:
            log(f"node rank {spec['node_rank']} of {spec['nnodes']}: NCCL and Gloo connected")

    threading.Thread(target=watch, daemon=True).start()
    while not stop.is_set():
        if gone.wait(0.2):
            if not failed:
                log("the Ray head went away")
            return 1
    return 0


def form(address: str, master: str, port: int) -> bool:
    """Asks the head to start the collectives on every joined worker."""
    host, _, head_port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(head_port or DEFAULT_PORT)), timeout=5) as c:
            c.sendall(f"FORM {master} {port}\n".encode())
            return c.makefile("r").readline().strip() == "OK"
    except (OSError, ValueError):
        return False


def nodes(address: str, timeout: float = 2.0) -> int:
    """How many nodes the head counts (the head included); 0 when it does not answer."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port or DEFAULT_PORT)), timeout=timeout) as c:
            c.sendall(b"NODES\n")
            return int(c.makefile("r").readline().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(f"ray, version {VERSION} (sandbox stand-in, not Ray)")
        return 0
    if argv[:1] != ["start"]:
        print("usage: ray start --head | --address=HOST:PORT [--block]  (sandbox stand-in)", file=sys.stderr)
        return 2
    opts = options(argv[1:])
    own_ip = str(opts.get("node_ip_address") or socket.gethostname())
    if opts.get("head"):
        port = int(opts.get("port") or DEFAULT_PORT)
        record(argv, "head", f"{own_ip}:{port}")
        return start_head(port, own_ip)
    address = str(opts.get("address") or "")
    if not address:
        print("ray start: give --head or --address", file=sys.stderr)
        return 2
    record(argv, "worker", address)
    return join(address, own_ip)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
