"""The README's first bring-up on a bare sandbox (`sandbox up --bare`: cables at MTU 1500, no
fabric addresses, no key, a password login, Debian's netplan.io): `init` (password once, key
installed, ring discovered, an unplugged cable reported, addresses and MTU applied through
ansible/fabric.yml, cluster.yaml written, the image shipped, check run) -> check -> up, as flags
and as answers to its questions under a pty. The bare sandbox is its own (containers, subnet,
state dir): the shared one is untouched, and the bare one goes down after these tests unless
SPARKSTACK_SANDBOX_KEEP=1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

# the bare sandbox (its own containers on the local Docker engine): `sandbox` (pyproject.toml)
pytestmark = [pytest.mark.sandbox,
              pytest.mark.skipif(os.environ.get("SPARKSTACK_NO_SANDBOX") == "1", reason="needs the sandbox")]


def sparkstack(*args, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-c", "from launcher.cli.commands import main; main()", *args],
                         input=stdin, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    return res


@pytest.fixture(scope="session")
def bare_sandbox():
    """The bare sandbox's state dir, its ranks made once for the session (test_init.py and
    test_init_restore.py both use them; `bare` puts them back for each module). The environment
    names the bare sandbox only while a bare fixture is in use: the shared one's tests run between."""
    from launcher.sandbox import cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKSTACK_SANDBOX_BARE", "1")
        state = cluster.state_dir_default().resolve()
    yield state
    # only these tests use it: down even under SPARKSTACK_SANDBOX_KEEP (which keeps the shared
    # sandbox), so no sparkstack-bare-* container outlives them; SPARKSTACK_SANDBOX_BARE_KEEP=1 keeps it
    if os.environ.get("SPARKSTACK_SANDBOX_BARE_KEEP") != "1":
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SPARKSTACK_SANDBOX_BARE", "1")
            cluster.down(state, progress=lambda m: None)


@pytest.fixture(scope="module")
def bare(bare_sandbox):
    """The bare sandbox as `sandbox up --bare` leaves it: made the first time, adopted and put back
    (no key, no address, MTU 1500, every cable in) for each module after."""
    from launcher.sandbox import cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKSTACK_SANDBOX_BARE", "1")
        result = cluster.up(progress=lambda m: None)
        cluster.mend_cables(bare_sandbox)
        yield bare_sandbox, result


def test_init_on_a_bare_ring_then_check_and_up(bare, tmp_path):
    from launcher.sandbox import cluster

    state, result = bare
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    merge = tmp_path / "sandbox.yaml"  # what only the sandbox needs: its stand-in image, its limits
    merge.write_text(yaml.safe_dump({
        "images": {"base": result["images"]["vllm"], "patches_dir": str(p["patches"])},
        "container": {"gpus": None, "devices": [], "nofile": 20000, "memlock": 8 << 20, "shm_size": "1g"}}))
    cfg = tmp_path / "cluster.yaml"
    common = ["--user", "spark", "--key", str(p["key"]), "--known-hosts", str(tmp_path / "known_hosts"),
              "--profile", "sandbox", "--model-path", cluster.MODEL_PATH, "--sysfs-root", cluster.SYSFS_ROOT,
              "--merge", str(merge), "-o", str(cfg), "--yes"]
    password = p["password"].read_text()

    # a cable left unplugged: reported by ranks and ports, before anything is configured
    cut = cluster.cut_cable(3, state)
    try:
        res = sparkstack("init", *hosts, *common, "--trust-new-hosts", "--password-stdin", "--password-to-new-hosts",
                         "--dry-run", stdin=password)
    finally:
        cluster.mend_cables(state)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (f"no cable between rank 3 ({hosts[3]}) and rank 0 ({hosts[0]}): neither faces the other "
            f"(ports with no neighbour: rank 3 ({hosts[3]}) {cut.a.netdev}, rank 0 ({hosts[0]}) "
            f"{cut.b.netdev})") in res.stderr
    assert res.stderr.count("key installed (password login)") == 4
    assert "trusting new host key ssh-ed25519 SHA256:" in res.stderr
    assert not cfg.exists()

    # all cables in: the key logs in now (no password), the ring is found, addressed and shipped
    res = sparkstack("init", *hosts, *common, "--apply", "--ship")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out  # check ran inside init and passed
    assert res.stderr.count("key login works") == 4, out
    for k in range(4):
        assert f"cable: rank {min(k, (k + 1) % 4)} " in out
    assert "cabled as: ring" in out and "PROBLEM" not in out
    assert "addressing: a /30 per cable out of 192.168.177.0/24" in out and "twins: only each port's first" in out
    doc = yaml.safe_load(cfg.read_text())
    assert doc["topology"] == "ring"
    assert [r["fabric_ips"] for r in doc["ranks"]] == [
        ["192.168.177.1", "192.168.177.14"], ["192.168.177.5", "192.168.177.2"],
        ["192.168.177.9", "192.168.177.6"], ["192.168.177.13", "192.168.177.10"]]
    assert_addressed(state, doc, 9000)

    check = sparkstack("check", "-c", str(cfg))
    assert check.returncode == 0, check.stdout + check.stderr
    up = sparkstack("up", "-c", str(cfg))
    assert up.returncode == 0, up.stdout + up.stderr
    down = sparkstack("down", "-c", str(cfg))
    assert down.returncode == 0, down.stdout + down.stderr

    # a file netplan refuses never lands: its own message, named by rank, the old file kept
    from launcher.facts import cabling
    from launcher.init import bringup
    from launcher.inputs import config

    bad = [cabling.Address(0, "enp1s0f0np0", "192.168.177.1/33", False)]
    with pytest.raises(bringup.InitError) as e:
        bringup.apply_addresses(config.load(cfg), bad)
    assert f"rank 0 ({doc['ranks'][0]['name']}): spark_node : The fabric's netplan file: failed to validate" in e.value.message
    assert "Error in network definition: invalid prefix length in address '192.168.177.1/33'" in e.value.message
    assert "192.168.177.1/30" in rank_sh(state, 0, f"cat {cabling.NETPLAN_FILE}")


def rank_sh(state, rank: int, script: str) -> str:
    import docker

    from launcher.sandbox import cluster

    c = docker.from_env().containers.get(cluster.container_name(f"spark{rank + 1}"))
    res = c.exec_run(["sh", "-c", script])
    assert res.exit_code == 0, res.output.decode()
    return res.output.decode()


def assert_addressed(state, doc, mtu: int) -> None:
    """Every rank: init's netplan file (0600, as cabling renders it), and each fabric port up at
    `mtu` with its address, in `ip` and in the sysfs fixture the probe reads."""
    import json

    from launcher.facts import cabling
    from launcher.sandbox import cluster

    for r, rank in enumerate(doc["ranks"]):
        mode, text = rank_sh(state, r, f"stat -c %a {cabling.NETPLAN_FILE} && cat {cabling.NETPLAN_FILE}").split("\n", 1)
        assert mode == "600"
        assert "      mtu: %d\n" % mtu in text and text.count("addresses: [") == len(rank["fabric_ips"])
        links = json.loads(rank_sh(state, r, "ip -j addr show"))
        for ip in rank["fabric_ips"]:
            [port] = [l for l in links if any(a.get("local") == ip for a in l.get("addr_info", []))]
            assert port["mtu"] == mtu and f"{port['ifname']}:" in text
            assert rank_sh(state, r, f"cat {cluster.SYSFS_ROOT}/class/net/{port['ifname']}/mtu").strip() == str(mtu)


def test_init_on_a_bare_switch_finds_each_ranks_switch_port(bare, tmp_path):
    """Cabled to one switch instead: every rank's one cabled port (spark3's is its second) sees
    all the others; one subnet, rank r holds host r+1."""
    from launcher.sandbox import cluster

    state, _ = bare
    result = cluster.up(cabling="switch", progress=lambda m: None)
    try:
        p = cluster.paths(state)
        hosts = [r["address"] for r in result["ranks"]]
        cfg = tmp_path / "cluster.yaml"
        res = sparkstack("init", *hosts, "--user", "spark", "--key", str(p["key"]), "--known-hosts",
                         str(tmp_path / "known_hosts"), "--trust-new-hosts", "--password-stdin", "--password-to-new-hosts",
                         "--profile", "sandbox", "--model-path", cluster.MODEL_PATH, "--sysfs-root",
                         cluster.SYSFS_ROOT, "-o", str(cfg), "--yes", "--dry-run", "--json",
                         stdin=p["password"].read_text())
        assert res.returncode == 0, res.stdout + res.stderr
        import json

        got = json.loads(res.stdout)
        assert got["cabling"] == {"topology": "switch", "cables": [], "problems": [], "notes": [],
                                  "switch_ports": {"0": "enp1s0f0np0", "1": "enp1s0f0np0",
                                                   "2": "enp1s0f1np1", "3": "enp1s0f0np0"}}
        assert [a["address"] for a in got["addresses"]] == [f"192.168.177.{r + 1}/24" for r in range(4)]
        assert "    enp1s0f1np1:\n      mtu: 9000\n      addresses: [192.168.177.3/24]\n" in res.stderr
        assert not cfg.exists()  # --dry-run writes nothing
    finally:
        cluster.up(cabling="ring", progress=lambda m: None)


def test_init_asks_before_trusting_a_host_key_and_prints_the_sudoers_line_it_lacks(bare, tmp_path):
    """Interactive: an unknown host key's fingerprint is shown and, refused, nothing goes further.
    A rank whose user lacks the kit's passwordless sudo gets the exact sudoers line, named."""
    import docker
    import paramiko

    from launcher.sandbox import cluster
    from launcher.transport.remote import fingerprint

    state, result = bare
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    args = ["init", *hosts, "--user", "spark", "--key", str(p["key"]), "--known-hosts", str(tmp_path / "kh"),
            "--password-stdin", "--profile", "sandbox", "--model-path", cluster.MODEL_PATH,
            "--sysfs-root", cluster.SYSFS_ROOT, "-o", str(tmp_path / "cluster.yaml"), "--dry-run"]
    password = p["password"].read_text()
    res = sparkstack(*args, stdin=password + "n\n")
    host_key = paramiko.Ed25519Key.from_path(p["ranks"] / "spark1" / "ssh" / "ssh_host_ed25519_key")
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"unknown host key {fingerprint(host_key)}. Trust it?" in res.stderr
    assert f"host key {fingerprint(host_key)} not trusted" in res.stderr
    assert not (tmp_path / "kh").exists()

    rank = docker.from_env().containers.get(cluster.container_name("spark2"))
    assert rank.exec_run(["rm", "/etc/sudoers.d/spark"]).exit_code == 0
    try:
        res = sparkstack(*args, "--trust-new-hosts", "--yes", "--password-to-new-hosts", stdin=password)
    finally:
        cluster.up(progress=lambda m: None)  # the rank as before init again, its sudo back
    assert res.returncode == 0, res.stdout + res.stderr
    assert (f"rank 1 ({hosts[1]}): spark cannot run the kit's commands with `sudo -n`; add this line with "
            "`sudo visudo -f /etc/sudoers.d/sparkstack-drop-caches`:\n  spark ALL=(root) NOPASSWD: "
            "/usr/sbin/sysctl -w vm.drop_caches=3, /usr/sbin/sysctl -w vm.compact_memory=1") in res.stderr
    assert res.stderr.count("cannot run the kit's commands") == 1


def test_init_asks_its_questions_under_a_pty_then_check_and_up_pass(bare, tmp_path):
    """A person at a terminal: the profile and checkpoint path asked, each new host key's
    fingerprint asked about, the password asked once for all four ranks (getpass: no echo), the
    proposal shown and applied when confirmed, the image shipped when confirmed; init's check
    passes, then `check` and `up` do."""
    import io
    import re

    import pexpect

    from launcher.sandbox import cluster

    state, _ = bare
    result = cluster.up(progress=lambda m: None)  # the ranks as before init: no key, no address, MTU 1500
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    assert '"mtu":1500' in rank_sh(state, 0, "ip -j link show enp1s0f0np0").replace(" ", "")
    merge = tmp_path / "sandbox.yaml"
    merge.write_text(yaml.safe_dump({
        "images": {"base": result["images"]["vllm"], "patches_dir": str(p["patches"])},
        "container": {"gpus": None, "devices": [], "nofile": 20000, "memlock": 8 << 20, "shm_size": "1g"}}))
    cfg = tmp_path / "cluster.yaml"
    child = pexpect.spawn(sys.executable, ["-c", "from launcher.cli.commands import main; main()", "init", *hosts,
                                           "--user", "spark", "--key", str(p["key"]), "--known-hosts",
                                           str(tmp_path / "known_hosts"), "--sysfs-root", cluster.SYSFS_ROOT,
                                           "--merge", str(merge), "-o", str(cfg)],
                          encoding="utf-8", timeout=120, dimensions=(50, 400))
    seen = io.StringIO()
    child.logfile_read = seen
    password = p["password"].read_text().strip()
    try:
        child.expect(r"profile \(.*sandbox.*\) \[keys-1m-dcp4\]: ")
        child.sendline("sandbox")
        child.expect(r"checkpoint directory \(the same path on every rank\): ")
        child.sendline(cluster.MODEL_PATH)
        for host in hosts:
            child.expect(re.escape(f"rank {hosts.index(host)} ({host}): unknown host key ssh-ed25519 SHA256:")
                         + r"\S+\. "
                         r"Trust it\? \[y/N\]: ")
            child.sendline("y")
            if host == hosts[0]:
                child.expect(r"password \(asked once, to install the key; not stored\): ")
                child.sendline(password)
            else:  # a key trusted just now: asked before the password goes there (issue 33, item 9)
                child.expect(re.escape(f"rank {hosts.index(host)} ({host}): its host key ssh-ed25519 SHA256:")
                             + r"\S+ was trusted just now; send it the password given for "
                             + re.escape(f"spark@{hosts[0]}?") + r" \[y/N\]: ")
                child.sendline("y")
        child.expect(r"write /etc/netplan/60-sparkstack-fabric\.yaml on every rank and apply these addresses "
                     r"now\? \[Y/n\]: ")
        child.sendline("y")
        child.expect(r"put the serving image on every rank now .*\? \[Y/n\]: ")
        child.sendline("")
        child.expect(pexpect.EOF, timeout=600)
    finally:
        child.close()
    out = seen.getvalue()
    assert child.exitstatus == 0, out
    assert "Traceback" not in out and password not in out  # getpass: the password is not echoed
    assert out.count("password (asked once") == 1 and out.count("key installed (password login)") == 4
    assert "twins: only each port's first netdev addressed" in out and "MTU 9000 on every fabric port" in out
    assert (tmp_path / "known_hosts").read_text().count("ssh-ed25519") == 4
    doc = yaml.safe_load(cfg.read_text())
    assert doc["profile"] == "sandbox" and doc["model"]["path"] == cluster.MODEL_PATH
    assert_addressed(state, doc, 9000)
    for cmd in ("check", "up", "down"):
        res = sparkstack(cmd, "-c", str(cfg))
        assert res.returncode == 0, res.stdout + res.stderr


def test_a_two_rank_ring_of_two_cables_then_one(bare, tmp_path):
    """Two Sparks cabled port to port twice (the sandbox's 2-rank ring): both cables found and a
    /31 each when asked; with one cable pulled the other is enough, and init says so. Last in
    this module: the bare sandbox goes down after it (no need to lay four ranks again)."""
    import json

    from launcher.sandbox import cluster

    state, _ = bare
    result = cluster.up(ranks=2, progress=lambda m: None)
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    merge = tmp_path / "tp2.yaml"  # the sandbox profile serves at TP 4: two ranks serve at TP 2
    merge.write_text(yaml.safe_dump({"overrides": {"engine_args": ["--tensor-parallel-size 2",
                                                                   "--decode-context-parallel-size 2"]}}))
    args = ["init", *hosts, "--merge", str(merge), "--user", "spark", "--key", str(p["key"]), "--known-hosts", str(tmp_path / "kh"),
            "--trust-new-hosts", "--password-stdin", "--password-to-new-hosts", "--profile", "sandbox",
            "--model-path", cluster.MODEL_PATH,
            "--sysfs-root", cluster.SYSFS_ROOT, "-o", str(tmp_path / "cluster.yaml"), "--yes", "--dry-run",
            "--json", "--prefix", "31"]
    res = sparkstack(*args, stdin=p["password"].read_text())
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout)
    assert got["cabling"]["topology"] == "ring" and got["cabling"]["problems"] == []
    assert [(c["a"], c["b"]) for c in got["cabling"]["cables"]] == [
        ({"rank": 0, "netdev": "enp1s0f0np0"}, {"rank": 1, "netdev": "enp1s0f1np1"}),
        ({"rank": 0, "netdev": "enp1s0f1np1"}, {"rank": 1, "netdev": "enp1s0f0np0"})]
    assert [(a["rank"], a["netdev"], a["address"]) for a in got["addresses"]] == [
        (0, "enp1s0f0np0", "192.168.177.0/31"), (0, "enp1s0f1np1", "192.168.177.2/31"),
        (1, "enp1s0f0np0", "192.168.177.3/31"), (1, "enp1s0f1np1", "192.168.177.1/31")]
    assert "addressing: a /31 per cable out of 192.168.177.0/24 (/31: RFC 3021" in res.stderr

    cluster.cut_cable(1, state, n=2)
    res = sparkstack(*args, stdin="")
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout)
    assert len(got["cabling"]["cables"]) == 1 and got["cabling"]["problems"] == []
    assert got["cabling"]["notes"] == [f"rank 0 ({hosts[0]}) and rank 1 ({hosts[1]}) share one cable: enough "
                                       "for two ranks; a second one between their other ports doubles the "
                                       "fabric's bandwidth"]
