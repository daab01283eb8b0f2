"""`sparkstack prep`: the plan of each rank (pure), then applying it to the sandbox's ranks.

The sandbox kernel has no NFS, so the NFS mount is tested as a plan; the NFS server's own bind
mount runs for real inside a rank.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.inputs import config, node_settings
from launcher.gather import probe as gather
from launcher.apply import prep
from launcher.cli.commands import main
from serving import rank_user
from launcher.facts.gpu import GpuClocks
from launcher.facts.memory import Memory
from launcher.facts.mounts import Mount
from launcher.sandbox import meminfo

GIB = 1 << 30


def nfs(d):
    d["model"].update(path="/models/glm53", nfs={"server": "spark1", "export": "/srv/glm53"})


@pytest.fixture
def spark_facts():
    """Facts of a freshly booted Spark: wrong sysctls, nothing mounted, 40 GiB page cache."""
    from test_check import healthy  # noqa: PLC0415  (the same fixture-fact builder)
    from test_fabric import spark

    f = healthy(spark({"enp1s0f0np0": "192.168.177.1"}), 0,
                memory=Memory(127_600_000 * 1024, 110 * GIB, 70 * GIB, 40 * GIB, 0, 0, 0))
    return dataclasses.replace(f, sysctls={"vm.swappiness": "60", "vm.compaction_proactiveness": "0"})


# --- the plan (pure) ----------------------------------------------------------------------------

def test_plan_sets_only_what_differs_then_drops(write_config, spark_facts):
    loaded = config.load(write_config())
    steps = prep.plan_rank(loaded, 1, spark_facts)
    assert [(s.name, s.needed) for s in steps] == [
        ("vm.compaction_proactiveness=0", False), ("vm.swappiness=1", True), ("drop caches", True)]
    assert steps[1].command == "sysctl -q -w vm.swappiness=1" and steps[1].detail == "was 60"
    assert steps[2].command == node_settings.DROP_CACHES_COMMAND and not steps[2].root
    assert "40.0 GiB page cache" in steps[2].detail


def test_sysctl_overrides_come_from_node_settings(write_config, spark_facts, monkeypatch):
    loaded = config.load(write_config())
    monkeypatch.setattr(node_settings, "BASE_SYSCTLS", {**node_settings.BASE_SYSCTLS, "vm.max_map_count": 1048576})
    names = [s.name for s in prep.sysctl_steps(loaded, spark_facts)]
    assert "vm.max_map_count=1048576" in names


def test_nfs_mount_on_clients_bind_mount_on_the_server(write_config, spark_facts):
    loaded = config.load(write_config(nfs))
    client = prep.mount_step(loaded, 2, spark_facts)
    assert client.needed and client.command == ("mkdir -p /models/glm53 && mount -t nfs -o ro,soft,timeo=600,retrans=2,noatime "
                                                "spark1:/srv/glm53 /models/glm53")
    server = prep.mount_step(loaded, 0, spark_facts)  # spark1 serves the export: seed 000's gotcha
    assert server.command == "mkdir -p /models/glm53 && mount --bind /srv/glm53 /models/glm53"
    # the same source of truth as the fstab line Ansible writes
    assert node_settings.fstab_entry(loaded.cluster, 0).startswith("/srv/glm53 /models/glm53 none bind")
    mounted = dataclasses.replace(spark_facts, model_mount=Mount("/models/glm53", "spark1:/srv/glm53", "nfs4", "ro"))
    again = prep.mount_step(loaded, 2, mounted)
    assert not again.needed and again.detail == "spark1:/srv/glm53 (nfs4) on /models/glm53"
    steps = prep.plan_rank(loaded, 2, spark_facts)
    assert [s.name.split()[0] for s in steps][-2:] == ["mount", "drop"]  # mount before the drop


def test_swap_off_when_the_profile_or_config_says_no_swap(write_config, spark_facts):
    """Seed 001's profiles say no swap: a rank with swap gets `swapoff -a` and its fstab swap
    lines commented out, as a root step before the drop; a rank without swap is left as it is;
    keys-1m-dcp4 (seed 000, silent on swap) touches no swap unless overrides.no_swap asks."""
    swapped = dataclasses.replace(spark_facts, memory=dataclasses.replace(
        spark_facts.memory, swap_total=16 * GIB, swap_free=15 * GIB))
    keys35 = config.load(write_config(lambda d: d.update(profile="keys35-200k")))
    steps = prep.plan_rank(keys35, 1, swapped)
    assert [s.name for s in steps][-2:] == ["swap off", "drop caches"]
    swap = steps[-2]
    assert swap.needed and swap.root and swap.detail == "16.0 GiB swap"
    assert swap.command == node_settings.swap_off_command() and swap.command.startswith("swapoff -a && sed -ri ")
    without = prep.swap_step(keys35, spark_facts)  # SwapTotal 0
    assert not without.needed and without.detail == "no swap"
    keys = config.load(write_config())
    assert prep.swap_step(keys, swapped) is None
    asked = config.load(write_config(lambda d: d["overrides"].update(no_swap=True)))
    assert prep.swap_step(asked, swapped).needed
    allowed = config.load(write_config(lambda d: d.update(profile="keys35-200k") or
                                       d["overrides"].update(no_swap=False)))
    assert prep.swap_step(allowed, swapped) is None


def test_gpu_clock_lock_is_a_root_step_until_recorded_and_reset_once_unset(write_config, spark_facts):
    """gpu_clock: `nvidia-smi -lgc MIN,MAX`, recorded where check reads it; a rank that records
    the same lock has nothing to do; without gpu_clock a recorded lock is reset (-rgc)."""
    capped = config.load(write_config(lambda d: d.update(gpu_clock={"max_mhz": 2400})))
    steps = prep.plan_rank(capped, 1, spark_facts)
    assert [s.name for s in steps][-2:] == ["gpu clock 0,2400 MHz", "drop caches"]
    lock = steps[-2]
    assert lock.needed and lock.root and lock.detail == "no lock recorded"
    assert lock.command == node_settings.gpu_clock_command(0, 2400)
    assert "nvidia-smi -lgc 0,2400 && mkdir -p /run/sparkstack && echo 0,2400 > /run/sparkstack/gpu-clock" in lock.command
    applied = dataclasses.replace(spark_facts, gpu_clocks=GpuClocks(2400, 3003, (0, 2400)))
    assert not prep.gpu_clock_step(capped, applied).needed
    locked = config.load(write_config(lambda d: d.update(gpu_clock={"lock_mhz": 2000})))
    assert prep.gpu_clock_step(locked, applied).name == "gpu clock 2000,2000 MHz"
    assert prep.gpu_clock_step(locked, applied).needed
    unset = config.load(write_config())
    reset = prep.gpu_clock_step(unset, applied)
    assert reset.needed and reset.name == "gpu clock reset" and "nvidia-smi -rgc && rm -f /run/sparkstack/gpu-clock" in reset.command
    assert prep.gpu_clock_step(unset, spark_facts) is None


def test_gpu_clock_without_nvidia_smi_fails_with_the_cause():
    """What the root script reports on a rank with no driver (a sandbox rank)."""
    import subprocess

    steps = [prep.Step("gpu clock 0,2400 MHz", node_settings.gpu_clock_command(0, 2400), True, "")]
    out = subprocess.run(["sh", "-c", prep.root_script(steps)], capture_output=True, text=True,
                         env={"PATH": "/nonexistent:/usr/bin:/bin"}).stdout
    rp = prep.RankPrep(0, "x", steps)
    prep._record(rp, steps, out)
    assert rp.failed == ["gpu clock 0,2400 MHz: nvidia-smi not found: no NVIDIA driver on this rank"]


@pytest.mark.parametrize("given, error", [
    ({"lock_mhz": 2000, "max_mhz": 2400}, "give lock_mhz (one clock) or max_mhz (a cap), not both or neither"),
    ({}, "give lock_mhz (one clock) or max_mhz (a cap), not both or neither"),
    ({"max_mhz": 1000, "min_mhz": 2000}, "min_mhz 2000 is above max_mhz 1000"),
    ({"lock_mhz": 2000, "min_mhz": 100}, "min_mhz goes with max_mhz"),
    ({"lock_mhz": 0}, "gpu_clock.lock_mhz"),
])
def test_gpu_clock_config_errors(write_config, given, error):
    with pytest.raises(config.ConfigError, match=re.escape(error)):
        config.load(write_config(lambda d: d.update(gpu_clock=given)))


def test_no_mount_without_nfs(write_config, spark_facts):
    assert prep.mount_step(config.load(write_config()), 0, spark_facts) is None


def test_root_script_reports_each_step():
    steps = [prep.Step("a", "true", True, ""), prep.Step("b", "echo no >&2; false", True, "")]
    script = prep.root_script(steps)
    import subprocess

    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    rp = prep.RankPrep(0, "x", steps)
    prep._record(rp, steps, out)
    assert rp.changed == ["a"] and rp.failed == ["b: no"]


# --- on the sandbox -----------------------------------------------------------------------------

@pytest.fixture
def loaded(sandbox):
    return config.load(sandbox.config)


def read_sysctl(sandbox, name, key):
    return sandbox.run(name, f"cat /proc/sys/{key.replace('.', '/')}")[1].strip()


def test_prep_sets_sysctls_on_every_rank_then_reports_them_already_set(sandbox, loaded):
    for name in sandbox.names:  # ranks' /proc/sys/vm is their own copy: safe to change
        sandbox.run(name, "sudo sysctl -q -w vm.swappiness=60 vm.compaction_proactiveness=20")
        meminfo.fill_page_cache(sandbox.state_dir, name, 200 * GIB)  # as after a checkpoint read
    since = time.time() - 1
    first = prep.run(loaded)
    assert first.ok, first.to_json()
    for r in first.ranks:
        assert set(r.changed) == {"vm.swappiness=1", "vm.compaction_proactiveness=0", "drop caches"}
        assert r.mem_available >= first.need
        # memory came back because the drop emptied the page cache (the rank's sandbox kernel)
        meminfo.settle(sandbox.state_dir, r.host)  # its daemon takes the drop in within 0.1 s
        fields = meminfo.read(sandbox.state_dir, r.host)
        assert fields["Cached"] < 1 << 20 and fields["MemFree"] > 100 << 20, (r.host, fields)
        assert ("drop_caches", "3") in [e[1:] for e in meminfo.events(sandbox.state_dir, r.host, since)]
    for name in sandbox.names:
        assert read_sysctl(sandbox, name, "vm.swappiness") == "1"
        assert read_sysctl(sandbox, name, "vm.compaction_proactiveness") == "0"
    result = CliRunner().invoke(main, ["prep", "-c", str(sandbox.config), "--json"])
    assert result.exit_code == 0, result.output
    second = json.loads(result.output)
    for r in second["ranks"]:
        assert r["changed"] == ["drop caches"]
        assert r["already"] == ["vm.compaction_proactiveness=0", "vm.swappiness=1"]


def test_prepare_over_an_open_group_for_up(sandbox, loaded):
    with gather.open_group(loaded) as group:
        report = prep.prepare(loaded, group)
    report.raise_for_failures()  # nothing failed: no error
    assert report.ok and [r.rank for r in report.ranks] == [0, 1, 2, 3]


def test_raise_for_failures_names_rank_and_cause():
    report = prep.PrepReport([prep.RankPrep(0, "spark1", []),
                              prep.RankPrep(1, "spark2", [], failed=["vm.swappiness=1: permission denied"])], None)
    with pytest.raises(prep.PrepError) as e:
        report.raise_for_failures()
    assert e.value.message == "prep failed on 1 of 2 ranks:\nrank 1 (spark2): vm.swappiness=1: permission denied"


@pytest.fixture
def squeezed(sandbox):
    """spark3's MemAvailable down to 10 GiB (a squeeze of its sandbox memory); restorable."""
    meminfo.squeeze_available(sandbox.state_dir, "spark3", 10 * GIB)
    try:
        yield lambda: meminfo.unsqueeze(sandbox.state_dir, "spark3")
    finally:
        meminfo.unsqueeze(sandbox.state_dir, "spark3")


def test_wait_for_memory_shows_progress_until_it_is_back(sandbox, loaded, squeezed):
    said = []
    threading.Timer(1.5, squeezed).start()  # memory "comes back" after the drop
    with gather.open_group(loaded) as group:
        started = time.monotonic()
        seen = prep.wait_for_memory(group, [0, 1, 2, 3], 30 * GIB, timeout=30, say=said.append, poll=0.3)
    assert 1.0 < time.monotonic() - started < 20
    assert all(v >= 30 * GIB for v in seen.values())
    assert said and all("rank 2 (spark3) 10.0 GiB" in line for line in said)
    assert "waiting for MemAvailable ≥ 30.0 GiB" in said[0]


def test_wait_for_memory_times_out_naming_the_rank(sandbox, loaded, squeezed):
    with gather.open_group(loaded) as group:
        with pytest.raises(prep.PrepError) as e:
            prep.wait_for_memory(group, [0, 1, 2, 3], 30 * GIB, timeout=1, poll=0.3)
    assert "rank 2 (spark3): MemAvailable 10.0 GiB < 30.0 GiB needed" in e.value.message
    assert "fix:" in e.value.message


NOSUDO = "sparkstack-nosudo"


@pytest.fixture
def nosudo_on_spark3(sandbox):
    """A user on spark3 with no sudo rule at all, who logs in with the sandbox's key; removed after."""
    with rank_user(sandbox, "spark3", NOSUDO) as user:
        yield user


def test_without_sudo_a_clear_error_names_the_rank(sandbox, nosudo_on_spark3, tmp_path):
    """`sparkstack prep` as a user whose real `sudo -n` refuses (no sudoers rule) on spark3:
    exit 1, that rank named with sudo's own words and the fix; nothing changed there."""
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc["ranks"][2]["user"] = nosudo_on_spark3
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    keys = ("vm.swappiness", "vm.compaction_proactiveness")
    before = {n: {k: read_sysctl(sandbox, n, k) for k in keys} for n in sandbox.names}
    sandbox.run("spark3", "sudo sysctl -q -w vm.swappiness=60")  # a root step prep needs there
    try:
        assert sandbox.run("spark3", "sudo -n true", user=nosudo_on_spark3)[0] == 1  # the real refusal
        result = CliRunner().invoke(main, ["prep", "-c", str(cfg), "--no-drop"])
        assert result.exit_code == 1, result.output
        assert ("rank 2 (spark3): prep needs root and `sudo -n` was refused for sparkstack-nosudo "
                "(sudo: a password is required). Fix: give sparkstack-nosudo passwordless sudo, "
                "or connect as root (ranks[2].user)") in " ".join(result.output.split())
        assert read_sysctl(sandbox, "spark3", "vm.swappiness") == "60"
    finally:
        for name, values in before.items():
            sandbox.run(name, "sudo sysctl -q " + " ".join(f"-w {k}={v}" for k, v in values.items()))


def test_relief_sudo_check_passes_only_with_both_commands_allowed(sandbox, nosudo_on_spark3):
    """The load-time watcher's pre-flight (node_settings.relief_sudo_check_command) against real
    sudo: it fails for a user with no rule, and for one with only the old drop-caches rule, and
    passes once the rule allows exactly both commands without a password."""
    user, rule = nosudo_on_spark3, "/etc/sudoers.d/sparkstack-test-relief"
    check_relief = node_settings.relief_sudo_check_command(user)

    def install(text: str) -> None:
        rc, out, err = sandbox.run("spark3", f"printf %s {shlex.quote(text)} | sudo -n tee {rule} >/dev/null && "
                                             f"sudo -n chmod 0440 {rule} && sudo -n visudo -cf {rule}")
        assert rc == 0, err or out

    try:
        assert sandbox.run("spark3", check_relief, user=user)[0] != 0  # no rule at all
        install(f"{user} ALL=(root) NOPASSWD: {node_settings.DROP_CACHES_SUDO}\n")
        assert sandbox.run("spark3", check_relief, user=user)[0] != 0  # the drop alone is not enough
        install(node_settings.sudoers_file(user))
        rc, out, err = sandbox.run("spark3", check_relief, user=user)
        assert rc == 0, err or out
        assert sandbox.run("spark3", "sudo -n /usr/sbin/sysctl -w vm.swappiness=1", user=user)[0] != 0  # nothing else
    finally:
        sandbox.run("spark3", f"sudo -n rm -f {rule}")


def test_bind_mount_on_the_nfs_servers_own_rank(sandbox, tmp_path):
    """spark1 serves the export: prep bind-mounts it at model.path there, for real."""
    export, path = "/srv/sparkstack-test-export", "/srv/sparkstack-test-model"
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc["model"].update(path=path, nfs={"server": "spark1", "export": export})
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    loaded = config.load(cfg)
    assert sandbox.run("spark1", f"sudo mkdir -p {export} && echo hi | sudo tee {export}/config.json >/dev/null")[0] == 0
    try:
        with gather.open_group(loaded) as group:
            conn = group.connections[0]
            f = gather.probe_rank(conn, loaded).facts
            steps = prep.plan_rank(loaded, 0, f, drop=False)
            mount = next(s for s in steps if s.name.startswith("mount"))
            assert mount.needed and "mount --bind" in mount.command
            rp = prep.apply_rank(conn, prep.RankPrep(0, "spark1", steps))
            assert rp.error is None and not rp.failed, rp
            assert mount.name in rp.changed
            assert sandbox.run("spark1", f"cat {path}/config.json")[1].strip() == "hi"
            again = prep.plan_rank(loaded, 0, gather.probe_rank(conn, loaded).facts, drop=False)
            assert not next(s for s in again if s.name.startswith("mount")).needed
    finally:
        sandbox.run("spark1", f"sudo umount {path} 2>/dev/null; sudo rm -rf {path} {export}")


def test_gpu_clock_on_ranks_without_a_driver_fails_each_rank_with_the_cause(sandbox, tmp_path):
    """gpu_clock asked of the sandbox's ranks, which have no NVIDIA driver: `prep` fails every
    rank naming the cause (nvidia-smi not there), changes nothing else, and `check`'s gpu clock
    row fails: the lock is not applied."""
    from launcher.apply import preflight

    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc["gpu_clock"] = {"lock_mhz": 2000}
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["prep", "-c", str(cfg), "--no-drop", "--json"])
    assert result.exit_code == 1, result.output
    doc, end = json.JSONDecoder().raw_decode(result.output)
    assert "error: prep failed on rank 0, rank 1, rank 2, rank 3" in result.output[end:]
    ranks = doc["ranks"]
    assert [r["failed"] for r in ranks] == [["gpu clock 2000,2000 MHz: nvidia-smi not found: no NVIDIA "
                                             "driver on this rank"]] * 4
    report = preflight.run(config.load(cfg), image=sandbox.images["vllm"])
    got = next(c for c in report.ranks[1].checks if c.name == "gpu clock")
    assert (got.status, got.value) == ("fail", "gpu_clock asks 2000,2000 MHz, the rank has no lock recorded")
