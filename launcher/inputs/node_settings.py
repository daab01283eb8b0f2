"""The one list of persistent node settings a Spark needs before it serves, and their file formats.

Two writers use it and must never disagree: `sparkstack prep` (over SSH, after every boot) and the
Ansible role `ansible/roles/spark_node` (persistently, once), which gets these values as inventory
group vars from `launcher/plan/inventory.py`. The role's templates render the same bytes as the
`*_conf` functions here; tests/test_ansible.py compares the files on the ranks with them.

Pure data and string rendering: nothing here touches a rank.

Dropping page caches and compacting memory as the SSH user: a sudoers rule for exactly
`/usr/sbin/sysctl -w vm.drop_caches=3` and `/usr/sbin/sysctl -w vm.compact_memory=1` (no
wildcard, no other argument is allowed). `prep` drops caches; the load-time watcher drops and
then compacts (the field's fix for freezes during cold loads, issue 14). Chosen over a root-owned
helper script because there is no extra file to install and keep root-owned, and `sync` (the
first half of the seeds' `sync; echo 3 > /proc/sys/vm/drop_caches`) needs no privilege, so the
commands run it before sudo.
"""

from __future__ import annotations

import re
import shlex

from ..errors import SparkstackError

HEADER = "# Managed by sparkstack (launcher/inputs/node_settings.py); local edits are overwritten.\n"

SYSCTL_FILE = "/etc/sysctl.d/90-sparkstack.conf"
LIMITS_FILE = "/etc/security/limits.d/90-sparkstack.conf"
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
SUDOERS_FILE = "/etc/sudoers.d/sparkstack-drop-caches"
EARLYOOM_DEFAULTS_FILE = "/etc/default/earlyoom"

# Serving on a GB10: the page cache and the GPU share 128 GB, so swapping and proactive
# compaction only steal time and memory from the engine (seed 001's node settings).
BASE_SYSCTLS: dict[str, int | str] = {"vm.swappiness": 1, "vm.compaction_proactiveness": 0}

# NCCL runs out of descriptors at 4 ranks below this ("Too many open files", seed 000);
# RDMA registers (pins) memory, so memlock must be unlimited.
NOFILE = 1048576

DROP_CACHES_SUDO = "/usr/sbin/sysctl -w vm.drop_caches=3"
DROP_CACHES_COMMAND = f"sync && sudo -n {DROP_CACHES_SUDO}"  # for a non-root SSH user
DROP_CACHES_AS_ROOT = "sync && echo 3 > /proc/sys/vm/drop_caches"
COMPACT_MEMORY_SUDO = "/usr/sbin/sysctl -w vm.compact_memory=1"
COMPACT_MEMORY_AS_ROOT = "echo 1 > /proc/sys/vm/compact_memory"
SUDO_COMMANDS = (DROP_CACHES_SUDO, COMPACT_MEMORY_SUDO)  # the whole of the sudoers rule

# earlyoom (optional): act before the kernel's OOM killer, whose freeze of a unified-memory box
# can need a power cycle. SIGTERM at 4 % available (~5 GB on a GB10: serving leaves 9-15 GB),
# SIGKILL at 2 %; swap ignored (-s 100, swappiness is 1). Debian's unit expands $EARLYOOM_ARGS
# split at whitespace without shell quoting, so the regexes hold no spaces or quotes; they
# match the process name (comm, 15 chars): vLLM's workers are "VLLM::Worker_TP", torch's main
# thread "pt_main_thread"; the prefixes also cover sshd-session, containerd-shim, systemd-*.
EARLYOOM_PREFER = "^(VLLM::|pt_main_thread|vllm)"
EARLYOOM_AVOID = "^(sshd|dockerd|containerd|systemd|earlyoom|init)"
EARLYOOM_ARGS = f"-m 4,2 -s 100 -r 3600 --prefer {EARLYOOM_PREFER} --avoid {EARLYOOM_AVOID}"

# No swap (seed 001: "~9-15 GB free on every Spark while serving, no swap"), when the profile or
# cluster.yaml asks: a GB10's swap pages out what the GPU shares with the CPU and stalls the box
# instead of failing. Kept off across reboots by commenting the swap lines of /etc/fstab out (the
# Ansible role also masks swap.target, so systemd starts no swap unit at boot).
FSTAB = "/etc/fstab"
SWAP_FSTAB_MARK = "# sparkstack (no swap):"  # then a space and the line as it was
# an fstab line whose third field (vfstype) is swap, not already a comment: for sed (POSIX ERE,
# `prep`) and for Python's re (the Ansible role's replace task); tests check they agree
_SWAP_LINE = r"[^#[:space:]][^[:space:]]*[[:space:]]+[^[:space:]]+[[:space:]]+swap([[:space:]].*)?"
SWAP_LINE_RE = r"^([^#\s]\S*[ \t]+\S+[ \t]+swap([ \t].*)?)$"  # [ \t]: \s would span lines


def comment_out_swap_command(fstab: str = FSTAB) -> str:
    """sed that comments out every active swap line of `fstab` (idempotent: a commented line
    no longer matches)."""
    return f"sed -ri 's|^({_SWAP_LINE})$|{SWAP_FSTAB_MARK} \\1|' {fstab}"


def swap_off_command(fstab: str = FSTAB) -> str:
    """As root: swap off now, and off after a reboot."""
    return f"swapoff -a && {comment_out_swap_command(fstab)}"


# The checkpoint is only read; nofail so a Spark still boots (and is reachable to fix) when the
# NFS server is down; _netdev orders the mount after the network.
# A hard mount (the default) makes every read of a dead server wait for good: the engine's
# weight load, `docker rm -f` of its container, a shell's `ls`. soft turns that into an I/O
# error after the retries; soft's known risk is a write lost on a timeout, and a read-only mount
# has no writes. timeo=600 (60 s, TCP's default, stated) with retrans=2 gives up after about
# 6 min of silence (linear backoff: 60 + 120 + 180 s), far past what a busy but live server
# takes while four ranks load their weights at once.
NFS_HANG_OPTIONS = "soft,timeo=600,retrans=2"
NFS_OPTIONS = f"ro,{NFS_HANG_OPTIONS},noatime,nofail,_netdev"
BIND_OPTIONS = "bind,nofail"

_SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_*-]+)+$")
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_.-]*$")


class NodeSettingsError(SparkstackError):
    """A setting from cluster.yaml that cannot be written to a node file as it is."""

    exit_code = 2


# -- sysctls ------------------------------------------------------------------------------------
def sysctls(cluster=None) -> dict[str, int | str]:
    """The kernel settings for every rank: the base ones plus cluster.yaml's
    `overrides.sysctls` (which win)."""
    extras = cluster.overrides.sysctls if cluster is not None else {}
    merged = {**BASE_SYSCTLS, **extras}
    for name, value in merged.items():
        _check_sysctl(name, value)
    return dict(sorted(merged.items()))


def _check_sysctl(name: str, value) -> None:
    if not _SYSCTL_NAME.match(str(name)):
        raise NodeSettingsError(f"overrides.sysctls: {name!r} is not a sysctl name "
                                f"(dotted, like vm.swappiness)")
    if isinstance(value, bool) or not isinstance(value, (int, str)) or "\n" in str(value) \
            or not str(value).strip():
        raise NodeSettingsError(f"overrides.sysctls.{name}: {value!r} is not a sysctl value "
                                f"(a number or a one-line string)")


def sysctl_conf(cluster=None) -> str:
    """The text of SYSCTL_FILE."""
    return HEADER + "".join(f"{k} = {v}\n" for k, v in sysctls(cluster).items())


# -- limits -------------------------------------------------------------------------------------
def limits() -> list[dict[str, str]]:
    """pam_limits entries. `*` does not cover root in pam_limits, hence the root lines."""
    rows = []
    for domain in ("*", "root"):
        for item, value in (("nofile", str(NOFILE)), ("memlock", "unlimited")):
            for kind in ("soft", "hard"):
                rows.append({"domain": domain, "type": kind, "item": item, "value": value})
    return rows


def limits_conf() -> str:
    """The text of LIMITS_FILE."""
    return HEADER + "".join(f"{r['domain']} {r['type']} {r['item']} {r['value']}\n" for r in limits())


def docker_default_ulimits() -> dict:
    """daemon.json's "default-ulimits" for every container (memlock -1 = unlimited)."""
    return {
        "memlock": {"Name": "memlock", "Soft": -1, "Hard": -1},
        "nofile": {"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE},
    }


# -- dropping caches ----------------------------------------------------------------------------
def sudoers_rule(user: str) -> str:
    """The one line letting `user` drop page caches and compact memory, and nothing else,
    without a password."""
    if not _USER_NAME.match(user):
        raise NodeSettingsError(f"ranks: user {user!r} cannot be named in a sudoers rule "
                                f"(expected a plain login name)")
    return f"{user} ALL=(root) NOPASSWD: {', '.join(SUDO_COMMANDS)}\n"


def sudoers_file(user: str) -> str:
    """The text of SUDOERS_FILE (mode 0440, checked with `visudo -cf` before it is installed)."""
    return HEADER + sudoers_rule(user)


def drop_caches_command(user: str) -> str:
    """The shell command that drops page caches as `user` (through the sudoers rule)."""
    return DROP_CACHES_AS_ROOT if user == "root" else DROP_CACHES_COMMAND


def memory_relief_command(user: str) -> str:
    """The shell command that drops page caches, then compacts memory, as `user` (the load-time
    watcher's relief below its soft floor): as root by /proc, else through the sudoers rule."""
    if user == "root":
        return f"{DROP_CACHES_AS_ROOT} && {COMPACT_MEMORY_AS_ROOT}"
    return f"{DROP_CACHES_COMMAND} && sudo -n {COMPACT_MEMORY_SUDO}"


def relief_sudo_check_command(user: str) -> str:
    """A command that exits 0 only if `user` may run both of the rule's commands through
    `sudo -n` (no password): `sudo -n -l CMD` lists a command only when it is allowed. Root: true."""
    if user == "root":
        return "true"
    return " && ".join(f"sudo -n -l {c} >/dev/null" for c in SUDO_COMMANDS)


# -- the GPU clock ------------------------------------------------------------------------------
# `nvidia-smi -lgc` lasts until a reboot or `-rgc`, and nvidia-smi has no query for it: whoever
# sets it records the pair here (/run: gone at the reboot that ends the lock), for `check`. The
# probe reads the same path (launcher/onrank/probe.py GPU_CLOCK_FILE).
GPU_CLOCK_FILE = "/run/sparkstack/gpu-clock"
GPU_CLOCK_UNIT = "sparkstack-gpu-clock.service"  # the Ansible role's oneshot (lock at boot)
# no single quote in these commands: the unit's ExecStart wraps them in one (systemd's quoting)
_NO_SMI = 'command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: no NVIDIA driver on this rank"; exit 1; }'


def gpu_clock_command(low: int, high: int) -> str:
    """Lock the GPU clock to LOW..HIGH MHz (as root) and record it."""
    return (f"{_NO_SMI}; nvidia-smi -lgc {int(low)},{int(high)} && mkdir -p {GPU_CLOCK_FILE.rsplit('/', 1)[0]} "
            f"&& echo {int(low)},{int(high)} > {GPU_CLOCK_FILE}")


def gpu_clock_unit(low: int, high: int) -> str:
    """The text of the Ansible role's oneshot unit (templates/gpu-clock.service.j2 renders the
    same bytes): the lock at every boot, once the driver's persistence daemon is up."""
    return (HEADER + "[Unit]\nDescription=sparkstack: lock the GPU clock (cluster.yaml gpu_clock)\n"
            "After=nvidia-persistenced.service\nWants=nvidia-persistenced.service\n\n"
            "[Service]\nType=oneshot\nRemainAfterExit=true\n"
            f"ExecStart=/bin/sh -c {shlex.quote(gpu_clock_command(low, high))}\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def gpu_clock_reset_command() -> str:
    """Give the GPU clock back to the driver (as root) and forget the record."""
    return f"{_NO_SMI}; nvidia-smi -rgc && rm -f {GPU_CLOCK_FILE}"


def gpu_clock_range(cluster) -> tuple[int, int] | None:
    return cluster.gpu_clock.range if cluster.gpu_clock else None


# -- the checkpoint mount -----------------------------------------------------------------------
def nfs_server_index(cluster) -> int | None:
    """The rank that is the NFS server (its name, address or a fabric IP is `model.nfs.server`),
    or None when the export lives elsewhere (a NAS) or there is no NFS."""
    nfs = cluster.model.nfs
    if nfs is None:
        return None
    for i, rank in enumerate(cluster.ranks):
        if nfs.server in {rank.name, rank.address, *map(str, rank.fabric_ips)}:
            return i
    return None


def fstab_entry(cluster, rank_index: int) -> str | None:
    """The /etc/fstab line that puts the checkpoint at `model.path` on this rank, or None.

    Every rank mounts the export; the NFS server's own node cannot NFS-mount itself usefully
    and instead bind-mounts its export at the shared path (seed 000's gotcha: without it the
    server is the one rank missing the checkpoint). None without `model.nfs`, or on the server
    when its export already is the shared path.
    """
    nfs = cluster.model.nfs
    if nfs is None:
        return None
    path = cluster.model.path
    for field, value in (("model.path", path), ("model.nfs.export", nfs.export),
                         ("model.nfs.server", nfs.server)):
        if not value or any(c.isspace() for c in value):
            raise NodeSettingsError(f"{field}: {value!r} cannot go into /etc/fstab "
                                    f"(no spaces, not empty)")
    if rank_index == nfs_server_index(cluster):
        if nfs.export.rstrip("/") == path.rstrip("/"):
            return None
        return f"{nfs.export} {path} none {BIND_OPTIONS} 0 0"
    return f"{nfs.server}:{nfs.export} {path} nfs {NFS_OPTIONS} 0 0"


# -- earlyoom -----------------------------------------------------------------------------------
def earlyoom_defaults() -> str:
    """The text of EARLYOOM_DEFAULTS_FILE (read by Debian's earlyoom.service)."""
    return HEADER + f'EARLYOOM_ARGS="{EARLYOOM_ARGS}"\n'
