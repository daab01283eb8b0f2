"""init's journal and the restore plan, as pure data (launcher/plan/init_journal.py): each case is
a rank's journal and what the rank has now; the actions and the lines `restore --dry-run` prints
are compared with tests/golden/restore/<case>.json."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from launcher.plan import init_journal as jr

GOLDEN = Path(__file__).parent / "golden" / "restore"
NETPLAN = "/etc/netplan/60-sparkstack-fabric.yaml"


def file_entry(data: bytes, mode: str = "0600", uid: int = 0, gid: int = 0, owner="root", group="root") -> dict:
    return {"exists": True, "mode": mode, "uid": uid, "gid": gid, "owner": owner, "group": group,
            "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "content_b64": base64.b64encode(data).decode()}


def port(mtu: int, *ipv4: str, up: bool = True) -> dict:
    return {"exists": True, "mtu": mtu, "up": up, "ipv4": list(ipv4)}


ABSENT = {"exists": False}
OURS = file_entry(b"# Written by `sparkstack init`: ...\nnetwork:\n  version: 2\n")
OWN = file_entry(b"network:\n  version: 2\n  ethernets: {}\n\xc3\xa9\n", "0640", 1000, 1000, "spark", "spark")


def journal(files: dict, ports: dict) -> dict:
    return {"format": jr.FORMAT, "version": jr.VERSION, "rank": {"name": "spark1", "address": "10.0.0.1", "port": 22},
            "created": "2026-12-02T00:00:00+00:00", "runs": [], "files": files, "ports": ports}


CASES = {
    # a bare Spark: init created the file, gave both cabled ports an address and MTU 9000
    "created_file_and_addressed_ports": (
        journal({NETPLAN: ABSENT}, {"enp1s0f0np0": port(1500), "enp1s0f1np1": port(1500)}),
        {"files": {NETPLAN: OURS},
         "ports": {"enp1s0f0np0": port(9000, "192.168.177.1/30"), "enp1s0f1np1": port(9000, "192.168.177.14/30")}}),
    # the owner's own file was where init writes: its bytes, mode and owner go back
    "own_file_written_back": (
        journal({NETPLAN: OWN}, {"enp1s0f0np0": port(9000, "192.168.177.1/30")}),
        {"files": {NETPLAN: OURS}, "ports": {"enp1s0f0np0": port(9000, "192.168.177.1/30")}}),
    # the owner deleted init's file and set the MTU back by hand: only what still differs
    "partly_undone_by_hand": (
        journal({NETPLAN: ABSENT}, {"enp1s0f0np0": port(1500)}),
        {"files": {NETPLAN: ABSENT}, "ports": {"enp1s0f0np0": port(1500, "192.168.177.1/30")}}),
    # an address init kept, one it added, a port that was down and is up now, a file lost since
    "kept_address_and_link_state": (
        journal({NETPLAN: OWN}, {"enp1s0f0np0": port(9000, "10.9.0.1/24", up=False)}),
        {"files": {NETPLAN: ABSENT}, "ports": {"enp1s0f0np0": port(1500, "10.9.0.1/24", "192.168.177.1/30")}}),
    # the same bytes, but another mode and owner (a `chmod 600; chown root` since): written back
    "same_bytes_other_mode_and_owner": (
        journal({NETPLAN: OWN}, {}),
        {"files": {NETPLAN: {**OWN, "mode": "0600", "uid": 0, "gid": 0, "owner": "root", "group": "root"}},
         "ports": {}}),
    # nothing differs: nothing to do
    "already_as_before": (
        journal({NETPLAN: OWN}, {"enp1s0f0np0": port(1500)}),
        {"files": {NETPLAN: OWN}, "ports": {"enp1s0f0np0": port(1500)}}),
    # a port the journal names is gone: restore refuses (all ranks or none)
    "port_gone": (
        journal({NETPLAN: ABSENT}, {"enp1s0f0np0": port(1500), "enP2p1s0f0np0": port(1500, "10.1.0.1/24")}),
        {"files": {NETPLAN: OURS}, "ports": {"enp1s0f0np0": port(9000, "192.168.177.1/30"),
                                             "enP2p1s0f0np0": ABSENT}}),
}


def test_restore_plans_match_their_goldens(golden):
    files = {}
    for name, (doc, now) in CASES.items():
        actions, refusals = jr.restore_plan(doc, now)
        files[f"{name}.json"] = json.dumps({"actions": [jr.public(a) for a in actions],
                                            "lines": [jr.describe(a) for a in actions],
                                            "refusals": refusals}, indent=2) + "\n"
    golden.check_dir(GOLDEN, files, pattern="*.json")


def test_a_restore_plan_applied_leaves_no_differences():
    """Each action's effect, simulated on the `now` state, gives the journal's before."""
    for name, (doc, now) in CASES.items():
        actions, refusals = jr.restore_plan(doc, now)
        if refusals:
            continue
        state = json.loads(json.dumps(now))
        for a in actions:
            simulate(state, a)
        assert jr.differences(jr.before_state(doc), state) == [], name
        assert jr.restore_plan(doc, state) == ([], []), name


def simulate(state: dict, a: dict) -> None:
    op = a["op"]
    if op == "write_file":
        state["files"][a["path"]] = {"exists": True, **{k: a[k] for k in (
            "mode", "uid", "gid", "owner", "group", "size", "sha256", "content_b64")}}
    elif op == "remove_file":
        state["files"][a["path"]] = ABSENT
    else:
        p = state["ports"][a["netdev"]]
        if op == "set_mtu":
            p["mtu"] = a["mtu"]
        elif op == "del_addr":
            p["ipv4"].remove(a["address"])
        elif op == "add_addr":
            p["ipv4"].append(a["address"])
        else:
            p["up"] = op == "link_up"


def test_differences_name_what_is_not_as_before():
    doc, now = CASES["kept_address_and_link_state"]
    assert jr.differences(jr.before_state(doc), now) == [
        f"{NETPLAN} is missing",
        "enp1s0f0np0: now MTU 1500, up, 10.9.0.1/24, 192.168.177.1/30 (before: MTU 9000, down, 10.9.0.1/24)"]
    doc, now = CASES["own_file_written_back"]
    assert jr.differences(jr.before_state(doc), now) == [
        f"{NETPLAN}: sha256 {OURS['sha256']} (before: {OWN['sha256']})", f"{NETPLAN}: mode 0600 (before: 0640)",
        f"{NETPLAN}: uid 0 (before: 1000)", f"{NETPLAN}: gid 0 (before: 1000)"]


def test_a_second_init_keeps_the_first_journals_before():
    now1 = {"files": {NETPLAN: OWN}, "ports": {"enp1s0f0np0": port(1500)}}
    first = jr.merged(None, now1, {"name": "spark1"}, [NETPLAN], ["enp1s0f0np0"], "t1")
    now2 = {"files": {NETPLAN: OURS}, "ports": {"enp1s0f0np0": port(9000, "192.168.177.1/30"),
                                                "enp1s0f1np1": port(1500)}}
    second = jr.merged(first, now2, {"name": "spark1"}, [NETPLAN], ["enp1s0f0np0", "enp1s0f1np1"], "t2")
    assert second["files"] == {NETPLAN: OWN} and second["created"] == "t1"
    assert second["ports"] == {"enp1s0f0np0": port(1500), "enp1s0f1np1": port(1500)}  # the new port: as now
    assert [r["at"] for r in second["runs"]] == ["t1", "t2"]
    assert first["runs"] == [{"at": "t1", "files": [NETPLAN], "netdevs": ["enp1s0f0np0"]}]  # not changed in place


def test_a_journal_of_another_format_or_version_is_refused():
    assert jr.problems({"format": "x"}, "P") == ["P: not a sparkstack init journal"]
    assert jr.problems([], "P") == ["P: not a sparkstack init journal"]
    doc = {**journal({}, {}), "version": 2}
    assert jr.problems(doc, "P") == ["P: journal version 2; this sparkstack reads version 1 "
                                     "(restore with the sparkstack that wrote it)"]
    assert jr.problems(journal({}, {}), "P") == []


def test_the_host_copys_name_is_the_ranks_address():
    assert jr.host_copy_name("172.31.242.11", 22) == "172.31.242.11.json"
    assert jr.host_copy_name("spark/1", 2222) == "spark_1_2222.json"


def test_restore_refuses_while_the_engine_serves(tmp_path, monkeypatch):
    """Putting a rank's fabric back under a serving engine breaks its NCCL rings: with the engine
    running on a rank, `restore` changes nothing and says to stop it first; with none, it applies."""
    import contextlib

    from click.testing import CliRunner

    from launcher.apply import cluster_lock, deploy, serve
    from launcher.cli.commands import main
    from launcher.init import journal
    from test_check import sandbox_cluster

    doc, now = CASES["created_file_and_addressed_ports"]
    actions, _ = jr.restore_plan(doc, now)
    plans = [journal.RankRestore(0, "rank 0 (spark1)", "rank", doc, actions)]
    applied = []
    states = [serve.RankState(0, "172.31.240.11", "running", image="img:1")]
    monkeypatch.setattr(deploy, "group_for", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(cluster_lock, "held", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(journal, "plan_restore", lambda loaded, group: plans)
    monkeypatch.setattr(serve, "states", lambda group: states)
    monkeypatch.setattr(journal, "apply_restore", lambda loaded, group, p: applied.append(p))
    cfg = str(sandbox_cluster(tmp_path).path)
    result = CliRunner().invoke(main, ["restore", "-c", cfg])
    assert result.exit_code == 1 and applied == [], result.output
    assert ("error: restore changed nothing: the engine serves on rank 0 (172.31.240.11), over the fabric it "
            "would put back; `sparkstack down` first, then restore") in result.output
    states[0] = serve.RankState(0, "172.31.240.11", "exited", exit_code=0)
    result = CliRunner().invoke(main, ["restore", "-c", cfg])
    assert result.exit_code == 0 and applied == [plans], result.output
