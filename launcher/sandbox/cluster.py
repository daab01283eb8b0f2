"""`sparkstack sandbox up | down | status`: four simulated DGX Spark ranks on the local Docker engine.

What `up` makes (everything labelled ``org.sparkstack.sandbox=1``; `down` removes by that label):

- a bridge network ``sparkstack-sandbox`` (172.31.240.0/24 unless $SPARKSTACK_SANDBOX_SUBNET);
- four rank containers ``sparkstack-spark1..4`` (hostname spark1..4, addresses .11-.14; `up --ranks
  N` makes N, up to 32, for scaling measurements). The
  host reaches them directly on port 22: a local bridge's subnet is routed from the host, so no
  ports are published and nothing can collide with a port already taken on the host;
- in each rank: ``sshd`` (key login as ``spark``, who has passwordless sudo and is in the docker
  group, like the user of a real Spark -- so the kit's sudo path is exercised, not bypassed;
  root accepts the same key) and the rank's OWN ``dockerd`` whose image store is the rank's own
  volume ``sparkstack-sparkN-docker`` -- an image on the host or on one rank is absent on the
  others until shipped;
- one named volume per rank for that store;
- the ring's fabric cables: a veth pair per link between two ranks' network namespaces, named as
  the CX7 netdevs, MTU 9000, with the link's /30 addresses (see `links`), so pings on the fabric
  are real.

Why not ``--privileged``: the Docker engine here runs without CAP_SYS_RESOURCE in its bounding
set, so runc cannot grant "all capabilities" and every privileged container fails with
"unable to apply caps: operation not permitted". A rank instead gets every capability the engine
has (``cap_add=ALL, cap_drop=SYS_RESOURCE``), no seccomp/apparmor profile, unmasked /proc
(``systempaths=unconfined``); its init remounts its cgroup v1 controllers writable (they are
bind mounts of the rank's own cgroup subtree) so its dockerd can create child cgroups.
Consequence: the hard limits of this host (nofile 20000, memlock 8 MiB) are the ceiling inside
the ranks; ``docker run --ulimit nofile=1048576`` in a rank fails as it would on a misconfigured
Spark.

The inner dockerd uses **overlay2** (measured: the rank's /var/lib/docker is a named volume, a
plain ext4 directory on the host, and the kernel has overlayfs; ``docker info`` in a rank shows
"Storage Driver: overlay2, Backing Filesystem: extfs"). fuse-overlayfs is what the *host* engine
is configured with and is not needed inside; vfs is the fallback in the rank's init script.

Host side, under the state dir (``$SPARKSTACK_SANDBOX_DIR`` or ``~/.local/state/sparkstack/sandbox``):
``id_ed25519`` (+``.pub``) the client key, ``known_hosts`` with each rank's real host key
(generated here, injected into the rank at start, so the file is right before the first
connection and stays right across `down`/`up`), ``cluster.yaml``, ``fabric-truth.json``,
``ranks/sparkN/{ssh,sysfs}``, ``models/glm53-sandbox`` and ``patches/``.

The bare sandbox (`up --bare`, $SPARKSTACK_SANDBOX_BARE=1) stands BESIDE this one for
`sparkstack init`: containers ``sparkstack-bare-sparkN`` (labelled ``org.sparkstack.sandbox.bare``),
network ``sparkstack-sandbox-bare`` on 172.31.242.0/24 ($SPARKSTACK_SANDBOX_BARE_SUBNET), state dir
``~/.local/state/sparkstack/sandbox-bare`` ($SPARKSTACK_SANDBOX_BARE_DIR), its own switch
namespace; `down`/`status` of one never touch the other. Its ranks are Sparks before `init`: the
same cables (veths with the fixtures' MACs, IPv6 link-local on) without IPv4 addresses and at
a fresh port's MTU (1500), the fixtures' GID tables link-local only, Debian's real netplan.io (its
own image, debian_image.RANK_FS_BARE: `netplan generate` checks the file init writes), no authorized key, a password login for ``spark`` (sshd's
PasswordAuthentication on for this sandbox only; the password in ``<state dir>/password``), no
cluster.yaml. Every `up --bare` puts them back in that state. Its sysfs fixture is writable by
the rank: a stand-in for the kernel (gid_standin.py) adds a port's IPv4 RoCE GIDs when the port
gets an address, and shows its MTU in class/net/<port>/mtu, as the kernel does.

The checkpoint is a host directory bind-mounted read-only at ``/models/glm53-sandbox`` in all four
ranks: the stand-in for the NFS export of a real cluster. It is a bind mount because this kernel
has no NFS (no ``nfs``/``nfsd`` in /proc/filesystems), so an NFS server cannot run here.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import ipaddress
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import yaml

from . import debian_image, fabric_fixture as fabric, links
from . import gid_standin, nfs_link, roce_standin
from ..onrank import probe as probe_script
from . import meminfo as meminfo_mod
from . import model_fixture as ckpt
from .errors import SandboxError

LABEL = "org.sparkstack.sandbox"
RANK_LABEL = "org.sparkstack.sandbox.rank"
IMAGE_LABEL = "org.sparkstack.sandbox.image"
STATE_LABEL = "org.sparkstack.sandbox.state"  # the state dir whose keys the rank was made with
MEMINFO_LABEL = "org.sparkstack.sandbox.meminfo"  # "gb10" (fake Spark meminfo) or "host"
STORE_LABEL = "org.sparkstack.sandbox.store"  # the rank's Docker image store at creation (stores())
STORES = ("classic", "containerd")
BARE_LABEL = "org.sparkstack.sandbox.bare"  # "1" on what the bare sandbox made (links.bare())
NETWORK = "sparkstack-sandbox"
DEFAULT_SUBNET = "172.31.240.0/24"
BARE_SUBNET = "172.31.242.0/24"  # the bare sandbox's own (beside the normal one, not instead)
PASSWORD_BYTES = 12
DEFAULT_RANKS = 4  # a DGX Spark TP4 cluster; `up --ranks N` (or $SPARKSTACK_SANDBOX_RANKS) for more
MAX_RANKS = 32
USER = "spark"
MODEL_PATH = "/models/glm53-sandbox"
SERVED_NAME = "GLM-5.3-sandbox"
SYSFS_ROOT = "/sandbox/sysfs"
READY_TIMEOUT_S = 60


def state_dir_default() -> Path:
    if links.bare():
        env = os.environ.get("SPARKSTACK_SANDBOX_BARE_DIR")
        return Path(env or "~/.local/state/sparkstack/sandbox-bare").expanduser()
    env = os.environ.get("SPARKSTACK_SANDBOX_DIR")
    return Path(env).expanduser() if env else Path("~/.local/state/sparkstack/sandbox").expanduser()


def network_name() -> str:
    return f"{NETWORK}-bare" if links.bare() else NETWORK


def _bare_label() -> dict:
    return {BARE_LABEL: "1"} if links.bare() else {}


def _mine(obj_labels: dict | None) -> bool:
    """Made by this sandbox (the bare one or the normal one), not by the other."""
    return (obj_labels or {}).get(BARE_LABEL) == ("1" if links.bare() else None)


def subnet() -> ipaddress.IPv4Network:
    if links.bare():
        raw = os.environ.get("SPARKSTACK_SANDBOX_BARE_SUBNET", BARE_SUBNET)
    else:
        raw = os.environ.get("SPARKSTACK_SANDBOX_SUBNET", DEFAULT_SUBNET)
    try:
        net = ipaddress.IPv4Network(raw)
    except ValueError:
        raise SandboxError(f"SPARKSTACK_SANDBOX_SUBNET={raw!r} is not an IPv4 network",
                           "use a form like 172.31.240.0/24") from None
    if net.num_addresses < 32:
        raise SandboxError(f"SPARKSTACK_SANDBOX_SUBNET={raw} is too small", "use a /27 or larger")
    return net


def topology(value: str | None = None) -> str:
    """How `up` cables the fabric: the argument, else $SPARKSTACK_SANDBOX_TOPOLOGY, else ring."""
    chosen = value or os.environ.get("SPARKSTACK_SANDBOX_TOPOLOGY") or "ring"
    if chosen not in fabric.TOPOLOGIES:
        raise SandboxError(f"no sandbox topology {chosen!r}", "use --topology ring or --topology switch")
    return chosen


def current_topology(state_dir: Path) -> str:
    """The topology the sandbox in `state_dir` was last cabled as."""
    path = paths(state_dir)["topology"]
    return path.read_text().strip() if path.exists() else "ring"


def n_ranks(value: int | None = None) -> int:
    """How many ranks `up` makes: the argument, else $SPARKSTACK_SANDBOX_RANKS, else 4."""
    raw = value if value is not None else os.environ.get("SPARKSTACK_SANDBOX_RANKS", DEFAULT_RANKS)
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 2 <= n <= MAX_RANKS:
        raise SandboxError(f"a sandbox of {raw!r} ranks is not possible",
                           f"use 2 to {MAX_RANKS} ranks (`sandbox up --ranks 4`)")
    return n


def stores(value: str | None, n: int) -> list[str]:
    """Each rank's Docker image store at creation: the argument, else $SPARKSTACK_SANDBOX_STORES
    (`classic`, `containerd`, `mixed`, or one per rank, comma-separated), else mixed: every fourth
    rank (spark4, spark8, ...; the last one of a smaller sandbox) on containerd's image store (Docker
    29+ installs, some Spark OEM images), the others on the classic overlay2, as fleets are; a rank
    keeps its store as ranks are added or removed. A rank switched by hand keeps its switch until it
    is re-made."""
    chosen = value or os.environ.get("SPARKSTACK_SANDBOX_STORES") or "mixed"
    if chosen == "mixed":
        return ["containerd" if i % 4 == 3 or (n < 4 and i == n - 1) else "classic" for i in range(n)]
    listed = [x.strip() for x in chosen.split(",")]
    if len(listed) == 1:
        listed *= n
    if len(listed) != n or any(x not in STORES for x in listed):
        raise SandboxError(f"no sandbox Docker stores {chosen!r} for {n} ranks",
                           "use --stores classic, containerd, mixed, or one per rank "
                           "(e.g. classic,classic,classic,containerd)")
    return listed


def rank_names(n: int) -> list[str]:
    return [f"spark{i + 1}" for i in range(n)]


def _rank_index(name: str) -> int:
    return int(name.removeprefix("spark")) - 1


def container_name(name: str) -> str:
    return f"sparkstack-bare-{name}" if links.bare() else f"sparkstack-{name}"


def volume_name(name: str) -> str:
    return f"{container_name(name)}-docker"


def rank_address(i: int, net: ipaddress.IPv4Network | None = None) -> str:
    net = net or subnet()
    return str(net.network_address + 11 + i)


def paths(state_dir: Path) -> dict[str, Path]:
    return {
        "key": state_dir / "id_ed25519",
        "pub": state_dir / "id_ed25519.pub",
        "known_hosts": state_dir / "known_hosts",
        "config": state_dir / "cluster.yaml",
        "truth": state_dir / "fabric-truth.json",
        "models": state_dir / "models",
        "model": state_dir / "models" / Path(MODEL_PATH).name,
        "patches": state_dir / "patches",
        "images": state_dir / "images",
        "ranks": state_dir / "ranks",
        "topology": state_dir / "topology",
        "password": state_dir / "password",  # the bare sandbox's login password for USER
    }


# ---------------------------------------------------------------------------------------------
# Docker engine


def connect():
    """A docker-py client to the local engine, or a SandboxError saying how to get one."""
    from ..images.local_docker import LocalDocker, LocalDockerError

    engine = LocalDocker(timeout=120)
    try:
        engine.ping()
    except LocalDockerError as e:
        raise SandboxError(e.problem, e.fix) from None
    return engine.client


# ---------------------------------------------------------------------------------------------
# Keys


def _ed25519_pair() -> tuple[bytes, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private, public


def _ensure_keypair(private_path: Path, public_path: Path, comment: str) -> str:
    if private_path.exists() and public_path.exists():
        return public_path.read_text().strip()
    private, public = _ed25519_pair()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    os.chmod(private_path, 0o600)
    public_path.write_text(f"{public} {comment}\n")
    return public_path.read_text().strip()


def prepare_state(state_dir: Path, net: ipaddress.IPv4Network, n: int, cabling: str = "ring") -> dict:
    """Keys, known_hosts, fixtures, checkpoint, patches: everything on the host side."""
    p = paths(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    client_pub = _ensure_keypair(p["key"], p["pub"], "sparkstack-sandbox")
    known = []
    truth = {}
    for i, name in enumerate(rank_names(n)):
        rdir = p["ranks"] / name
        sshdir = rdir / "ssh"
        host_pub = _ensure_keypair(sshdir / "ssh_host_ed25519_key",
                                   sshdir / "ssh_host_ed25519_key.pub", f"root@{name}")
        os.chmod(sshdir / "ssh_host_ed25519_key.pub", 0o644)
        auth = sshdir / "authorized_keys"
        authorized = "" if links.bare() else client_pub + "\n"  # bare: a password login only
        if not auth.exists() or auth.read_text() != authorized:
            auth.write_text(authorized)
        kind, blob = host_pub.split()[:2]
        known.append(f"{rank_address(i, net)},{name} {kind} {blob}")
        _rewrite_sysfs(rdir / "sysfs", _sysfs(state_dir, i, n, topology=cabling))
        # bare: the rank's own `ip addr` (its veths, addressed by `init`) is the truth
        _write_in_place(rdir / "ip-addr.json",
                        "[]\n" if links.bare() else json.dumps(fabric.ip_addr_json(i, n, cabling), indent=2) + "\n")
        truth[name] = fabric.fabric_truth(i, n, cabling)
        if not (rdir / "meminfo").exists():  # then the rank's memory daemon owns it
            (rdir / "meminfo").write_text(meminfo_mod.meminfo(i))
        meminfo_mod.write_boot_state(rdir, i)
    _write_if_changed(p["known_hosts"], "\n".join(known) + "\n")
    summary = ckpt.write_checkpoint(p["model"])
    ckpt.write_patches(p["patches"])
    _write_if_changed(p["truth"], json.dumps(truth, indent=2) + "\n")
    _write_if_changed(p["topology"], cabling + "\n")
    if links.bare() and not p["password"].exists():
        import secrets

        fd = os.open(p["password"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(PASSWORD_BYTES) + "\n")
    return {"checkpoint": summary, "truth": truth}


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _write_in_place(path: Path, text: str) -> None:
    """Rewrite keeping the inode: the file is bind-mounted into a running rank."""
    if path.exists():
        if path.read_text() != text:
            with open(path, "r+") as f:
                f.write(text)
                f.truncate()
    else:
        path.write_text(text)


# ---------------------------------------------------------------------------------------------
# Network


def _host_routes() -> list[tuple[ipaddress.IPv4Network, str]]:
    routes = []
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return routes
    for line in lines:
        f = line.split()
        if len(f) < 8:
            continue
        dest = ipaddress.IPv4Address(int(f[1], 16).to_bytes(4, "little"))
        mask = ipaddress.IPv4Address(int(f[7], 16).to_bytes(4, "little"))
        if int(mask) == 0:
            continue  # the default route overlaps everything by design
        routes.append((ipaddress.IPv4Network(f"{dest}/{mask}", strict=False), f[0]))
    return routes


def _check_routes(net: ipaddress.IPv4Network, fix: str) -> None:
    for route, dev in _host_routes():
        if route.overlaps(net):
            raise SandboxError(f"the sandbox subnet {net} is already taken on this host "
                               f"(route {route} on {dev})", fix)


def ensure_network(client, net: ipaddress.IPv4Network):
    import docker.errors

    fix_subnet = (f"remove what uses {net}, or pick another private /24 with "
                  "SPARKSTACK_SANDBOX_SUBNET=172.31.241.0/24 (then `sparkstack sandbox up` again)")
    try:
        existing = client.networks.get(network_name())
    except docker.errors.NotFound:
        existing = None
    if existing is not None:
        labels = existing.attrs.get("Labels") or {}
        if labels.get(LABEL) != "1":
            raise SandboxError(f"a Docker network named {network_name()} exists that sparkstack did not create",
                               f"remove it (`docker network rm {network_name()}`) if it is unused")
        configs = (existing.attrs.get("IPAM") or {}).get("Config") or []
        if any(c.get("Subnet") == str(net) for c in configs):
            return existing
        # ours but on another subnet (SPARKSTACK_SANDBOX_SUBNET changed): recreate
        _check_routes(net, fix_subnet)
        for c in existing.attrs.get("Containers") or {}:
            try:
                existing.disconnect(c, force=True)
            except docker.errors.APIError:
                pass
        existing.remove()
    _check_routes(net, fix_subnet)
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(
        subnet=str(net), gateway=str(net.network_address + 1))])
    try:
        return client.networks.create(network_name(), driver="bridge", ipam=ipam,
                                      labels={LABEL: "1", **_bare_label()},
                                      options={"com.docker.network.driver.mtu": "1400"})
    except docker.errors.APIError as e:
        msg = e.explanation or str(e)
        if "overlap" in msg or "already" in msg:
            raise SandboxError(f"the sandbox subnet {net} is already taken: {msg}", fix_subnet) from None
        raise SandboxError(f"cannot create the Docker network {network_name()}: {msg}",
                           "check `docker network ls` and the engine's log") from None


# ---------------------------------------------------------------------------------------------
# Ranks


def _find_container(client, name: str):
    import docker.errors

    try:
        return client.containers.get(container_name(name))
    except docker.errors.NotFound:
        return None


def _meminfo_mode() -> str:
    return "gb10" if meminfo_mod.enabled() else "host"


def _create_rank(client, i: int, name: str, image: str, state_dir: Path, net, store: str = "classic"):
    import docker.errors

    p = paths(state_dir)
    rdir = p["ranks"] / name
    try:
        client.volumes.get(volume_name(name))
    except docker.errors.NotFound:
        client.volumes.create(volume_name(name), labels={LABEL: "1", RANK_LABEL: name, **_bare_label()})
    api = client.api
    host_config = api.create_host_config(
        cap_add=["ALL"], cap_drop=["SYS_RESOURCE"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        init=True,
        binds={
            volume_name(name): {"bind": "/var/lib/docker", "mode": "rw"},
            str(p["model"]): {"bind": MODEL_PATH, "mode": "ro"},
            # bare: rw for the kernel's stand-in that adds a port's IPv4 RoCE GIDs (gid_standin)
            str(rdir / "sysfs"): {"bind": SYSFS_ROOT, "mode": "rw" if links.bare() else "ro"},
            str(rdir / "ip-addr.json"): {"bind": "/sandbox/ip-addr.json", "mode": "ro"},
            str(rdir / "ssh"): {"bind": "/sandbox/ssh", "mode": "ro"},
            str(p["images"]): {"bind": "/sandbox/images", "mode": "ro"},
            **({str(rdir / "meminfo"): {"bind": "/sandbox/meminfo", "mode": "rw"},
                str(rdir / "mem"): {"bind": "/sandbox/mem", "mode": "rw"}}
               if meminfo_mod.enabled() else {}),
        },
        tmpfs={"/run": "rw,exec,size=64m", "/tmp": "rw,exec,size=512m"},
        restart_policy={"Name": "no"},
    )
    # `--security-opt systempaths=unconfined` of the CLI: empty (not absent) lists in the API
    host_config["MaskedPaths"] = []
    host_config["ReadonlyPaths"] = []
    networking = api.create_networking_config(
        {network_name(): api.create_endpoint_config(ipv4_address=rank_address(i, net))})
    try:
        cid = api.create_container(
            image, name=container_name(name), hostname=name, detach=True,
            labels={LABEL: "1", RANK_LABEL: name, IMAGE_LABEL: image, STATE_LABEL: str(state_dir),
                    MEMINFO_LABEL: _meminfo_mode(), STORE_LABEL: store, **_bare_label()},
            host_config=host_config, networking_config=networking,
            environment={"SANDBOX_RANK": name, "SANDBOX_DOCKER_STORE": store})["Id"]
        api.start(cid)
    except docker.errors.APIError as e:
        msg = e.explanation or str(e)
        if "already in use" in msg or "Address already" in msg:
            raise SandboxError(f"cannot start {container_name(name)}: {msg}",
                               "run `sparkstack sandbox down`, then `sparkstack sandbox up`") from None
        raise SandboxError(f"cannot start {container_name(name)}: {msg}",
                           "check `docker logs " + container_name(name) + "` and the engine's log") from None
    return client.containers.get(cid)


def _ensure_rank(client, i: int, name: str, image: str, state_dir: Path, net,
                 store: str = "classic") -> tuple[object, str]:
    """Adopt a healthy container of ours, recreate a stale one, refuse a foreign one."""
    c = _find_container(client, name)
    if c is not None:
        labels = c.labels or {}
        if labels.get(LABEL) != "1":
            raise SandboxError(f"a container named {container_name(name)} exists that sparkstack "
                               "did not create",
                               f"remove or rename it (`docker rm -f {container_name(name)}`)")
        nets = (c.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        addr = (nets.get(network_name()) or {}).get("IPAddress")
        if (c.status == "running" and labels.get(IMAGE_LABEL) == image
                and labels.get(STATE_LABEL) == str(state_dir) and addr == rank_address(i, net)
                and labels.get(MEMINFO_LABEL) == _meminfo_mode() and labels.get(STORE_LABEL) == store
                and (_inner_docker_ok(c) or _started_recently(c))):
            return c, "adopted"
        # a leftover of a crashed or older run: stopped, another image, another subnet, or made
        # from another state dir (its host keys would not match this known_hosts)
        c.remove(force=True)
        _create = _create_rank(client, i, name, image, state_dir, net, store)
        return _create, "recreated"
    return _create_rank(client, i, name, image, state_dir, net, store), "created"


def _started_recently(c, seconds: float = READY_TIMEOUT_S) -> bool:
    """A rank still starting (another `up` just made it) is adopted and waited for."""
    from datetime import datetime, timezone

    started = (c.attrs.get("State") or {}).get("StartedAt", "")
    try:
        t = datetime.fromisoformat(started[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return False
    return (datetime.now(timezone.utc) - t).total_seconds() < seconds


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _pid(container) -> int:
    container.reload()
    return int(container.attrs["State"]["Pid"])


def _inner_docker_ok(container) -> bool:
    try:
        res = container.exec_run(["docker", "version", "--format", "{{.Server.Version}}"])
        return res.exit_code == 0
    except Exception:
        return False


def _wait_ready(client, name: str, address: str, deadline: float) -> None:
    c = _find_container(client, name)
    while time.monotonic() < deadline:
        c.reload()
        if c.status != "running":
            logs = c.logs(tail=15).decode(errors="replace")
            raise SandboxError(f"rank {name} stopped while starting ({c.status}); its last lines:\n{logs}",
                               f"check `docker logs {container_name(name)}`")
        if _port_open(address, 22) and _inner_docker_ok(c):
            return
        time.sleep(0.3)
    ssh_ok = _port_open(address, 22)
    what = "the rank's dockerd does not answer" if ssh_ok else f"sshd at {address}:22 does not answer"
    raise SandboxError(f"rank {name} is not ready after {READY_TIMEOUT_S} s: {what}",
                       f"check `docker logs {container_name(name)}` and "
                       f"`docker exec {container_name(name)} tail /var/log/dockerd.log`")


def _image_tar(client, tag: str, image_id: str, images_dir: Path) -> Path:
    """The stand-in image saved once to the state dir (the ranks see it at /sandbox/images), named
    by its ID too: a rebuild under the same tag (the image was removed here) is saved anew."""
    images_dir.mkdir(parents=True, exist_ok=True)
    fname = f"{tag.replace(':', '_').replace('/', '_')}_{image_id.removeprefix('sha256:')[:12]}.tar"
    path = images_dir / fname
    if path.exists():
        return path
    for old in images_dir.glob("*.tar"):
        old.unlink(missing_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        for chunk in client.images.get(tag).save(named=True):
            f.write(chunk)
    tmp.replace(path)
    return path


def _load_into_rank(container, tag: str, image_id: str, tar: Path) -> str:
    """The rank's engine gets the stand-in unless it has this very image (by ID: a tag this host
    has rebuilt would otherwise leave the rank serving the old one, which `check` then fails; on
    containerd's image store its ID is the manifest's that this tar gives, remember_tar_manifest)."""
    there = container.exec_run(["docker", "image", "inspect", "--format", "{{.Id}}", tag])
    if there.exit_code == 0 and there.output.decode().strip() in (image_id, remember_tar_manifest(tar)):
        return "present"
    res = container.exec_run(["docker", "load", "-q", "-i", f"/sandbox/images/{tar.name}"])
    if res.exit_code != 0:
        raise SandboxError(f"loading {tag} into {container.name} failed: "
                           f"{res.output.decode(errors='replace').strip()}",
                           f"check `docker exec {container.name} docker info`")
    remember_tar_manifest(tar)
    return "loaded"


def remember_tar_manifest(tar: Path) -> str:
    """The ID containerd's image store gives the image of this `docker save` tar (its manifest's
    digest, launcher/images/manifests.py), from the tar's own manifest.json, config and sizes; the
    manifest is kept where the kit keeps those it made (a manifest's bytes name its config: a fact,
    whoever wrote the file), so a containerd rank's stand-in reads as the build host's image, as
    an image the kit shipped does."""
    import tarfile

    from ..images import manifests, spool

    with tarfile.open(tar) as t:
        listed = json.load(t.extractfile("manifest.json"))[0]
        config = t.extractfile(listed["Config"]).read()
        members = {m.name: m for m in t.getmembers()}
        sizes = []
        for name in listed["Layers"]:
            member = members[name]
            while member.issym():  # a repeated layer links to its first copy
                member = members[os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))]
            sizes.append(member.size)
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    manifests.note_sizes(dict(zip(diff_ids, sizes)), spool.SPOOL)
    return manifests.remember(manifests.docker_manifest(config, list(zip(diff_ids, sizes))), spool.SPOOL)


def write_cluster_yaml(state_dir: Path, net, base_image: str, n: int, cabling: str = "ring") -> Path:
    p = paths(state_dir)
    ranks = []
    for i, name in enumerate(rank_names(n)):
        t = fabric.fabric_truth(i, n, cabling)
        ranks.append({"name": name, "address": rank_address(i, net), "port": 22, "user": USER,
                      "key": str(p["key"]), "fabric_ips": [t["fabric_ip"]],
                      "sysfs_root": SYSFS_ROOT})
    doc = {
        "profile": "sandbox",
        "topology": cabling,
        "ssh": {"known_hosts": str(p["known_hosts"])},
        "ranks": ranks,
        "model": {"path": MODEL_PATH, "served_name": SERVED_NAME},
        "images": {"base": base_image, "patches_dir": str(p["patches"])},
        # No GPU and no RDMA devices here, and this host's hard limits (nofile 20000, memlock
        # 8 MiB) are the ranks' ceiling: a real Spark uses the defaults (see the example config).
        "container": {"gpus": None, "devices": [], "nofile": 20000, "memlock": 8 << 20,
                      "shm_size": "1g"},
    }
    header = (f"# Written by `sparkstack sandbox up`: the {n} sandbox ranks on the local Docker\n"
              "# engine. Use it with `sparkstack -c " + str(p["config"]) + " ...` or\n"
              "# SPARKSTACK_CONFIG. Rewritten on every `sandbox up`.\n")
    _write_if_changed(p["config"], header + yaml.safe_dump(doc, sort_keys=False))
    return p["config"]


@contextlib.contextmanager
def _exclusive(progress=print):
    """One `up`/`down` at a time on this machine (the containers and network are global)."""
    path = Path(tempfile.gettempdir()) / "sparkstack-sandbox-updown.lock"
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("another `sandbox up`/`down` is running; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up(state_dir: Path | None = None, progress=print, ranks: int | None = None,
       cabling: str | None = None, docker_stores: str | None = None) -> dict:
    """Create (or adopt) the sandbox of `ranks` ranks (see n_ranks), cabled as a ring or to a
    switch (see topology), each rank's Docker on the image store `stores` gives (default mixed);
    idempotent: ranks beyond that number are removed, the other topology's cables too, a rank
    made with another store is re-made. Returns what status() returns plus timings."""
    n, cabling = n_ranks(ranks), topology(cabling)
    per_rank = stores(docker_stores, n)
    with _exclusive(progress):
        return _up(state_dir, progress, n, cabling, per_rank)


def _remove_extra_ranks(client, n: int) -> list[str]:
    """Ranks numbered above n (left by an earlier `up --ranks` with more), with their stores."""
    import docker.errors

    gone = []
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        name = (c.labels or {}).get(RANK_LABEL, "")
        if name.startswith("spark") and _rank_index(name) >= n and _mine(c.labels):
            c.remove(force=True)
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                client.volumes.get(volume_name(name)).remove(force=True)
            gone.append(name)
    return gone


def _up(state_dir: Path | None, progress, n: int, cabling: str, per_rank: list[str]) -> dict:
    t0 = time.monotonic()
    state_dir = (Path(state_dir) if state_dir else state_dir_default()).expanduser().resolve()
    net = subnet()
    client = connect()
    images = debian_image.ensure_images(client, progress, bare=links.bare())
    prepare_state(state_dir, net, n, cabling)
    ensure_network(client, net)
    gone = _remove_extra_ranks(client, n)
    if gone:
        progress(f"removed {', '.join(gone)} (the sandbox now has {n} ranks)")
    names = rank_names(n)
    actions = {}
    with cf.ThreadPoolExecutor(n) as pool:
        futs = {name: pool.submit(_ensure_rank, client, i, name, images["rank"], state_dir, net, per_rank[i])
                for i, name in enumerate(names)}
        containers = {}
        for name, fut in futs.items():
            containers[name], actions[name] = fut.result()
    progress("ranks: " + ", ".join(f"{n} {a}" for n, a in actions.items())
             + "; waiting for each rank's sshd and dockerd")
    vllm_id = client.images.get(images["vllm"]).id
    tar = _image_tar(client, images["vllm"], vllm_id, paths(state_dir)["images"])
    deadline = time.monotonic() + READY_TIMEOUT_S

    def ready_and_loaded(i_name):
        # each rank loads the base as soon as its own dockerd answers (no waiting for the others)
        i, name = i_name
        _wait_ready(client, name, rank_address(i, net), deadline)
        return _load_into_rank(containers[name], images["vllm"], vllm_id, tar)

    with cf.ThreadPoolExecutor(n) as pool:
        loads = dict(zip(names, pool.map(ready_and_loaded, enumerate(names))))
    if any(v == "loaded" for v in loads.values()):
        progress(f"{images['vllm']} loaded into " + ", ".join(k for k, v in loads.items() if v == "loaded"))
    laid = links.wire({i: _pid(containers[name]) for i, name in enumerate(names)}, n, cabling)
    if links.bare():
        for c in containers.values():
            _bare_rank(c, paths(state_dir)["password"].read_text().strip())
    else:
        for c in containers.values():
            _mount_fixture(c, net)
    for c in containers.values():
        _declare_hardware(c)
        _start_roce_counters(c)
    if laid:
        what = "ring link(s)" if cabling == "ring" else "switch cable(s) of rank(s)"
        progress(f"fabric: laid {what} {', '.join(map(str, laid))} (veth, MTU {links._end_mtu()})")
    if not links.bare():  # `sparkstack init` writes the bare sandbox's
        write_cluster_yaml(state_dir, net, images["vllm"], n, cabling)
    result = status(state_dir, client=client, n=n)
    result.update({"images": images, "actions": actions, "topology": cabling,
                   "seconds": round(time.monotonic() - t0, 1)})
    return result


def cut_cable(link: int, state_dir: Path | None = None, n: int = DEFAULT_RANKS) -> links.Cable:
    """Pull the cable of ring link `link` (a test's fault): the veth pair goes, and both ends'
    QSFP ports read down in their sysfs fixtures, as the kernel would show them."""
    state_dir = Path(state_dir) if state_dir else state_dir_default()
    if current_topology(state_dir) != "ring":
        raise SandboxError("cut_cable pulls a ring link; the sandbox is cabled to a switch",
                           "`sparkstack sandbox up --topology ring` first")
    client = connect()
    cable = links.cables(n)[link]
    links.cut(_pid(client.containers.get(container_name(rank_names(n)[cable.a.rank]))), cable.a.netdev)
    for end, port in ((cable.a, 0), (cable.b, 1)):
        _rewrite_sysfs(paths(state_dir)["ranks"] / rank_names(n)[end.rank] / "sysfs",
                       _sysfs(state_dir, end.rank, n, unplugged=frozenset({port})))
    return cable


def reset_nic(rank: int, netdev: str, mtu: int = 1500, gid_moved: bool = True,
              state_dir: Path | None = None, n: int = DEFAULT_RANKS) -> None:
    """A NIC firmware reset on rank index `rank` (a test's fault): `netdev`'s MTU back at `mtu` on
    its cable's end and in the rank's sysfs fixture, and with `gid_moved` the rank's GID tables as
    after a global IPv6 address came or went (its IPv4 RoCE v2 entries two further down or up, as
    seen in the field). `mend_cables` puts it back."""
    state_dir = Path(state_dir) if state_dir else state_dir_default()
    name = rank_names(n)[rank]
    links.set_mtu(_pid(connect().containers.get(container_name(name))), netdev, mtu)
    moved = (rank not in fabric.EXTRA_IPV6) if gid_moved else None  # the extra IPv6 entries come or go
    _rewrite_sysfs(paths(state_dir)["ranks"] / name / "sysfs",
                   _sysfs(state_dir, rank, n, topology=current_topology(state_dir), mtu={netdev: mtu},
                          extra_ipv6=moved))


def mend_cables(state_dir: Path | None = None, n: int = DEFAULT_RANKS) -> list[int]:
    """Plug every cable back in (fixtures up again, missing veth pairs laid); the links laid."""
    state_dir = Path(state_dir) if state_dir else state_dir_default()
    client = connect()
    cabling = current_topology(state_dir)
    for i, name in enumerate(rank_names(n)):
        _rewrite_sysfs(paths(state_dir)["ranks"] / name / "sysfs", _sysfs(state_dir, i, n, topology=cabling))
    return links.wire({i: _pid(client.containers.get(container_name(name)))
                       for i, name in enumerate(rank_names(n))}, n, cabling)


def down(state_dir: Path | None = None, purge: bool = False, progress=print) -> dict:
    """Remove every container, network and volume labelled as the sandbox's; nothing else."""
    with _exclusive(progress):
        return _down(state_dir, purge)


def _down(state_dir: Path | None, purge: bool) -> dict:
    import docker.errors

    state_dir = Path(state_dir) if state_dir else state_dir_default()
    client = connect()
    removed = {"containers": [], "networks": [], "volumes": []}
    containers = [c for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
                  if _mine(c.labels)]

    def _rm(c):
        try:
            c.remove(force=True)
        except docker.errors.NotFound:
            pass
        return c.name

    with cf.ThreadPoolExecutor(max(1, len(containers))) as pool:
        removed["containers"] = sorted(pool.map(_rm, containers))
    for n in client.networks.list(filters={"label": f"{LABEL}=1"}):
        if not _mine(n.attrs.get("Labels")):
            continue
        try:
            n.remove()
            removed["networks"].append(n.name)
        except docker.errors.NotFound:
            pass
    for v in client.volumes.list(filters={"label": f"{LABEL}=1"}):
        if not _mine(v.attrs.get("Labels")):
            continue
        try:
            v.remove(force=True)
            removed["volumes"].append(v.name)
        except docker.errors.NotFound:
            pass
    links.remove_switch()
    if purge and state_dir.exists():
        import shutil

        shutil.rmtree(state_dir)
    return removed


def status(state_dir: Path | None = None, client=None, n: int | None = None) -> dict:
    """{"ranks": [{name, address, port, user, key, docker: running|down}], "config": path}."""
    client = client or connect()
    if not state_dir:
        # the state dir the running ranks were made from, else the default
        state_dir = state_dir_default()
        for c in client.containers.list(filters={"label": f"{LABEL}=1"}):
            if (c.labels or {}).get(STATE_LABEL) and _mine(c.labels):
                state_dir = c.labels[STATE_LABEL]
                break
    state_dir = Path(state_dir)
    net = subnet()
    p = paths(state_dir)
    if n is None:  # the ranks that exist, else the number `up` would make
        existing = [_rank_index(name) + 1 for c in client.containers.list(all=True, filters={"label": f"{LABEL}=1"})
                    if (name := (c.labels or {}).get(RANK_LABEL, "")).startswith("spark") and _mine(c.labels)]
        n = max(existing) if existing else n_ranks()
    count = n

    def one(i_name):
        i, name = i_name
        c = _find_container(client, name)
        ok = (c is not None and c.status == "running" and (c.labels or {}).get(LABEL) == "1"
              and _inner_docker_ok(c))
        return {"name": name, "address": rank_address(i, net), "port": 22, "user": USER,
                "key": str(p["key"]), "docker": "running" if ok else "down"}

    with cf.ThreadPoolExecutor(count) as pool:
        ranks = list(pool.map(one, enumerate(rank_names(count))))
    return {"ranks": ranks, "config": str(p["config"])}


# ---------------------------------------------------------------------------------------------
# The bare sandbox: what a Spark is before `sparkstack init`


BARE_SSHD = "PasswordAuthentication yes\n"  # sshd_config.d/00-bare.conf: read first, so it wins


def _bare_rank(container, password: str) -> None:
    """A password login for USER, no authorized key (prepare_state left the rank's empty; one
    `init` installed is removed), no fabric address, and the kernel's stand-in that gives an
    addressed port its IPv4 RoCE GIDs."""
    netdevs = " ".join(sorted({nd for _h, nd, _p, _d in fabric.HCAS}))
    script = (f"echo {USER}:{password} | chpasswd && "
              f"printf '{BARE_SSHD}' > /etc/ssh/sshd_config.d/00-bare.conf && "
              "kill -HUP $(pgrep -o -x sshd) && "
              # every `up --bare` is a Spark before `init` again: no key, no fabric address
              f": > /home/{USER}/.ssh/authorized_keys && rm -f /etc/netplan/60-sparkstack-fabric.yaml && "
              "rm -rf /var/lib/sparkstack && "  # no init journal either
              f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER} && chmod 0440 /etc/sudoers.d/{USER} && "
              f"for d in {netdevs}; do ip -4 addr flush dev $d 2>/dev/null; "
              f"ip link set dev $d mtu {links.BARE_MTU} 2>/dev/null; done; true")
    res = container.exec_run(["sh", "-c", script])
    if res.exit_code != 0:
        raise SandboxError(f"{container.name}: cannot enable the password login: "
                           f"{res.output.decode(errors='replace').strip()}",
                           f"check `docker exec {container.name} cat /var/log/auth.log`")
    running = container.exec_run(["pgrep", "-f", "sandbox-gid-standin"])
    if running.exit_code != 0:
        container.exec_run(["python3", "-c", gid_standin.SOURCE, "sandbox-gid-standin", SYSFS_ROOT],
                           detach=True)


def _sysfs(state_dir: Path, i: int, n: int, **kw) -> dict[str, str]:
    """Rank i's sysfs fixture: its fabric, and (not bare) the link its checkpoint reads take."""
    files = fabric.sysfs_tree(i, n, addressed=not links.bare(), **kw)
    return files if links.bare() else {**files, **nfs_link.sysfs_files(nfs_link.speed(state_dir))}


def _declare_hardware(container) -> None:
    """Where the rank's stand-in hardware is (its sysfs tree, `ip addr`, mount table), in the file
    the probe reads when the kit names no sysfs root: `init` then finds it as on a Spark."""
    declared = json.dumps({"sysfs_root": SYSFS_ROOT, "ip_addr_file": "/sandbox/ip-addr.json",
                           "mount_table": nfs_link.MOUNTINFO})
    path = probe_script.STANDIN_HARDWARE
    res = container.exec_run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && printf %s "$2" > "$1"', "sh", path, declared])
    if res.exit_code != 0:
        raise SandboxError(f"writing {path} in {container.name} failed: "
                           f"{res.output.decode(errors='replace').strip()}", "check the rank's /etc")


def _mount_fixture(container, net) -> None:
    """The rank's mount table for the probe: the checkpoint as the NFS mount it stands in for."""
    res = container.exec_run(["python3", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                              nfs_link.MOUNTINFO, nfs_link.mountinfo(net, MODEL_PATH)])
    if res.exit_code != 0:
        raise SandboxError(f"writing {nfs_link.MOUNTINFO} in {container.name} failed: "
                           f"{res.output.decode(errors='replace').strip()}", "check the rank's /sandbox")


def _rewrite_sysfs(root: Path, files: dict[str, str]) -> None:
    """The fixture tree anew; in the bare sandbox the GID stand-in re-adds what addresses make.
    Its port counters are the RoCE counter stand-in's (roce_standin.py)."""
    fabric.write_tree(root, files, fabric.counter_links(roce_standin.STATE_DIR))


def _start_roce_counters(container) -> None:
    """The rank's RoCE counter stand-in, unless it runs already."""
    if container.exec_run(["pgrep", "-f", "sandbox-roce-standin"]).exit_code != 0:
        container.exec_run(roce_standin.command(SYSFS_ROOT), detach=True)
