"""The probe: ONE command per rank that gathers everything `check`, `prep` and `plan` need.

This file is sent as it is, on stdin, and run on the rank as

    python3 - '<args as one JSON object>'

so it must stay a self-contained script: Python 3.8+ standard library only (DGX OS / Ubuntu and
the sandbox's Debian have python3, nothing else is promised), no imports from `launcher`. It
prints ONE JSON object of RAW outputs -- file contents, command stdout and exit codes -- and
leaves every interpretation to the pure parsers in `launcher/facts/` (one module per subject),
where they can be tested.
A missing source (no docker, no nvidia-smi, no /sys/class/infiniband) is recorded, never fatal:
the probe itself exits 0 unless its arguments are unreadable.

Arguments (all optional; a bare path instead of JSON is taken as `sysfs_root`):
  sysfs_root     "/sys" on a real Spark; the sandbox points at a fixture tree. Accepts the
                 root that holds `class/` ("/" is read as "/sys").
  ip_addr_file   `ip -j addr` output in a file, overlaid on the real command's output (the
                 sandbox's fabric netdevs exist only as fixtures).
  mount_table    a mountinfo file `findmnt -F` reads for a mount at the model dir itself, when
                 it exists and names one (the sandbox's checkpoint is a bind mount standing in
                 for NFS: its fixture names the file server, as the real mount's `addr=` does);
                 any other model dir is looked up in the real mount table.
  model_dir      the checkpoint directory to fingerprint (in a child process: a dead NFS
                 server hangs its reader, and the probe reports it instead of hanging too).
  sysctls        names to read besides DEFAULT_SYSCTLS.
  disk_paths     paths whose free space to report besides "/", the model dir, Docker's root.
  timeout_s      per command (default 5): a hung daemon costs a finding, not the probe.
  nccl_lib       a host NCCL library (cluster.yaml nccl.host_lib) to find and read the version of.
  cdi_specs      the container runtime's NVIDIA CDI specs to read (default CDI_SPECS).
"""

import hashlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

PROBE_VERSION = 1
DEFAULT_SYSCTLS = ("vm.swappiness", "vm.compaction_proactiveness", "net.ipv4.ip_forward")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# One inspect line per image; full `docker image inspect` JSON carries every layer digest.
INSPECT_FORMAT = ('{"Id":{{json .Id}},"RepoTags":{{json .RepoTags}},'
                  '"Labels":{{json .Config.Labels}},"Size":{{json .Size}}}')
NOT_ANSWERING = "not answering"
# where `nvidia-ctk cdi generate` writes (by hand) and nvidia-cdi-refresh.service writes (toolkit >= 1.18)
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")
CDI_MAX_BYTES = 1 << 20  # a generated spec is ~20-40 kB
GPU_CLOCK_FILE = "/run/sparkstack/gpu-clock"  # what prep / the Ansible unit locked since the boot  # the model dir's error when its listing hangs (check looks for it)


def read(path):
    """A small file's text; None when it does not exist; {"error": ...} when it cannot be read
    (sysfs answers EINVAL for the speed of a down link and the type of an unused GID)."""
    try:
        with open(path, "r", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        return {"error": "%s: %s" % (type(e).__name__, e.strerror or e)}


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def run(argv, timeout):
    """A command's exit code and output; {"missing": true} when the program is not installed."""
    if shutil.which(argv[0]) is None:
        return {"argv": argv, "missing": True}
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"argv": argv, "error": "timed out after %ss" % timeout}
    except OSError as e:
        return {"argv": argv, "error": str(e)}
    return {"argv": argv, "rc": p.returncode,
            "stdout": p.stdout.decode(errors="replace"), "stderr": p.stderr.decode(errors="replace")[-2000:]}


class Background(threading.Thread):
    """fn(*args) on a thread; result() waits for it (concurrent.futures costs ~30 ms of imports)."""

    def __init__(self, fn, *args):
        threading.Thread.__init__(self, daemon=True)
        self.fn, self.args, self.value = fn, args, None
        self.start()

    def run(self):
        self.value = self.fn(*self.args)

    def result(self):
        self.join()
        return self.value


class Forked(object):
    """fn(*args) in a child process whose JSON answer comes back through a pipe. result() gives
    None when it has not answered `timeout` seconds after its start: the child is then killed
    and not waited for, since a read from a dead NFS server can hold it (in D state) for good.
    Start it before any thread: fork copies only the calling thread."""

    def __init__(self, timeout, fn, *args):
        self.deadline = time.time() + timeout
        self.pipe, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(write_end, fn, args)
        os.close(write_end)

    def _child(self, write_end, fn, args):
        try:  # off the SSH session's pipes: a child stuck holding them would keep it open
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            data = json.dumps(fn(*args)).encode()
            while data:
                data = data[os.write(write_end, data):]
        finally:
            os._exit(0)

    def result(self):
        chunks = []
        while True:
            left = self.deadline - time.time()
            if left <= 0 or not select.select([self.pipe], [], [], left)[0]:
                os.kill(self.pid, signal.SIGKILL)
                os.close(self.pipe)
                return None
            chunk = os.read(self.pipe, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self.pipe)
        os.waitpid(self.pid, 0)
        return json.loads(b"".join(chunks).decode()) if chunks else None


def docker_socket():
    """The daemon's unix socket when this user can use it; None sends the probe to the CLI
    (a tcp:// or ssh:// DOCKER_HOST, no socket, no permission, no CLI), whose errors say why.
    The CLI must exist either way: `up` starts the engine with `docker run`."""
    if shutil.which("docker") is None:
        return None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return None
    path = host[len("unix://"):]
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    return path if os.access(path, os.R_OK | os.W_OK) else None


def docker_get(path, endpoint, timeout):
    """One Engine API GET over the daemon's unix socket: {"endpoint", "status", "body"} or
    {"endpoint", "error"}. HTTP/1.0 by hand, so the daemon answers unchunked and closes: the
    Engine API answers in milliseconds where each `docker` CLI start costs ~150 ms of CPU, and
    http.client alone would cost the probe ~60 ms of imports."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(("GET %s HTTP/1.0\r\nHost: docker\r\n\r\n" % endpoint).encode())
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as e:
        return {"endpoint": endpoint, "error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    finally:
        s.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[1].isdigit():
        return {"endpoint": endpoint, "error": "not an HTTP answer: %r" % head[:80]}
    return {"endpoint": endpoint, "status": int(status[1]), "body": body.decode(errors="replace")}


DOCKER_API = {"version": "/version", "info": "/info", "images": "/images/json"}
DOCKER_CLI = {
    "docker_version": ["docker", "version", "--format", "{{json .}}"],
    "docker_info": ["docker", "info", "--format", "{{json .}}"],
    "docker_images": ["docker", "images", "--no-trunc", "--format", "{{json .}}"],
}


def docker_root(out):
    """Docker's root dir from whichever answered, API or CLI."""
    api = out.get("docker_api") or {}
    info = api.get("info") or {}
    text = info.get("body") if info.get("status") == 200 else None
    cli = out["commands"].get("docker_info") or {}
    if text is None and cli.get("rc") == 0:
        text = cli.get("stdout")
    try:
        return json.loads(text).get("DockerRootDir") or "/var/lib/docker"
    except (TypeError, ValueError, AttributeError):
        return "/var/lib/docker"


def docker_cli_images(out, timeout):
    """`docker image inspect` of every listed image: labels live only there (CLI path only)."""
    images = out["commands"].get("docker_images") or {}
    ids = []
    for line in (images.get("stdout") or "").splitlines() if images.get("rc") == 0 else []:
        try:
            ident = json.loads(line).get("ID")
        except ValueError:
            continue
        if ident and ident not in ids:
            ids.append(ident)
    if ids:  # one call for all images
        out["commands"]["docker_inspect"] = run(["docker", "image", "inspect", "--format",
                                                 INSPECT_FORMAT] + ids, timeout)


def sysfs_class(root):
    root = root.rstrip("/") or "/"
    if os.path.isdir(os.path.join(root, "class")):
        return os.path.join(root, "class")
    return os.path.join(root, "sys", "class")  # "/" given for a real host


def net_sysfs(cls):
    out = {}
    for name in listdir(os.path.join(cls, "net")) or []:
        d = os.path.join(cls, "net", name)
        if not os.path.isdir(d):  # /sys/class/net/bonding_masters is a file
            continue
        out[name] = {k: read(os.path.join(d, k)) for k in ("operstate", "speed", "mtu", "address")}
    return out


def rdma_port(pdir):
    gids, types, ndevs = {}, {}, {}
    for i in listdir(os.path.join(pdir, "gids")) or []:
        gid = read(os.path.join(pdir, "gids", i))
        gids[i] = gid
        # Types and ndevs of an unused (all-zero) entry read EINVAL: skip them.
        if isinstance(gid, str) and gid.strip() != ZERO_GID:
            types[i] = read(os.path.join(pdir, "gid_attrs", "types", i))
            ndevs[i] = read(os.path.join(pdir, "gid_attrs", "ndevs", i))
    return {"state": read(os.path.join(pdir, "state")),
            "link_layer": read(os.path.join(pdir, "link_layer")),
            "gids": gids, "gid_types": types, "gid_ndevs": ndevs}


def read_head(path, limit):
    """read() of at most `limit` bytes: a runaway file costs a truncated finding, not the probe."""
    try:
        with open(path, "r", errors="replace") as f:
            return f.read(limit)
    except FileNotFoundError:
        return None
    except OSError as e:
        return {"error": "%s: %s" % (type(e).__name__, e.strerror or e)}


def rdma_sysfs(cls):
    base = os.path.join(cls, "infiniband")
    hcas = listdir(base)
    if hcas is None:
        return None  # no RDMA stack (or no ConnectX): the parser says so
    out = {}
    for hca in hcas:
        d = os.path.join(base, hca)
        ports = {p: rdma_port(os.path.join(d, "ports", p)) for p in listdir(os.path.join(d, "ports")) or []}
        out[hca] = {"ports": ports, "netdevs": listdir(os.path.join(d, "device", "net")) or [],
                    "fw_ver": read(os.path.join(d, "fw_ver"))}
    return out


def sha256_file(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except FileNotFoundError:
        return None
    except OSError as e:
        return {"error": e.strerror or str(e)}
    return h.hexdigest()


def checkpoint(model_dir):
    """Hashes of the two small JSON files and the shards' names and sizes -- never their bytes."""
    if not model_dir:
        return None
    try:
        names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    except OSError as e:
        return {"dir": model_dir, "error": "%s: %s" % (type(e).__name__, e.strerror or e)}
    shards = []
    for n in names:
        try:
            shards.append([n, os.stat(os.path.join(model_dir, n)).st_size])
        except OSError:
            shards.append([n, None])
    return {"dir": model_dir,
            "config_sha256": sha256_file(os.path.join(model_dir, "config.json")),
            "index_sha256": sha256_file(os.path.join(model_dir, "model.safetensors.index.json")),
            "shards": shards}


def model_dir_facts(model_dir):
    """What the probe reads under the model dir, all of it possibly on NFS."""
    return {"checkpoint": checkpoint(model_dir), "disk": disk([model_dir])}


def model_dir_bounded(listing, model_dir, timeout):
    """The forked listing's answer, or the model dir's NOT_ANSWERING error."""
    if listing is None:
        return {"checkpoint": None, "disk": {}}
    found = listing.result()
    if found is None:
        return {"checkpoint": {"dir": model_dir, "error": "%s within %gs (reading it hung: a dead "
                               "NFS server?)" % (NOT_ANSWERING, timeout)}, "disk": {}}
    return found


def rlimits():
    out = {}
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("memlock", resource.RLIMIT_MEMLOCK)):
        soft, hard = resource.getrlimit(which)
        inf = resource.RLIM_INFINITY
        out[name] = [-1 if soft == inf else soft, -1 if hard == inf else hard]
    return out


def dockerd_limits():
    """/proc/<dockerd>/limits: the ceiling a container's --ulimit meets when the daemon cannot
    raise it (no CAP_SYS_RESOURCE), and the limits a container inherits by default."""
    for pid in listdir("/proc") or []:
        if pid.isdigit() and (read("/proc/%s/comm" % pid) or "") == "dockerd\n":
            return read("/proc/%s/limits" % pid)
    return None


def disk(paths):
    out = {}
    for p in paths:
        if not p or p in out:
            continue
        try:
            st = os.statvfs(p)
        except OSError as e:
            out[p] = {"error": e.strerror or str(e)}
            continue
        out[p] = {"avail": st.f_bavail * st.f_frsize, "size": st.f_blocks * st.f_frsize}
    return out


NCCL_MARK = b"NCCL version "


def nccl_version_text(path, block=1 << 22):
    """The "NCCL version 2.30.7+cuda13.0" string NCCL prints at init, read from the library
    itself (a scan: the file is ~250 MB, read once into the page cache); None if absent."""
    carry = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(block)
            data = carry + chunk
            at = data.find(NCCL_MARK)
            while at >= 0:
                end = data.find(b"\0", at)
                if end < 0 and chunk:  # the string runs on into the next block
                    break
                text = data[at:end] if end >= 0 else data[at:]
                if text[len(NCCL_MARK):len(NCCL_MARK) + 1].isdigit():  # not a "%s" format
                    return text[:80].decode("ascii", "replace")
                at = data.find(NCCL_MARK, at + 1)
            if not chunk:
                return None
            carry = data[at:] if at >= 0 else data[-len(NCCL_MARK):]


def nccl_lib(path):
    """The host NCCL library: its real file and size, and the version string in it."""
    if not path:
        return None
    out = {"path": path}
    try:
        out["realpath"] = os.path.realpath(path)
        out["size"] = os.stat(out["realpath"]).st_size
        out["version_text"] = nccl_version_text(out["realpath"])
    except FileNotFoundError:
        return {"path": path, "missing": True}
    except OSError as e:
        out["error"] = "%s: %s" % (type(e).__name__, e.strerror or e)
    return out


def serving_container(sock, asked, timeout):
    """The serving container's whole inspect JSON, so `up` on a serving cluster needs no
    second command: the Engine API's answer (404: none) or, without the socket, the CLI's."""
    name = asked["name"]
    if sock:
        return {"api": docker_get(sock, "/containers/%s/json" % name, timeout)}
    return {"cli": run(["docker", "inspect", "--format", "{{json .}}", name], timeout)}


def watcher_cmdline(asked):
    """The command line of the process whose pid the watcher's pid file holds (None: none
    alive): whether the memory guard already watches the serving container."""
    path = asked.get("watcher_pidfile")
    pid = read(os.path.expandvars(path)) if path else None
    if not isinstance(pid, str) or not pid.strip().isdigit():
        return None
    line = read("/proc/%s/cmdline" % pid.strip())
    return line.replace("\0", " ").strip() if isinstance(line, str) else None


def parse_args(argv):
    if len(argv) < 2 or not argv[1].strip():
        return {}
    text = argv[1]
    if not text.lstrip().startswith("{"):
        return {"sysfs_root": text}
    return json.loads(text)


# A sandbox rank (launcher/sandbox) is a container whose CX7 ports, RDMA sysfs and NFS mount are
# fixtures; this file says where they are, so the kit probes it with no option, as it probes a
# Spark (`init` included). A Spark has no such file: /sys and the real commands are read.
STANDIN_HARDWARE = "/etc/sparkstack-sandbox/hardware.json"
HARDWARE_KEYS = ("sysfs_root", "ip_addr_file", "mount_table")


def declared_hardware(args, path=STANDIN_HARDWARE):
    """`args` with a sandbox rank's declared fixture paths, unless the kit named a sysfs root."""
    if (args.get("sysfs_root") or "/").rstrip("/") not in ("", "/sys"):
        return args
    try:
        with open(path) as f:
            declared = json.load(f)
    except (OSError, ValueError):
        return args
    if not isinstance(declared, dict):
        return args
    out = dict(args)
    out.update((k, declared[k]) for k in HARDWARE_KEYS if isinstance(declared.get(k), str))
    return out


def probe(args):
    args = declared_hardware(args)
    started = time.time()
    timeout = float(args.get("timeout_s", 5))
    model_dir = args.get("model_dir")
    listing = Forked(timeout, model_dir_facts, model_dir) if model_dir else None  # before any thread
    commands = {
        "ip_addr": ["ip", "-j", "addr", "show"],
        "findmnt": ["findmnt", "-J", "-l", "-o", "TARGET,SOURCE,FSTYPE,OPTIONS"],
        "nvidia_smi": ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                       "--format=csv,noheader"],
        # the header carries the CUDA driver API version; the CLOCK section the clocks
        "nvidia_smi_clocks": ["nvidia-smi", "-q", "-d", "CLOCK"],
        "nvidia_ctk": ["nvidia-ctk", "--version"],
    }
    if model_dir:
        table = args.get("mount_table")
        columns = ["-J", "-o", "TARGET,SOURCE,FSTYPE,OPTIONS"]
        commands["findmnt_model"] = ["findmnt", "-T", model_dir, *columns]
        if table and os.path.isfile(table):  # a fixture names a mount at model_dir itself, else the real one
            commands["findmnt_model_fixture"] = ["findmnt", "-F", table, "-M", model_dir, *columns]
    sock = docker_socket()
    if sock is None:
        commands.update(DOCKER_CLI)
    # Commands run side by side: the probe costs the slowest one, not their sum.
    futures = {k: Background(run, argv, timeout) for k, argv in commands.items()}
    api = {k: Background(docker_get, sock, e, timeout) for k, e in DOCKER_API.items()} if sock else {}
    container = Background(serving_container, sock, args["container"], timeout) if args.get("container") else None
    cls = sysfs_class(args.get("sysfs_root") or "/sys")
    nccl = Background(nccl_lib, args.get("nccl_lib"))
    out = {
        "probe_version": PROBE_VERSION,
        "args": args,
        "clock": {"started": started},
        "kernel": os.uname().release,
        "page_size": os.sysconf("SC_PAGE_SIZE"),
        "nvidia_driver_proc": read("/proc/driver/nvidia/version"),
        "cdi_specs": {p: read_head(p, CDI_MAX_BYTES) for p in args.get("cdi_specs", CDI_SPECS)},
        "gpu_clock_file": read(GPU_CLOCK_FILE),
        "hostname": os.uname().nodename,
        "python": sys.version.split()[0],
        "meminfo": read("/proc/meminfo"),
        "sysctls": {n: read("/proc/sys/" + n.replace(".", "/"))
                    for n in list(DEFAULT_SYSCTLS) + [s for s in args.get("sysctls", [])
                                                       if s not in DEFAULT_SYSCTLS]},
        "rlimits": rlimits(),
        "dockerd_limits": dockerd_limits(),
        "docker_daemon_json": read("/etc/docker/daemon.json"),
        "sysfs_net": net_sysfs(cls),
        "sysfs_infiniband": rdma_sysfs(cls),
        "ip_addr_file": read(args["ip_addr_file"]) if args.get("ip_addr_file") else None,
        # the address this SSH session arrived at, and the default route: where the rank is
        # reached when its configured `address` is a host name or a NAT's
        "ssh_connection": os.environ.get("SSH_CONNECTION"),
        "route": read("/proc/net/route"),
    }
    out["commands"] = {k: f.result() for k, f in futures.items()}
    if container is not None:
        out["container"] = dict(container.result(), watcher=watcher_cmdline(args["container"]))
    out["nccl_lib"] = nccl.result()
    out["docker_api"] = dict({k: f.result() for k, f in api.items()}, socket=sock) if sock else None
    if sock is None:
        docker_cli_images(out, timeout)
    root = docker_root(out)
    model = model_dir_bounded(listing, model_dir, timeout)
    out["checkpoint"] = model["checkpoint"]
    out["disk"] = dict(disk(["/", root] + list(args.get("disk_paths", []))), **model["disk"])
    out["disk_docker_root"] = root
    out["clock"]["finished"] = time.time()
    return out


def main(argv):
    try:
        args = parse_args(argv)
    except ValueError as e:
        sys.stdout.write(json.dumps({"probe_version": PROBE_VERSION, "fatal": "bad arguments: %s" % e}))
        return 2
    sys.stdout.write(json.dumps(probe(args), sort_keys=True))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
