"""ansible/spark.yml for real: ansible-playbook (ansible-core) over SSH against the four sandbox ranks.

The sandbox config gets a `model.nfs` (spark1 serves the export) so the fstab lines are
exercised: a bind mount on spark1, NFS on the others. The inventory keeps the sandbox's
files-only switches (see launcher/plan/inventory.py), with live sysctls switched on: every sandbox rank
shadows /proc/sys/vm with its own copy (launcher/sandbox/debian_image.py), checked before the first
run, so the host's kernel is never changed.

The ranks are shared with other tests: the module starts from and ends with the sandbox's own
state (our files removed, /etc/fstab and daemon.json as they were, live sysctls restored).
Timings of the runs are printed (`pytest -s` shows them).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.inputs import config, node_settings
from launcher.plan import inventory
from launcher.errors import load_yaml_model

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "ansible" / "spark.yml"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
EXPORT = "/srv/models/glm53-sandbox"
VM_KEYS = ("swappiness", "compaction_proactiveness")
KERNEL_DEFAULTS = {"swappiness": "60", "compaction_proactiveness": "20"}
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?:spark_node : )?(.+?)\]")
HOST_STATUS = re.compile(r"^(ok|changed|skipping|failed|fatal): \[([^\]]+)\]")
# What each task of ansible/spark.yml does on a first run on a sandbox rank (files only, live
# sysctls on; no packages, no mounts, no services): "ok" ran and changed nothing.
FIRST_RUN = {
    "The inventory carries the node settings": "ok",
    "Sysctls are set at every boot": "changed",
    "Read the live sysctls": "ok",
    "Apply the sysctls now": "changed",            # the fixture starts from the kernel's defaults
    "Open files and locked memory for NCCL and RDMA": "changed",
    "Read Docker's daemon.json": "ok",
    "Containers get NCCL-sized ulimits by default": "changed",
    "Swap lines in /etc/fstab are commented out": "changed",  # the fixture's swap line
    "Systemd starts no swap at boot": "skipping",   # no services in the sandbox
    "Read the active swap": "skipping",             # the sandbox's /proc/swaps is the host's
    "Swap is off now": "skipping",
    "Sudoers rule for dropping page caches and compacting memory": "changed",
    "NFS client tools": "skipping",
    "The mount point exists": "ok",                # the sandbox's model directory is there
    "The checkpoint is in /etc/fstab": "changed",
    "Is the checkpoint mounted?": "skipping",
    "Mount the checkpoint now": "skipping",
    "GPU clock lock at every boot": "skipping",   # no gpu_clock in the sandbox's config
    "GPU clock unit runs at boot and now": "skipping",
    "No GPU clock unit without gpu_clock": "ok",    # there is none to remove
    "Earlyoom is installed": "skipping",
    "Earlyoom prefers the engine and spares sshd and dockerd": "changed",
    "Earlyoom runs from boot": "skipping",
    "Restart docker": "skipping",                  # notified by daemon.json, off in the sandbox
    "Restart earlyoom": "skipping",
}
OWN_DAEMON_JSON = {"labels": ["sparkstack-test=own-setting"]}
OWN_SETTINGS: dict = {}  # what spark4's own daemon.json held before the role ran (the `ranks` fixture)
HOST_VM = {k: Path(f"/proc/sys/vm/{k}").read_text().strip() for k in VM_KEYS}  # this host's, at import

pytestmark = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(),
                                reason="ansible-core is not installed (pip install ansible-core)")

# Run on a rank as root: remove what the role writes, leaving what was there before.
CLEAN = r"""
import json, os, re, sys
model = sys.argv[1]
for path in sys.argv[2:]:
    if os.path.exists(path):
        os.remove(path)
fstab = open("/etc/fstab").read().splitlines(True) if os.path.exists("/etc/fstab") else []
kept = [l for l in fstab if not re.match(r"^\S+\s+" + re.escape(model) + r"/?\s", l)
        and "/sparkstack-test-swapfile " not in l]
if kept != fstab:
    open("/etc/fstab", "w").write("".join(kept))
daemon = "/etc/docker/daemon.json"
if os.path.exists(daemon):
    conf = json.load(open(daemon))
    conf.pop("default-ulimits", None)
    if conf:
        open(daemon, "w").write(json.dumps(conf, indent=2) + "\n")
    else:
        os.remove(daemon)
"""


def _run(sandbox, name: str, command: str) -> str:  # noqa: F811
    rc, out, err = sandbox.run(name, command)
    assert rc == 0, f"{name}: {command}: {err or out}"
    return out


def _clean(sandbox, name: str) -> None:  # noqa: F811
    files = [node_settings.SYSCTL_FILE, node_settings.LIMITS_FILE, node_settings.SUDOERS_FILE,
             node_settings.EARLYOOM_DEFAULTS_FILE,  # the sandbox ranks have no earlyoom of their own
             f"/etc/systemd/system/{node_settings.GPU_CLOCK_UNIT}"]
    _run(sandbox, name, shlex.join(["sudo", "-n", "python3", "-c", CLEAN, _model_path(sandbox), *files]))


def _model_path(sandbox) -> str:  # noqa: F811
    return yaml.safe_load(sandbox.config.read_text())["model"]["path"]


def _live_vm(sandbox, name: str) -> dict[str, str]:  # noqa: F811
    out = _run(sandbox, name, " && ".join(f"cat /proc/sys/vm/{k}" for k in VM_KEYS))
    return dict(zip(VM_KEYS, out.split()))


def _set_vm(sandbox, name: str, values: dict[str, str]) -> None:  # noqa: F811
    _run(sandbox, name, "sudo -n /usr/sbin/sysctl -q " + " ".join(f"-w vm.{k}={v}" for k, v in values.items()))


# A swap line as DGX OS's installer writes one; the play (spark_node_no_swap) must comment it out.
TEST_SWAP_LINE = "/sparkstack-test-swapfile none swap sw 0 0"

MARKER = "/run/sparkstack-test-ansible"  # /run is a tmpfs of the container: gone if it is recreated


def _mark(sandbox, names) -> None:  # noqa: F811
    for name in names:
        _run(sandbox, name, f"sudo -n touch {MARKER}")


def _check_same_ranks(sandbox, names) -> None:  # noqa: F811
    """Other test sessions share the sandbox and may take it down and up: say so plainly
    rather than fail on a rank that lost its files."""
    for name in names:
        try:
            present = sandbox.run(name, f"test -e {MARKER}")[0] == 0
        except Exception:  # noqa: BLE001  (the rank is gone or restarting)
            present = False
        if not present:
            pytest.fail(f"{name} was recreated during the test (another process took the sandbox "
                        f"down and up); run the test again", pytrace=False)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Play:
    """ansible-playbook with the repo's ansible.cfg, returning (rc, output, recap, seconds)."""

    def __init__(self, sandbox, names, inventory_path: Path, extra: list[str]):  # noqa: F811
        self.sandbox, self.names = sandbox, names
        self.inventory_path, self.extra = inventory_path, extra
        self.timings: dict[str, float] = {}

    def __call__(self, label: str, *args: str, inventory_path: Path | None = None):
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg"),
               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory_path or self.inventory_path),
                str(PLAYBOOK), *self.extra, *args]
        t0, cpu0 = time.monotonic(), _children_cpu()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        seconds = time.monotonic() - t0
        self.timings[label] = seconds
        # the CPU the controller spent (ansible and its ssh) does not depend on a busy machine
        print(f"\nansible-playbook {label}: {seconds:.1f} s wall, "
              f"{_children_cpu() - cpu0:.1f} s CPU on this side")
        _check_same_ranks(self.sandbox, self.names)
        output = done.stdout + done.stderr
        recap = {h: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, counts)))
                 for h, *counts in RECAP.findall(output)}
        return done.returncode, output, recap, seconds


def task_statuses(output: str) -> dict[str, dict[str, str]]:
    """host -> {task name: ok | changed | skipping | failed | fatal}, from the default callback."""
    statuses: dict[str, dict[str, str]] = {}
    task = None
    for line in output.splitlines():
        if m := TASK.match(line):
            task = m.group(1)
        elif (m := HOST_STATUS.match(line)) and task is not None:
            statuses.setdefault(m.group(2), {})[task] = m.group(1)
    return statuses


@pytest.fixture(scope="module")
def ranks(sandbox):  # noqa: F811
    """The sandbox's ranks, cleaned of the role's files, restored afterwards. spark4 has a
    daemon.json of its own (the sandbox's: containerd's image store on), as DGX OS has one (the
    nvidia runtime), or gets one: the role must keep what it holds."""
    before = {}
    daemon = node_settings.DOCKER_DAEMON_JSON
    for name in sandbox.names:
        _clean(sandbox, name)
        code, own, _ = sandbox.run(name, f"sudo -n cat {daemon}")
        before[name] = (_live_vm(sandbox, name), own if code == 0 else None)
        wanted = {k: str(node_settings.sysctls()[f"vm.{k}"]) for k in VM_KEYS}
        if before[name][0] == wanted:  # left over from an interrupted run: start from the kernel's
            _set_vm(sandbox, name, KERNEL_DEFAULTS)
    if before["spark4"][1] is None:
        _run(sandbox, "spark4", f"echo {shlex.quote(json.dumps(OWN_DAEMON_JSON))} | sudo -n tee {daemon}")
    OWN_SETTINGS.update(json.loads(before["spark4"][1] or json.dumps(OWN_DAEMON_JSON)))
    for name in sandbox.names:
        _run(sandbox, name, f"echo {shlex.quote(TEST_SWAP_LINE)} | sudo -n tee -a /etc/fstab >/dev/null")
    _mark(sandbox, sandbox.names)
    yield sandbox.names
    for name, (vm, own) in before.items():
        try:
            _clean(sandbox, name)
            _set_vm(sandbox, name, vm)
            if own is None:
                _run(sandbox, name, f"sudo -n rm -f {daemon}")
            else:  # as it was, without the role's default-ulimits
                _run(sandbox, name, f"printf %s {shlex.quote(own)} | sudo -n tee {daemon} >/dev/null")
        except Exception as e:  # noqa: BLE001  (a rank recreated meanwhile is clean already)
            print(f"\n{name}: not restored: {e}")


@pytest.fixture(scope="module")
def cluster_file(sandbox, tmp_path_factory):  # noqa: F811
    data = yaml.safe_load(sandbox.config.read_text())
    data["model"]["nfs"] = {"server": "spark1", "export": EXPORT}
    path = tmp_path_factory.mktemp("ansible") / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def play(sandbox, ranks, cluster_file):  # noqa: F811
    inv = cluster_file.with_name("inventory.ini")
    inv.write_text(inventory.render(config.load(cluster_file).cluster, "ini"))
    # Live sysctls on: every rank has its own /proc/sys/vm, else they would be the host's.
    shadows = {n: _run(sandbox, n, "findmnt -n -o FSTYPE /proc/sys/vm || true").strip() for n in ranks}
    assert shadows == {n: "tmpfs" for n in ranks}, \
        f"a sandbox rank does not shadow /proc/sys/vm (sandbox-rank-init): {shadows}; not running the play"
    # earlyoom on: its settings file is written (the package and service stay off in the sandbox)
    # no swap (seed 001): the fstab edit only, swapoff stays off in the sandbox (spark_node_swapoff_now)
    play = Play(sandbox, ranks, inv, ["-e", "spark_node_earlyoom=true", "-e", "spark_node_apply_live=true",
                                      "-e", "spark_node_no_swap=true"])
    yield play
    print("\nansible-playbook timings on 4 ranks: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in play.timings.items()))


@pytest.fixture(scope="module")
def first_run(play):
    return play("first run")


def test_first_run_changes_what_it_should(play, first_run, ranks):
    """Each task does on each rank what it should on a first run; the recap agrees."""
    rc, output, recap, _ = first_run
    assert rc == 0, output[-3000:]
    assert task_statuses(output) == {n: FIRST_RUN for n in ranks}, output[-3000:]
    ran = sum(status in ("ok", "changed") for status in FIRST_RUN.values())  # 12
    changed = sum(status == "changed" for status in FIRST_RUN.values())  # 8
    assert recap == {n: {"ok": ran, "changed": changed, "unreachable": 0, "failed": 0}
                     for n in ranks}, output[-3000:]


def test_files_on_the_ranks(sandbox, play, first_run, ranks, cluster_file):  # noqa: F811
    """The role's files on every rank are node_settings' bytes; the live sysctls are set."""
    cluster = config.load(cluster_file).cluster
    model = cluster.model.path
    expected_files = {
        node_settings.SYSCTL_FILE: ("644 root:root", node_settings.sysctl_conf(cluster)),
        node_settings.LIMITS_FILE: ("644 root:root", node_settings.limits_conf()),
        node_settings.SUDOERS_FILE: ("440 root:root", node_settings.sudoers_file("spark")),
        node_settings.EARLYOOM_DEFAULTS_FILE: ("644 root:root", node_settings.earlyoom_defaults()),
    }
    for i, name in enumerate(ranks):
        for path, (mode, text) in expected_files.items():
            assert _run(sandbox, name, f"sudo -n stat -c '%a %U:%G' {path}").strip() == mode, path
            assert _run(sandbox, name, f"sudo -n cat {path}") == text, (name, path)
        _run(sandbox, name, f"sudo -n /usr/sbin/visudo -cf {node_settings.SUDOERS_FILE}")
        # sudo -l escapes the '=' of arguments
        rules = _run(sandbox, name, "sudo -n -l")
        assert f"(root) NOPASSWD: {', '.join(node_settings.SUDO_COMMANDS)}".replace("=", "\\=") in rules
        # the watcher's pre-flight passes with the rule, and names exactly its two commands
        _run(sandbox, name, node_settings.relief_sudo_check_command("spark"))
        daemon = json.loads(_run(sandbox, name, f"sudo -n cat {node_settings.DOCKER_DAEMON_JSON}"))
        assert daemon["default-ulimits"] == node_settings.docker_default_ulimits()
        if name == "spark4":
            assert OWN_SETTINGS and {k: daemon[k] for k in OWN_SETTINGS} == OWN_SETTINGS  # merged into, not replaced
        fstab = _run(sandbox, name, "cat /etc/fstab").splitlines()
        assert f"{node_settings.SWAP_FSTAB_MARK} {TEST_SWAP_LINE}" in fstab and TEST_SWAP_LINE not in fstab
        assert [line for line in fstab if f" {model} " in line] == [node_settings.fstab_entry(cluster, i)]
        assert _live_vm(sandbox, name) == {"swappiness": "1", "compaction_proactiveness": "0"}
        _run(sandbox, name, node_settings.drop_caches_command("spark"))  # what the sudoers rule allows
    # the ranks' /proc/sys/vm is their own: the host's is as it was
    assert {k: Path(f"/proc/sys/vm/{k}").read_text().strip() for k in VM_KEYS} == HOST_VM
    assert node_settings.fstab_entry(cluster, 0).startswith(f"{EXPORT} {model} none bind")
    assert node_settings.fstab_entry(cluster, 1).startswith(f"spark1:{EXPORT} {model} nfs ")


def test_second_run_changes_nothing(play, first_run, ranks):
    rc, output, recap, _ = play("second run")
    assert rc == 0, output[-3000:]
    assert {n: (r["changed"], r["failed"], r["unreachable"]) for n, r in recap.items()} == \
        {n: (0, 0, 0) for n in ranks}, output[-3000:]


def test_check_diff_shows_a_drift_and_writes_nothing(sandbox, play, first_run, ranks):  # noqa: F811
    drifted = "# edited by hand\nvm.swappiness = 60\n"
    _run(sandbox, "spark2", f"printf '{drifted}' | sudo -n tee {node_settings.SYSCTL_FILE} >/dev/null")
    rc, output, recap, _ = play("--check --diff", "--check", "--diff")
    assert rc == 0, output[-3000:]
    assert {n: r["changed"] for n, r in recap.items()} == {n: int(n == "spark2") for n in ranks}
    assert "-vm.swappiness = 60" in output and "+vm.swappiness = 1" in output
    assert _run(sandbox, "spark2", f"cat {node_settings.SYSCTL_FILE}") == drifted


def test_a_rank_that_is_down_does_not_stop_the_others(sandbox, play, first_run, ranks, cluster_file):  # noqa: F811
    """A fifth host on a closed port of a sandbox address: UNREACHABLE, the four run through."""
    cluster = load_yaml_model(cluster_file, config.Cluster, "cluster config")
    down = cluster.ranks[-1].model_copy(update={"name": "spark-down", "port": 1})
    five = cluster.model_copy(update={"ranks": [*cluster.ranks, down]})
    inv = cluster_file.with_name("inventory-down.ini")
    inv.write_text(inventory.render(five, "ini"))
    rc, output, recap, _ = play("with a rank down", inventory_path=inv)
    assert rc == 4, output[-3000:]  # ansible-playbook's exit status for unreachable hosts
    assert "UNREACHABLE" in output and "spark-down" in output
    assert recap["spark-down"]["unreachable"] == 1
    for name in ranks:
        assert (recap[name]["unreachable"], recap[name]["failed"]) == (0, 0), output[-3000:]
        assert recap[name]["ok"] > recap["spark-down"]["ok"]


def test_gpu_clock_unit_is_installed_and_removed(sandbox, play, first_run, ranks, cluster_file):  # noqa: F811
    """gpu_clock set: every rank gets the oneshot unit (node_settings' bytes; not started in the
    sandbox, whose ranks have no systemd nor driver); unset again: the unit is removed."""
    capped = config.load(cluster_file).cluster.model_copy(update={"gpu_clock": config.GpuClockSettings(max_mhz=2400)})
    command = inventory.group_vars(capped)["spark_node_gpu_clock_command"]
    unit = f"/etc/systemd/system/{node_settings.GPU_CLOCK_UNIT}"
    try:
        rc, output, recap, _ = play("gpu clock", "-e", json.dumps({"spark_node_gpu_clock_command": command}))
        assert rc == 0, output[-3000:]
        for name in ranks:
            assert task_statuses(output)[name]["GPU clock lock at every boot"] == "changed"
            assert task_statuses(output)[name]["GPU clock unit runs at boot and now"] == "skipping"
            assert _run(sandbox, name, f"stat -c '%a %U:%G' {unit}").strip() == "644 root:root"
            assert _run(sandbox, name, f"cat {unit}") == node_settings.gpu_clock_unit(0, 2400)
    finally:
        rc, output, recap, _ = play("without gpu clock")
    assert rc == 0, output[-3000:]
    for name in ranks:
        assert task_statuses(output)[name]["No GPU clock unit without gpu_clock"] == "changed"
        assert sandbox.run(name, f"test -e {unit}")[0] == 1
