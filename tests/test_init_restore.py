"""init undoable (issue 30) on the bare sandbox: `init --apply` journals every rank first (its
netplan file absent, or the owner's own; each fabric port's MTU and addresses), a second init keeps
the first journal's "before", and `restore` puts every rank back byte for byte: files, modes,
owners, addresses, MTUs. Uses test_init.py's bare sandbox fixture (its own containers and subnet;
made once a session, put back for each module); run under `flock /tmp/sparkstack-bare.lock`."""

from __future__ import annotations

import base64
import json
import os
import time

import pytest
import yaml

from test_init import bare, bare_sandbox, rank_sh, sparkstack  # noqa: F401  (the bare sandbox fixtures and helpers)

# the bare sandbox (its own containers on the local Docker engine): `sandbox` (pyproject.toml)
pytestmark = [pytest.mark.sandbox,
              pytest.mark.skipif(os.environ.get("SPARKSTACK_NO_SANDBOX") == "1", reason="needs the sandbox")]

NETDEVS = ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")
END = "END-OF-OUTPUT"
OWN = b"# the owner's own fabric file, kept byte for byte\n\xc3\xa9 network:\n  version: 2\n"


def snapshot(state, rank: int) -> dict:
    """What init changes on a rank, read with the rank's own tools: the netplan file's bytes,
    mode and owner (or absent), and each CX7 port's MTU, link flags and IPv4 addresses, in `ip`
    and in the sysfs fixture the probe reads."""
    from launcher.facts import cabling
    from launcher.sandbox import cluster

    f = cabling.NETPLAN_FILE
    head = read_sh(state, rank, f"if [ -e {f} ]; then stat -c '%a %U %G' {f}; base64 -w0 {f}; else echo absent; fi")
    links = json.loads(read_sh(state, rank, "ip -j addr show"))
    ports = {}
    for link in links:
        if link["ifname"] in NETDEVS:
            sysfs = read_sh(state, rank, f"cat {cluster.SYSFS_ROOT}/class/net/{link['ifname']}/mtu").strip()
            ports[link["ifname"]] = (link["mtu"], sysfs, "UP" in link["flags"],
                                     [(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"])
    return {"file": head, "ports": ports}


def read_sh(state, rank: int, script: str) -> str:
    """A read-only `script`'s output on the rank. Under this host's load `docker exec` has handed
    back an empty output with exit status 0 (seen for `cat` and `ip -j`): the output must end with
    a marker, else the script is run again."""
    for _ in range(3):
        text = rank_sh(state, rank, f"{script}; echo {END}")
        if text.endswith(END + "\n"):
            return text[:-len(END) - 1]
        time.sleep(1)
    raise AssertionError(f"rank {rank}: `{script}` printed nothing three times")


def snapshots(state, n: int = 4) -> list[dict]:
    time.sleep(0.5)  # the kernel's stand-in copies `ip`'s MTU into the sysfs fixture every 0.1 s
    return [snapshot(state, r) for r in range(n)]


def test_init_then_restore_puts_every_rank_back_byte_for_byte(bare, tmp_path, monkeypatch):  # noqa: F811
    from launcher.facts import cabling
    from launcher.plan import init_journal
    from launcher.sandbox import cluster

    state, result = bare  # the ranks as before init: no key, no address, MTU 1500
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # this host's copies, the test's own
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    # rank 1 had its own file where init writes (other bytes, mode, owner); rank 3 a port at MTU 1400
    rank_sh(state, 1, f"echo {base64.b64encode(OWN).decode()} | base64 -d > {cabling.NETPLAN_FILE} && "
                      f"chown spark:spark {cabling.NETPLAN_FILE} && chmod 640 {cabling.NETPLAN_FILE}")
    rank_sh(state, 3, "ip link set dev enp1s0f1np1 mtu 1400")
    before = snapshots(state)
    assert before[1]["file"] == f"640 spark spark\n{base64.b64encode(OWN).decode()}"
    assert [b["file"] for b in before].count("absent\n") == 3
    assert before[3]["ports"]["enp1s0f1np1"][:2] == (1400, "1400")

    cfg = tmp_path / "cluster.yaml"
    common = ["--user", "spark", "--key", str(p["key"]), "--known-hosts", str(tmp_path / "known_hosts"),
              "--profile", "sandbox", "--model-path", cluster.MODEL_PATH, "--sysfs-root", cluster.SYSFS_ROOT,
              "-o", str(cfg), "--yes", "--apply", "--no-ship", "--no-check", "--force"]
    res = sparkstack("init", *hosts, *common, "--trust-new-hosts", "--password-stdin", "--password-to-new-hosts",
                     stdin=p["password"].read_text())
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr.count(f"{init_journal.RANK_PATH} there, ") == 4, res.stderr
    applied = snapshots(state)
    assert all(a["file"].startswith("600 root root\n") for a in applied)
    assert all(a != b for a, b in zip(applied, before))
    first = json.loads(read_sh(state, 1, f"cat {init_journal.RANK_PATH}"))
    assert first["files"][cabling.NETPLAN_FILE]["content_b64"] == base64.b64encode(OWN).decode()
    assert read_sh(state, 1, f"stat -c '%a %U' {init_journal.RANK_PATH}") == "600 root\n"

    # init again on the journaled ranks: the first journal's before stays, this run is added to it
    res = sparkstack("init", *hosts, *common)
    assert res.returncode == 0, res.stdout + res.stderr
    second = json.loads(read_sh(state, 1, f"cat {init_journal.RANK_PATH}"))
    assert (second["files"], second["ports"], second["created"]) == (first["files"], first["ports"], first["created"])
    assert len(second["runs"]) == 2
    copy = tmp_path / "state" / "sparkstack" / "init-journals" / f"{hosts[1]}.json"
    assert json.loads(copy.read_text()) == second

    # --dry-run: exactly what goes back, per rank; nothing changes
    res = sparkstack("restore", "-c", str(cfg), "--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(cfg.read_text())
    names = [r["name"] for r in doc["ranks"]]
    got = res.stdout
    assert f"  remove {cabling.NETPLAN_FILE} (init created it)\n" in got
    sha = first["files"][cabling.NETPLAN_FILE]["sha256"]
    assert (f"  write back {cabling.NETPLAN_FILE}: {len(OWN)} bytes (sha256 {sha[:16]}), mode 0640, "
            "owner spark:spark\n") in got
    ips = [r["fabric_ips"] for r in doc["ranks"]]
    assert f"  enp1s0f1np1: MTU 9000 -> 1400\n" in got
    for r in range(4):
        assert f"rank {r} ({names[r]}): journal of {first['created']} (kept on the rank): " in got
        for ip in ips[r]:
            assert f": remove {ip}/30\n" in got
    assert got.count(f"remove {cabling.NETPLAN_FILE}") == 3
    assert snapshots(state) == applied

    # all ranks or none: one rank's journal unreadable, and no rank is changed
    journal_file = init_journal.RANK_PATH
    rank_sh(state, 3, f"cp {journal_file} /root/journal && echo '{{' > {journal_file}")
    res = sparkstack("restore", "-c", str(cfg))
    assert res.returncode == 1, res.stdout + res.stderr
    assert (f"restore changed nothing, because:\nerror: rank 3 ({names[3]}): {journal_file}: unreadable (Expecting "
            "property name enclosed in double quotes: line 2 column 1 (char 2)): not a journal this sparkstack can "
            "read; move it aside (this host's copy then stands in), then restore again") in res.stderr, res.stderr
    assert snapshots(state) == applied
    # the rank's journal gone: this host's copy stands in (and is set aside once the rank is back)
    rank_sh(state, 3, f"rm {journal_file}")
    res = sparkstack("restore", "-c", str(cfg), "--dry-run")
    assert f"rank 3 ({names[3]}): journal of {first['created']} (this host's copy: the rank has none): " in res.stdout

    res = sparkstack("restore", "-c", str(cfg), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["applied"] and [r["differences"] for r in report["ranks"]] == [[]] * 4
    assert snapshots(state) == before  # every rank byte for byte as before init
    retired = read_sh(state, 0, "ls /var/lib/sparkstack")
    assert "init-journal.json.restored-" in retired and "init-journal.json\n" not in retired
    copies = sorted(p.name for p in copy.parent.iterdir())
    assert len(copies) == 4 and all(".json.restored-" in name for name in copies), copies

    # nothing left to restore: said so, nothing changed
    res = sparkstack("restore", "-c", str(cfg))
    assert res.returncode == 1 and "no rank has an init journal" in res.stderr, res.stdout + res.stderr
