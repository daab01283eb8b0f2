"""Base images for the sandbox, built from Debian's packages (nothing can be pulled here).

Each image is built in two steps:

1. a *root filesystem* stage: ``mmdebstrap`` (``--variant=minbase`` plus a package list; the
   ranks on trixie, for its current Docker Engine, the stand-in on bookworm) writes a tarball that ``docker import`` turns into an image tagged by the hash of the
   recipe (suite, variant, packages, options) -- e.g. ``sparkstack-sandbox-rankfs:<hash>``.
   This is the slow part (about a minute per image on 2 cores) and changes almost never.
2. a *files* stage: a tiny ``docker build`` on top that only COPYs the sandbox's own files
   (the rank's init script and sshd settings; the stand-in ``vllm`` and ``ray`` programs, vLLM's
   flags table and the kit's value parsers (``launcher/inputs/vllm_options.py``), the stand-in
   ``tensorfold`` package), tagged by the hash of the parent tag and those files.

An image whose tag exists is reused as is, so a second ``sandbox up`` builds nothing, and a
change to the stand-in program rebuilds only the small files stage.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SandboxError

SUITE = "bookworm"
# The ranks stand for Sparks, whose DGX OS ships a current Docker Engine: Debian trixie's docker.io
# (26.1) is the closest reachable here -- containerd's OCI-layout `docker save`/`load` and its error
# wording, as on a Spark. The stand-in image stays on bookworm (it stands for the serving image).
RANK_SUITE = "trixie"
VARIANT = "minbase"
LABEL = "org.sparkstack.sandbox"
STANDIN_LABEL = "org.sparkstack.standin"
# Space needed for one rootfs tarball (rank: ~450 MB) plus its imported copy, with margin.
MIN_FREE_BYTES = 3 * 1024**3

_DPKG_EXCLUDES = [
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
]

# mmdebstrap's own hook that lays out a merged /usr and installs the empty `usr-is-merged`:
# without it apt satisfies init-system-helpers with `usrmerge`, which drags in all of perl
# (~50 MB more in every image, and every rank loads the stand-in image at `up`).
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"

STANDINS = Path(__file__).resolve().parent / "standins"


def serve_flags_file() -> Path:
    """vLLM 0.33's option table: the kit's own vendored copy, the one `plan` checks flags with."""
    from ..inputs import vllm_flags

    return vllm_flags.FLAGS_FILE


def standin_program() -> Path:
    return STANDINS / "standin_vllm.py"


def value_parsers_file() -> Path:
    """vLLM's value parsers, the kit's stdlib-only module: installed beside the stand-ins, which
    import it as a sibling (the files stage's hash covers it, so a change rebuilds the image)."""
    from ..inputs import vllm_options

    return Path(vllm_options.__file__)


def mirror() -> str:
    return os.environ.get("SPARKSTACK_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class RootfsRecipe:
    repository: str
    packages: tuple[str, ...]
    suite: str = SUITE
    variant: str = VARIANT
    extra_dpkg: tuple[str, ...] = ()

    def digest(self) -> str:
        doc = {"suite": self.suite, "variant": self.variant, "packages": sorted(self.packages),
               "dpkg": _DPKG_EXCLUDES + list(self.extra_dpkg), "hooks": HOOKS.get(self.repository, []),
               "recipe": 2}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.digest()}"


@dataclass(frozen=True)
class FilesStage:
    repository: str
    parent: RootfsRecipe
    dockerfile: str  # "{parent}" is replaced by the parent's tag
    files: dict[str, bytes] = field(default_factory=dict)  # context path -> content
    modes: dict[str, int] = field(default_factory=dict)

    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(self.parent.tag.encode())
        h.update(self.dockerfile.encode())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + self.files[name] + b"\0")
            h.update(str(self.modes.get(name, 0o644)).encode())
        return h.hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.digest()}"


# ---------------------------------------------------------------------------------------------
# The two images

RANK_PACKAGES = (
    "openssh-server", "docker.io",
    "docker-cli",  # trixie's docker.io only recommends its CLI, and the recipe installs no recommends
    "python3", "iproute2", "procps", "mount", "util-linux",
    "sudo", "ca-certificates", "iptables", "kmod", "curl", "less", "iputils-ping",
    "docker-registry",  # `ship --relay` runs a registry cache on rank 0, as a Spark would after
                        # `apt install docker-registry`
)
STANDIN_PACKAGES = ("python3",)

RANK_INIT = r"""#!/bin/sh
# PID 1's child in a sandbox rank (docker-init/tini is PID 1): set up, start dockerd, run sshd.
set -u
log() { echo "sandbox-rank-init: $*"; }

# cgroup v1 controllers are bind-mounted read-only into a non-privileged container; the rank's
# own dockerd needs to create child cgroups under its own subtree, so remount them writable.
mount -o remount,rw /sys 2>/dev/null || true
for m in $(awk '$3=="cgroup" {print $2}' /proc/mounts); do
    mount -o remount,bind,rw "$m" 2>/dev/null || log "cannot remount $m rw"
done

# /proc/sys/vm is global to the kernel: a sysctl written here would change the HOST. Give each
# rank its own copy (a tmpfs, filled from the real values at start) so `sysctl vm.swappiness=1`
# and `echo 3 > /proc/sys/vm/drop_caches` behave per rank and are gone after a restart, as the
# settings of a real Spark are gone after a reboot.
if [ ! -e /run/sandbox-vm/.ready ]; then
    mkdir -p /run/sandbox-vm
    mount -t tmpfs -o size=1m,mode=755 sandbox-vm /run/sandbox-vm
    for f in /proc/sys/vm/*; do
        n=$(basename "$f")
        cat "$f" > "/run/sandbox-vm/$n" 2>/dev/null || echo 0 > "/run/sandbox-vm/$n"
    done
    touch /run/sandbox-vm/.ready
    mount --bind /run/sandbox-vm /proc/sys/vm || log "cannot shadow /proc/sys/vm"
fi

# /proc/meminfo: a GB10's figures (see launcher/sandbox/meminfo.py), unless turned off, kept
# up to date by the rank's memory daemon (held memory, page cache, vm.drop_caches).
if [ -f /sandbox/meminfo ]; then
    mount --bind /sandbox/meminfo /proc/meminfo || log "cannot shadow /proc/meminfo"
    if [ -d /sandbox/mem ]; then
        /usr/local/sbin/sandbox-meminfo >>/var/log/sandbox-meminfo.log 2>&1 &
    fi
fi

# ssh: host key and authorized key come from the sandbox directory on the host.
install -d -m 0755 /run/sshd
install -m 0600 /sandbox/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key
install -m 0644 /sandbox/ssh/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ed25519_key.pub
for home in /root /home/spark; do
    owner=$(stat -c %U "$home")
    install -d -m 0700 -o "$owner" "$home/.ssh"
    install -m 0600 -o "$owner" /sandbox/ssh/authorized_keys "$home/.ssh/authorized_keys"
done

# The rank's image store, set once (the container's first start; a switch by hand then stays):
# containerd's (as on Docker 29+ installs and some Spark OEM images) or the classic overlay2.
if [ ! -e /etc/docker/.sandbox-store ]; then
    mkdir -p /etc/docker
    if [ "${SANDBOX_DOCKER_STORE:-classic}" = containerd ]; then
        echo '{"features": {"containerd-snapshotter": true}}' > /etc/docker/daemon.json
    fi
    echo "${SANDBOX_DOCKER_STORE:-classic}" > /etc/docker/.sandbox-store
fi

# The rank's own Docker engine (sandbox-dockerd, below).
/usr/local/sbin/sandbox-dockerd &

exec /usr/sbin/sshd -D -e
"""

# The rank dockerd's OCI runtime: runc, after adding to each new container's bundle the bind
# mounts a container on a real Spark gets from the kernel for free -- /proc/meminfo (the rank's
# GB10 figures; on a real box the container sees the host's), the rank's memory state (rw: a
# process in the container registers the memory it holds and the bytes it reads, as the kernel
# would count them; standins/standin_mem.py) and the fabric fixtures' sysfs tree (read by the
# stand-in engines to find the GIDs NCCL would use). Standard library only.
SANDBOX_RUNC = r"""#!/usr/bin/python3
import json, os, sys

MOUNTS = [("/sandbox/meminfo", "/proc/meminfo", "ro"), ("/sandbox/mem", "/sandbox/mem", "rw"),
          ("/sandbox/sysfs", "/sandbox/sysfs", "ro")]


def bundle(args):
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--bundle="):
            return a.split("=", 1)[1]
    return os.getcwd()


def add_mounts(path):
    with open(path) as f:
        spec = json.load(f)
    have = {m.get("destination") for m in spec.get("mounts", [])}
    for source, dest, mode in MOUNTS:
        if dest not in have and os.path.exists(source):
            spec.setdefault("mounts", []).append(
                {"destination": dest, "type": "bind", "source": source, "options": ["rbind", mode]})
    with open(path + ".tmp", "w") as f:
        json.dump(spec, f)
    os.replace(path + ".tmp", path)


args = sys.argv[1:]
if "create" in args or "run" in args:
    add_mounts(os.path.join(bundle(args), "config.json"))
os.execv("/usr/sbin/runc", ["runc", *args])
"""

# The rank's own Docker engine, its image store on the rank's own volume (/var/lib/docker); the
# one way to start it (the rank's init, a test restarting it). overlay2 works here: the volume is
# a plain ext4 directory and the kernel has overlayfs; if overlay2 cannot start (another kernel,
# a volume on overlayfs), vfs (slow, always works) -- only then: an engine that was stopped or
# crashed stays down, as a real one does, instead of coming back with an empty vfs store. Every
# container it starts runs through sandbox-runc: it sees this rank's meminfo and fabric fixtures,
# as a container on a real Spark sees the host's /proc/meminfo and sysfs. With containerd's image
# store on in /etc/docker/daemon.json (the rank's init, or a switch by hand), no --storage-driver:
# Docker 26.1 would take `overlay2` for a containerd snapshotter's name and load no image
# ("snapshotter not loaded: overlay2"); containerd's default, overlayfs, is what a Spark runs.
SANDBOX_DOCKERD = r"""#!/bin/sh
RUNTIME="--add-runtime=sandbox-runc=/usr/local/sbin/sandbox-runc --default-runtime=sandbox-runc"
LOG=/var/log/dockerd.log
if grep -qs '"containerd-snapshotter": *true' /etc/docker/daemon.json; then
    exec dockerd --mtu=1400 --bip=10.77.0.1/24 $RUNTIME >>$LOG 2>&1
fi
dockerd --storage-driver=overlay2 --mtu=1400 --bip=10.77.0.1/24 $RUNTIME >>$LOG 2>&1 && exit 0
tail -n 5 $LOG | grep -q "error initializing graphdriver" || exit 1
echo "sandbox-dockerd: overlay2 failed, using vfs" >>$LOG
exec dockerd --storage-driver=vfs --mtu=1400 --bip=10.77.0.1/24 $RUNTIME >>$LOG 2>&1
"""

SSHD_CONF = """# sparkstack sandbox rank
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
# OpenSSH >= 9.8 (trixie's 10.0) refuses, without a banner, a source that failed auth often;
# the tests fail logins on purpose from one address, and a Spark's OpenSSH 9.6 has no such rule
PerSourcePenalties no
"""

RANK_DOCKERFILE = """FROM {parent}
COPY sandbox-rank-init /usr/local/sbin/sandbox-rank-init
COPY sandbox.conf /etc/ssh/sshd_config.d/sandbox.conf
COPY sandbox-runc /usr/local/sbin/sandbox-runc
COPY sandbox-dockerd /usr/local/sbin/sandbox-dockerd
COPY sandbox-meminfo /usr/local/sbin/sandbox-meminfo
LABEL org.sparkstack.sandbox="1" org.sparkstack.sandbox.role="rank"
CMD ["/usr/local/sbin/sandbox-rank-init"]
"""

STANDIN_DOCKERFILE = """FROM {parent}
COPY vllm /usr/local/bin/vllm
COPY ray /usr/local/bin/ray
COPY serve-flags.json /usr/share/sandbox-vllm/serve-flags.json
COPY site-packages/ /usr/lib/python3/dist-packages/
LABEL org.sparkstack.sandbox="1" org.sparkstack.standin="vllm" \\
      org.opencontainers.image.title="sandbox-vllm" \\
      org.opencontainers.image.description="STAND-IN for vLLM, the ray CLI and TensorFold (sparkstack sandbox): parses their argv, serves a fake OpenAI API; not vLLM, not Ray, not TensorFold"
ENV SANDBOX_VLLM_STANDIN=1
"""

# In the rootfs: a user `spark` (sudo without password, in the docker group), sshd without
# generated host keys (each rank gets its own at start), apt caches dropped.
_RANK_HOOKS = [
    'chroot "$1" useradd --create-home --shell /bin/bash --groups sudo,docker spark',
    'chroot "$1" usermod -p "*" spark',
    'echo "spark ALL=(ALL) NOPASSWD:ALL" > "$1/etc/sudoers.d/spark"; chmod 0440 "$1/etc/sudoers.d/spark"',
    'rm -f "$1"/etc/ssh/ssh_host_*',
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
]
_STANDIN_HOOKS = ['rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin']

RANK_FS = RootfsRecipe("sparkstack-sandbox-rankfs", RANK_PACKAGES, suite=RANK_SUITE)
# The bare sandbox's ranks (`sandbox up --bare`, for `sparkstack init`) also carry Debian's real
# netplan (netplan.io): `netplan generate` parses the fabric file init writes, strictly and with
# netplan's own messages. Its own repository, so the normal sandbox's image is left as it is.
RANK_FS_BARE = RootfsRecipe("sparkstack-sandbox-rankfs-bare", RANK_PACKAGES + ("netplan.io",), suite=RANK_SUITE)
# Every rank extracts the stand-in image at each `up` (docker load into its own store), and on
# this disk that costs ~2 ms per file: leave out the files a Python stand-in never reads
# (time zones, iconv modules, shell completion, lintian overrides), ~1300 of ~5500 files.
_STANDIN_TRIM = (
    "path-exclude=/usr/share/zoneinfo/right/*",
    "path-exclude=/usr/share/zoneinfo/posix/*",
    "path-exclude=/usr/share/zoneinfo/America/*",
    "path-exclude=/usr/share/zoneinfo/Asia/*",
    "path-exclude=/usr/share/zoneinfo/Africa/*",
    "path-exclude=/usr/share/zoneinfo/Europe/*",
    "path-exclude=/usr/share/zoneinfo/Antarctica/*",
    "path-exclude=/usr/share/zoneinfo/Australia/*",
    "path-exclude=/usr/share/zoneinfo/Pacific/*",
    "path-exclude=/usr/share/zoneinfo/Indian/*",
    "path-exclude=/usr/share/zoneinfo/Atlantic/*",
    "path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*",
    "path-exclude=/usr/share/bash-completion/*",
    "path-exclude=/usr/share/lintian/*",
)
STANDIN_FS = RootfsRecipe("sparkstack-sandbox-pyfs", STANDIN_PACKAGES, extra_dpkg=_STANDIN_TRIM)
HOOKS = {RANK_FS.repository: _RANK_HOOKS, RANK_FS_BARE.repository: _RANK_HOOKS,
         STANDIN_FS.repository: _STANDIN_HOOKS}


def rank_stage(bare: bool = False) -> FilesStage:
    if bare:
        return FilesStage("sparkstack-sandbox-rank-bare", RANK_FS_BARE, RANK_DOCKERFILE, *_rank_files())
    return FilesStage("sparkstack-sandbox-rank", RANK_FS, RANK_DOCKERFILE, *_rank_files())


def _rank_files() -> tuple[dict, dict]:
    return ({"sandbox-rank-init": RANK_INIT.encode(), "sandbox.conf": SSHD_CONF.encode(),
             "sandbox-runc": SANDBOX_RUNC.encode(), "sandbox-dockerd": SANDBOX_DOCKERD.encode(),
             "sandbox-meminfo": (STANDINS / "standin_mem.py").read_bytes()},
            {"sandbox-rank-init": 0o755, "sandbox-runc": 0o755, "sandbox-dockerd": 0o755,
             "sandbox-meminfo": 0o755})


# The files of a vLLM EXL3 image that the chain's stages add to or overlay (vLLM's package layout
# and exllamav3's compiled extension), as empty stand-ins: the stages' RUN steps find and
# replace them exactly as they would in Mia's image, and the stand-in engine reports which
# sandbox patches it finds (its record's "patches").
STANDIN_PACKAGE = {
    "vllm/__init__.py": b"# STAND-IN vllm package (sparkstack sandbox): layout only\n",
    "vllm/v1/attention/backends/mla/flashmla_sparse.py": b"# stock (stand-in)\n",
    # The stand-in base is the sandbox's whole serving image too (tests serve it as a prebuilt
    # image with the sandbox profile): it registers what that profile needs, as the chain's
    # patches do again (standins/standin_engine_config.py reads SANDBOX_REGISTERS). A test that
    # needs an image without one empties the file (tests/test_sandbox_engine_config.py).
    "vllm/model_executor/layers/quantization/exl3.py": (b"# stock EXL3 overlay (stand-in)\n"
                                                        b"SANDBOX_REGISTERS = ['quantization:exl3']\n"),
    "vllm/v1/attention/backends/mla/sm120_dcp.py": (b"# the DCP sparse-MLA backend (stand-in)\n"
                                                    b"SANDBOX_REGISTERS = ['attention:sparse-mla-dcp']\n"),
    "vllm/model_executor/layers/sparse_attn_indexer.py": b"# stock indexer (stand-in)\n",
    "vllm/model_executor/models/deepseek_v2.py": b"# stock DeepseekV2Model (stand-in)\n",
    "exllamav3_ext.cpython-311-x86_64-linux-gnu.so": b"\x7fELF exllamav3 0.0.43 (stand-in)\n",
    # `import ray` works, as in an image with Ray installed (vLLM's Ray executor imports it)
    "ray/__init__.py": b"# STAND-IN ray package (sparkstack sandbox): importable only; `ray` is standin_ray.py\n",
}


# The stand-in `tensorfold` package: `python3 -m tensorfold.cli` runs standin_tensorfold.py, as
# TensorFold's image runs its CLI.
TENSORFOLD_INIT = (b'"""SANDBOX STAND-IN package `tensorfold` (sparkstack sandbox): not TensorFold.\n'
                   b'tensorfold/cli.py is launcher/sandbox/standins/standin_tensorfold.py."""\n'
                   b'__version__ = "0.6.5"\n')
# Stand-in modules installed side by side in dist-packages: the TensorFold stand-in imports the
# vLLM stand-in's HTTP engine and standin_dist's cluster forming; the vLLM stand-in registers
# the memory it loads through standin_mem, and parses its values with the kit's vllm_options
# (value_parsers_file), copied beside them.
STANDIN_MODULES = ("standin_vllm.py", "standin_dist.py", "standin_tensorfold.py", "standin_ray.py",
                   "standin_mem.py", "standin_engine_config.py", "standin_requests.py", "standin_lm.py",
                   "standin_metrics.py")
# A stand-in installed under the real program's module path instead of its own name.
INSTALLED_AS = {"standin_tensorfold.py": "tensorfold/cli.py"}


def standin_site_packages() -> dict[str, bytes]:
    """dist-packages files of the stand-in image, by path under dist-packages."""
    files = dict(STANDIN_PACKAGE)
    files.update({INSTALLED_AS.get(name, name): (STANDINS / name).read_bytes() for name in STANDIN_MODULES})
    files["vllm_options.py"] = value_parsers_file().read_bytes()
    files["tensorfold/__init__.py"] = TENSORFOLD_INIT
    return files


def standin_stage() -> FilesStage:
    flags = serve_flags_file()
    for path, what in ([(STANDINS / m, f"the stand-in {m}") for m in STANDIN_MODULES]
                       + [(flags, "vLLM's serve flags table"),
                          (value_parsers_file(), "vLLM's value parsers (the kit's vllm_options)")]):
        if not path.is_file():
            raise SandboxError(f"{what} is missing: {path}",
                               "restore it from the repository (git checkout -- launcher)")
    return FilesStage("sandbox-vllm", STANDIN_FS, STANDIN_DOCKERFILE,
                      {"vllm": standin_program().read_bytes(), "ray": (STANDINS / "standin_ray.py").read_bytes(),
                       "serve-flags.json": flags.read_bytes(),
                       **{f"site-packages/{k}": v for k, v in standin_site_packages().items()}},
                      {"vllm": 0o755, "ray": 0o755})


# ---------------------------------------------------------------------------------------------
# Building

def image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def check_free_space(path: Path, need: int = MIN_FREE_BYTES,
                     fix: str = "free some space (e.g. `docker system prune`), or point TMPDIR at a larger disk"
                     ) -> None:
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need:
        raise SandboxError(
            f"not enough disk space to build the sandbox base image: {free / 2**30:.1f} GiB free "
            f"in {path}, {need / 2**30:.1f} GiB needed", fix)


def _docker_root(client) -> Path | None:
    try:
        root = Path(client.info().get("DockerRootDir", ""))
    except Exception:
        return None
    return root if root.is_dir() else None


def build_rootfs(client, recipe: RootfsRecipe, progress=print) -> str:
    """mmdebstrap the recipe into a tarball and import it; returns the tag. Reuses an existing tag."""
    if image_exists(client, recipe.tag):
        return recipe.tag
    if shutil.which("mmdebstrap") is None:
        raise SandboxError("mmdebstrap is not installed (the sandbox builds its base images from "
                           "Debian packages)", "apt-get install mmdebstrap")
    tmp = Path(tempfile.gettempdir())
    check_free_space(tmp)
    root = _docker_root(client)
    if root is not None:  # where the import lands: TMPDIR does not move it
        check_free_space(root, fix=f"free some space on the Docker engine's disk (e.g. `docker system prune`), "
                                   f"or move its data-root ({root}) to a larger one")
    progress(f"building {recipe.tag} from Debian {recipe.suite} packages (mmdebstrap, ~1-2 min)")
    with tempfile.TemporaryDirectory(prefix="sparkstack-rootfs-") as td:
        out = Path(td) / "rootfs.tar"
        cmd = ["mmdebstrap", f"--variant={recipe.variant}", "--format=tar",
               "--aptopt=APT::Install-Recommends \"false\"", f"--hook-dir={MERGED_USR_HOOKS}",
               *(f"--dpkgopt={o}" for o in _DPKG_EXCLUDES + list(recipe.extra_dpkg)),
               f"--include={','.join(recipe.packages)}",
               *(f"--customize-hook={h}" for h in HOOKS.get(recipe.repository, [])),
               recipe.suite, str(out), mirror()]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            if "No space left" in proc.stdout:
                raise SandboxError(f"mmdebstrap ran out of disk space building {recipe.tag}",
                                   "free some space (e.g. `docker system prune`) and retry")
            raise SandboxError(f"mmdebstrap failed building {recipe.tag} (exit {proc.returncode}):\n{tail}",
                               f"check that the Debian mirror {mirror()} is reachable "
                               "(`apt-get update` works), or set SPARKSTACK_DEBIAN_MIRROR")
        progress(f"importing {recipe.tag} ({out.stat().st_size / 2**20:.0f} MiB)")
        try:
            client.api.import_image_from_file(
                str(out), repository=recipe.repository, tag=recipe.digest(),
                changes=[f'LABEL {LABEL}="1"', 'CMD ["/bin/bash"]'])
        except Exception as e:  # docker.errors.APIError and transport errors
            if "no space left" in str(e).lower():
                raise SandboxError(f"the Docker engine ran out of disk space importing {recipe.tag}",
                                   "free some space (e.g. `docker system prune`) and retry") from None
            raise SandboxError(f"docker import of {recipe.tag} failed: {e}",
                               "check `docker info` and the engine's log") from None
    if not image_exists(client, recipe.tag):
        raise SandboxError(f"docker import of {recipe.tag} produced no image",
                           "check `docker info` and the engine's log")
    return recipe.tag


def _context_tar(stage: FilesStage) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = dict(stage.files)
        files["Dockerfile"] = stage.dockerfile.replace("{parent}", stage.parent.tag).encode()
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = stage.modes.get(name, 0o644)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def build_stage(client, stage: FilesStage, progress=print) -> str:
    """Build the rootfs parent if needed, then the files stage; returns the stage's tag."""
    if image_exists(client, stage.tag):
        return stage.tag
    build_rootfs(client, stage.parent, progress)
    progress(f"building {stage.tag}")
    errors = []
    try:
        for chunk in client.api.build(fileobj=_context_tar(stage), custom_context=True,
                                      tag=stage.tag, rm=True, forcerm=True, decode=True,
                                      labels={LABEL: "1"}):
            if "error" in chunk:
                errors.append(chunk["error"].strip())
    except Exception as e:
        errors.append(str(e))
    if errors or not image_exists(client, stage.tag):
        raise SandboxError(f"building {stage.tag} failed: {'; '.join(errors) or 'no image'}",
                           "check `docker info` and the engine's log")
    return stage.tag


def drop_old_tags(client, repository: str, keep: str) -> None:
    """Untag older builds of one of the sandbox's own repositories (in-use ones stay)."""
    for img in client.images.list(name=repository):
        for tag in img.tags:
            if tag != keep and tag.split(":")[0] == repository:
                try:
                    client.images.remove(tag)
                except Exception:
                    pass


def ensure_images(client, progress=print, bare: bool = False) -> dict[str, str]:
    """Both sandbox images, built only when their content-hash tag is missing."""
    stages = {"rank": rank_stage(bare), "vllm": standin_stage()}
    missing = [st.parent for st in stages.values()
               if not image_exists(client, st.tag) and not image_exists(client, st.parent.tag)]
    if len(missing) > 1:
        # the two mmdebstrap runs mostly wait on downloads and dpkg: run them side by side
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(len(missing)) as pool:
            for fut in [pool.submit(build_rootfs, client, recipe, progress) for recipe in missing]:
                fut.result()
    tags = {key: build_stage(client, st, progress) for key, st in stages.items()}
    for st in stages.values():
        drop_old_tags(client, st.repository, st.tag)
        drop_old_tags(client, st.parent.repository, st.parent.tag)
    return tags


def remove_cached_images(client) -> list[str]:
    """Remove every sandbox image (for a cold start); returns the tags removed."""
    removed = []
    for repo in ["sandbox-vllm", "sparkstack-sandbox-rank", "sparkstack-sandbox-rank-bare", RANK_FS.repository,
                 RANK_FS_BARE.repository, STANDIN_FS.repository]:
        for img in client.images.list(name=repo):
            for tag in img.tags:
                try:
                    client.images.remove(tag, force=True)
                    removed.append(tag)
                except Exception:
                    pass
    return removed
