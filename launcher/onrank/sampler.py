"""The rank-side sampler behind `sparkstack metrics serve` and `sparkstack top`: one per rank, on ONE
SSH channel that stays open for as long as the control host reads it (never a new SSH session per
scrape). Every `interval` seconds it prints one JSON line, flushed:

  {"t": s since start, "at": unix time, "cpu_s": this process's CPU seconds so far,
   "meminfo": the MemTotal/MemAvailable/MemFree/Buffers/Cached/Swap* lines of /proc/meminfo,
   "engine": {"state", "id", "memory", "inactive_file"} | {"state": "absent"} | {"error"},
   "gpu": {"line": nvidia-smi's newest csv line} | {"error": why not measured},
   "rdma": {hca: {"<counter>": int, ...} from ports/1/counters and ports/1/hw_counters},
   "guard": [the memory guard's events appended to its file since the last line]}

The raw values only: launcher/facts/sample.py parses them on the control host (port_xmit_data is
in 4-byte words there, rates come from two lines). nvidia-smi is started once, with its own loop
(`-lms`), and read when a line is due: one nvidia-smi start a second would cost more CPU than the
whole sampler. The engine container is asked through Docker's unix socket (one inspect), as the
probe asks it (each `docker` CLI start costs ~150 ms of CPU), and its memory read from its cgroup.

Run as `python3 - '<args JSON>'` with this file on stdin (launcher/onrank/__init__.py); args:
interval (s), sysfs_root ("/" on a Spark), container (the engine's name), guard_events (the memory
guard's JSON-lines file, "~" allowed), counters and hw_counters (the names to read), max_s (0:
no end of its own). It ends by itself when nobody reads it: the closed channel makes the next
write fail. Standard library only (Python 3.8).
"""

import json
import os
import select
import socket
import subprocess
import sys
import time

MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SwapTotal", "SwapFree")
GPU_QUERY = "utilization.gpu,clocks.sm,power.draw,temperature.gpu"
DOCKER_SOCKET = "/var/run/docker.sock"


def meminfo(path="/proc/meminfo"):
    with open(path) as f:
        return "".join(line for line in f if line.split(":", 1)[0] in MEMINFO_KEYS)


def docker_get(endpoint, timeout=2.0):
    """(status, body) of one Engine API GET over the unix socket; HTTP/1.0, so unchunked."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(DOCKER_SOCKET)
        s.sendall(("GET %s HTTP/1.0\r\nHost: docker\r\n\r\n" % endpoint).encode())
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        s.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[1].isdigit():
        raise OSError("Docker answered no HTTP: %r" % head[:60])
    return int(status[1]), body


# The container's memory cgroup, by Docker's cgroup driver and the cgroup version: (usage file,
# stat file, the stat's inactive-file key). `docker stats` would take a second per call.
CGROUPS = (("/sys/fs/cgroup/system.slice/docker-{id}.scope", "memory.current", "memory.stat", "inactive_file"),
           ("/sys/fs/cgroup/docker/{id}", "memory.current", "memory.stat", "inactive_file"),
           ("/sys/fs/cgroup/memory/system.slice/docker-{id}.scope", "memory.usage_in_bytes", "memory.stat",
            "total_inactive_file"),
           ("/sys/fs/cgroup/memory/docker/{id}", "memory.usage_in_bytes", "memory.stat", "total_inactive_file"))


def cgroup_memory(container_id):
    """(usage, inactive file pages) from the container's cgroup files; None where none is found."""
    for folder, usage, stat, key in CGROUPS:
        d = folder.format(id=container_id)
        value = read_int(os.path.join(d, usage))
        if value is None:
            continue
        inactive = None
        try:
            with open(os.path.join(d, stat)) as f:
                for line in f:
                    name, _, number = line.partition(" ")
                    if name == key:
                        inactive = int(number)
                        break
        except (OSError, ValueError):
            pass
        return value, inactive
    return None


def engine(container):
    """The engine container's state (Docker's inspect) and memory (its cgroup's usage and
    inactive file pages, which `docker stats` subtracts)."""
    try:
        status, body = docker_get("/containers/%s/json" % container)
        if status == 404:
            return {"state": "absent"}
        if status != 200:
            return {"error": "Docker answered HTTP %d" % status}
        inspect = json.loads(body)
        out = {"state": inspect["State"]["Status"], "id": inspect["Id"][:12]}
        memory = cgroup_memory(inspect["Id"]) if out["state"] == "running" else None
        if memory is not None:
            out["memory"], out["inactive_file"] = memory
        return out
    except (OSError, ValueError, KeyError) as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}


class Gpu:
    """nvidia-smi's own loop, started once; its newest line when one is due."""

    def __init__(self, interval):
        self.proc, self.error, self.line, self.buf = None, None, None, b""
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=" + GPU_QUERY, "--format=csv,noheader,nounits",
                 "-lms", str(max(100, int(interval * 1000)))],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as e:
            self.error = "nvidia-smi: %s" % (e.strerror or e)

    def read(self):
        if self.proc is None:
            return {"error": self.error}
        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                self.error = "nvidia-smi exited with %s: %s" % (self.proc.wait(), self.buf.decode(errors="replace").strip()[-200:])
                self.proc = None
                return {"error": self.error}
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                if line.strip():
                    self.line = line.decode(errors="replace").strip()
        return {"line": self.line} if self.line is not None else {"error": "nvidia-smi printed nothing yet"}

    def stop(self):
        if self.proc is not None:
            self.proc.kill()


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def rdma(root, counters, hw_counters):
    """Every HCA's port-1 counters that exist, by name."""
    base = os.path.join(root, "class", "infiniband")
    try:
        hcas = sorted(os.listdir(base))
    except OSError:
        return {}
    out = {}
    for hca in hcas:
        port = os.path.join(base, hca, "ports", "1")
        values = {}
        for folder, names in (("counters", counters), ("hw_counters", hw_counters)):
            for name in names:
                value = read_int(os.path.join(port, folder, name))
                if value is not None:
                    values[name] = value
        out[hca] = values
    return out


class GuardEvents:
    """The memory guard's events appended since the last read (from the end of the file at the
    start: its history is `status`'s; a file that shrank was replaced, so it is read anew)."""

    def __init__(self, path):
        self.path = os.path.expanduser(path)
        self.offset = self._size()
        self.rest = b""

    def _size(self):
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def read(self):
        size = self._size()
        if size < self.offset:
            self.offset, self.rest = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short by a reset
            if isinstance(event, dict):
                events.append(event)
        return events


def emit(record):
    """One line to the control host; False once nobody reads (the channel is gone)."""
    try:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()
        return True
    except (BrokenPipeError, OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False


def sample(args, gpu, guard, started):
    record = {"t": round(time.monotonic() - started, 3), "at": round(time.time(), 3),
              "engine": engine(args.get("container", "sparkstack-engine")), "gpu": gpu.read(),
              "rdma": rdma(args.get("sysfs_root") or "/sys", args.get("counters", ()), args.get("hw_counters", ())),
              "guard": guard.read()}
    try:
        record["meminfo"] = meminfo(args.get("meminfo", "/proc/meminfo"))
    except OSError as e:
        record["meminfo"] = {"error": "%s: %s" % (type(e).__name__, e)}
    times = os.times()
    record["cpu_s"] = round(times.user + times.system + times.children_user + times.children_system, 3)
    return record


def main(args):
    interval = float(args.get("interval", 1.0))
    root = args.get("sysfs_root") or "/"
    args["sysfs_root"] = root if os.path.isdir(os.path.join(root, "class")) else os.path.join(root, "sys")
    gpu, guard, started = Gpu(interval), GuardEvents(args.get("guard_events", "/nonexistent")), time.monotonic()
    due = started
    try:
        while not args.get("max_s") or time.monotonic() - started < args["max_s"]:
            if not emit(sample(args, gpu, guard, started)):
                return 0
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))
    finally:
        gpu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
