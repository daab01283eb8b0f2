"""`sparkstack init`'s steps after the logins: probe every rank, discover the cabling from the
neighbours of each CX7 port, propose (and, asked to, apply) the fabric addresses, write
cluster.yaml. Each step's logic is pure (launcher/facts/cabling.py); here is the remote part.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import onrank, resources
from ..facts import cabling as cabling_mod
from ..inputs import config as config_mod
from ..plan import inventory
from ..gather import probe
from .hosts import InitError

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass
class Answers:
    """Everything init needs besides the hosts: each is a flag, else asked."""
    user: str
    key: Path
    known_hosts: Path
    profile: str
    model_path: str
    output: Path
    fabric_net: str = cabling_mod.DEFAULT_FABRIC_NET
    sysfs_root: str = "/"
    extra: dict = field(default_factory=dict)  # --merge: more of cluster.yaml (container:, images:)


def split_host(host: str) -> tuple[str, int]:
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    return (name, int(port)) if port.isdigit() else (host, 22)


def rank_doc(i: int, host: str, a: Answers, name: str | None = None, ips=()) -> dict:
    address, port = split_host(host)
    label = name if name and _LABEL.match(name) else (address if _LABEL.match(address) else f"rank{i}")
    doc = {"name": label, "address": address, "port": port, "user": a.user, "key": str(a.key)}
    if ips:
        doc["fabric_ips"] = list(ips)
    if a.sysfs_root != "/":
        doc["sysfs_root"] = a.sysfs_root
    return doc


def provisional(hosts: list[str], a: Answers, topology: str = "switch") -> dict:
    """A config enough to probe with: the ranks, no fabric IPs yet."""
    return {"profile": a.profile, "topology": topology, "ssh": {"known_hosts": str(a.known_hosts)},
            "ranks": [rank_doc(i, h, a) for i, h in enumerate(hosts)],
            "model": {"path": a.model_path}, **a.extra}


def load_doc(doc: dict, where: Path) -> config_mod.Loaded:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=where, delete=False) as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    path = Path(f.name)
    try:
        return config_mod.load(path)
    finally:
        path.unlink()


def probe_all(loaded) -> dict:
    """{rank: Facts}; a rank whose probe failed ends init with its own message."""
    with probe.open_group(loaded) as group:
        got = probe.gather(group, loaded)
    bad = [rf.error for rf in got.values() if not rf.ok]
    if bad:
        raise InitError("the probe failed:\n" + "\n".join(bad))
    return probe.facts_of(got)


def declared_sysfs_root(all_facts: dict, a: Answers) -> str | None:
    """The fixture sysfs root every rank declared (sandbox ranks do; onrank/probe.py's
    STANDIN_HARDWARE), when none was given: it goes into cluster.yaml as `--sysfs-root` would."""
    roots = {f.sysfs_root for f in all_facts.values()}
    if a.sysfs_root != "/" or len(roots) != 1 or roots == {"/"}:
        return None
    return roots.pop()


def neighbours(loaded, all_facts: dict) -> dict:
    """{rank: {netdev: [MAC] or None}} from onrank/neighbours.py on every rank's CX7 netdevs."""
    with probe.open_group(loaded) as group:
        def one(conn):
            netdevs = [nd for names in cabling_mod.cx7_ports(all_facts[conn.target.rank]).values() for nd in names]
            command, stdin = onrank.invocation("neighbours", {"netdevs": netdevs})
            res = conn.run(command, stdin=stdin, timeout=30)
            if not res.ok:
                raise InitError(f"{conn.target.label}: neighbour discovery failed: {res.why()}")
            return {nd: (v["macs"] if v.get("state") is not None else None)
                    for nd, v in json.loads(res.stdout).items()}
        outcomes = group.gather(one)
    out = {}
    for i, o in enumerate(outcomes):
        if o.error is not None:
            raise o.error if isinstance(o.error, InitError) else InitError(str(o.error))
        out[i] = o.value
    return out


def ansible_playbook() -> str:
    """The ansible-playbook beside this Python (a venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("ansible-playbook")
    found = str(here) if here.exists() else shutil.which("ansible-playbook")
    if not found:
        raise InitError("applying the fabric addresses runs ansible/fabric.yml, and ansible-playbook is not "
                        "installed: `pip install ansible-core` where sparkstack is installed (or write the "
                        f"files `init --dry-run` prints to {cabling_mod.NETPLAN_FILE} and run `sudo netplan apply`)")
    return found


def fabric_vars(addresses: list, mtu: int) -> dict[int, dict]:
    """Each rank's host vars for ansible/fabric.yml: its netplan text and the addresses it adds."""
    ranks = sorted({a.rank for a in addresses})
    return {r: {"spark_node_netplan": cabling_mod.netplan(addresses, r, mtu),
                "spark_node_netplan_file": cabling_mod.NETPLAN_FILE, "spark_node_fabric_mtu": mtu,
                "spark_node_fabric": [{"netdev": a.netdev, "address": a.cidr} for a in addresses if a.rank == r]}
            for r in ranks}


def apply_addresses(loaded, addresses: list, mtu: int = cabling_mod.MTU) -> list[str]:
    """ansible/fabric.yml on the ranks with addresses: the netplan file (checked by netplan before
    it lands, persistent) and the same addresses and MTU now. Returns per-rank lines."""
    playbook = resources.ANSIBLE_DIR / "fabric.yml"
    extra = fabric_vars(addresses, mtu)
    names = inventory.host_names(loaded.cluster)
    with tempfile.TemporaryDirectory(prefix="sparkstack-fabric-") as tmp:
        inv = Path(tmp) / "inventory.yaml"
        inv.write_text(inventory.with_host_vars(loaded.cluster, extra))
        res = subprocess.run([ansible_playbook(), "-i", str(inv), "--limit", ",".join(names[r] for r in extra),
                              str(playbook)], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "ANSIBLE_CONFIG": str(resources.ANSIBLE_DIR / "ansible.cfg"),
                                  "ANSIBLE_NOCOLOR": "1"})
    if res.returncode != 0:
        raise InitError("writing the fabric's netplan files failed (ansible/fabric.yml):\n"
                        + _playbook_failures(res.stdout + res.stderr, names)
                        + "\nfix what the rank says, then run init again")
    return [f"rank {r} ({names[r]}): " + ", ".join(f"{a.netdev} {a.cidr}" for a in addresses if a.rank == r)
            + f", MTU {mtu}, {cabling_mod.NETPLAN_FILE}" for r in extra]


_FAILED = re.compile(r"^(?:fatal|failed): \[([^\]]+)\].*?(?:=>\s*)?(\{.*\})?$", re.M)


def _playbook_failures(output: str, names: list[str]) -> str:
    """One line per failed rank: its name and index, the task, and the message (netplan's own,
    when the file was refused)."""
    lines, task = [], "?"
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line[6:line.index("]")] if "]" in line else line
        m = _FAILED.match(line)
        if not m:
            continue
        name = m.group(1).split(" ")[0]
        try:
            body = json.loads(m.group(2) or "{}")
        except ValueError:
            body = {}
        why = " ".join(str(body.get(k) or "").strip() for k in ("msg", "stderr")).strip() or line
        where = f"rank {names.index(name)} ({name})" if name in names else name
        lines.append(f"{where}: {task}: {why}")
    return "\n".join(lines) or output.strip()[-2000:]


def confirm_applied(all_facts: dict, addresses: list) -> None:
    """Every address init applied is on its port now (read back by a fresh probe)."""
    missing = []
    for a in addresses:
        iface = all_facts[a.rank].interface(a.netdev)
        if not iface or a.cidr not in iface.ipv4:
            missing.append(f"rank {a.rank}: {a.netdev} lacks {a.cidr} after applying it "
                           f"(has {', '.join(iface.ipv4) if iface and iface.ipv4 else 'none'})")
    if missing:
        raise InitError("the fabric addresses did not stick:\n" + "\n".join(missing)
                        + "\nsomething else manages these ports (NetworkManager?); see `ip addr` there")


def nfs_of(all_facts: dict, model_path: str) -> dict | None:
    """model.nfs when the checkpoint path is an NFS mount on some rank (its findmnt facts)."""
    for f in all_facts.values():
        m = f.model_mount
        if m and m.fstype.startswith("nfs") and ":" in m.source:
            server, export = m.source.split(":", 1)
            return {"server": server, "export": export}
    return None


HEADER = """\
# cluster.yaml written by `sparkstack init` ({date}): {n} ranks, rank 0 first, cabled as a {topology}.
# Every field is documented in env/cluster.example.yaml. Check it with `sparkstack check`, then
# serve with `sparkstack up`.
"""
COMMENTS = {
    "profile": "# The serving recipe (`sparkstack profiles` lists them).",
    "topology": "# How the ConnectX-7 ports are cabled, as init found it from each port's neighbours.",
    "ssh": "# Host keys are verified against this file (init recorded the ones you trusted).",
    "ranks": "# The ranks in order, rank 0 first; fabric_ips: the CX7 addresses (init proposed or found them).",
    "model": "# The checkpoint directory, the same path on every rank.",
}


def render_config(doc: dict, topology: str, date: str) -> str:
    parts = [HEADER.format(date=date, n=len(doc["ranks"]), topology=topology)]
    for key, value in doc.items():
        if key in COMMENTS:
            parts.append(COMMENTS[key])
        parts.append(yaml.safe_dump({key: value}, sort_keys=False))
    return "\n".join(parts)
