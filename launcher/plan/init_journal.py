"""init's journal: what `sparkstack init` changes on a rank, as it was before the kit first touched
it, and the plan of `sparkstack restore` that puts it back. Pure: the rank's side
(launcher/onrank/init_journal.py) reads and does; launcher/init/journal.py carries it.

Where it is kept
  - on the rank: RANK_PATH (/var/lib/sparkstack/init-journal.json), 0600 root in a 0700 folder,
    written BEFORE init changes anything (a rank whose journal cannot be written is not changed);
  - on the control host: a copy in $XDG_STATE_HOME/sparkstack/init-journals/<rank address>.json
    (0600), next to the kit's API keys and manifests. The rank's copy is the one restore reads;
    the host's stands in when the rank's is gone.

The format (FORMAT, version 1), one JSON object per rank:
  {"format": "sparkstack-init-journal", "version": 1,
   "rank": {"name": ..., "address": ..., "port": ...},
   "created": ISO time of the first init that journaled this rank,
   "runs": [{"at": ISO time, "files": [paths], "netdevs": [ports]}, ...]  (every init since),
   "files": {path: FILE}, "ports": {netdev: PORT}}
  FILE: {"exists": false} (init created it: restore removes it), or
        {"exists": true, "mode": "0600", "uid": 0, "gid": 0, "owner": "root", "group": "root",
         "size": N, "sha256": hex, "content_b64": the bytes}
  PORT: {"exists": true, "mtu": 1500, "up": true, "ipv4": ["192.168.1.5/24", ...]} (IPv6 is not
        init's: left alone), or {"exists": false}.
A file or port enters the journal the first time an init is about to change it; a later init adds
what is new to it and never replaces an entry, so the journal always holds the state before the
kit first touched each thing. A successful restore renames the rank's journal to
RANK_PATH.restored-<time>: the next init records afresh.
"""

from __future__ import annotations

import re

FORMAT = "sparkstack-init-journal"
VERSION = 1
RANK_PATH = "/var/lib/sparkstack/init-journal.json"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def host_copy_name(address: str, port: int) -> str:
    """The control host copy's file name: the rank's address (and port, when not 22)."""
    return _SAFE.sub("_", address + ("" if port == 22 else f"_{port}")) + ".json"


def merged(existing: dict | None, now: dict, rank: dict, files: list[str], netdevs: list[str], at: str) -> dict:
    """The journal to keep before an init changes `files` and `netdevs`: `existing`'s entries as
    they are (their "before" is older than anything read now), the others from `now`."""
    doc = dict(existing) if existing else {"format": FORMAT, "version": VERSION, "rank": rank,
                                           "created": at, "runs": [], "files": {}, "ports": {}}
    doc["files"] = {**{p: now["files"][p] for p in files}, **doc.get("files", {})}
    doc["ports"] = {**{nd: now["ports"][nd] for nd in netdevs}, **doc.get("ports", {})}
    doc["runs"] = [*doc.get("runs", []), {"at": at, "files": sorted(files), "netdevs": sorted(netdevs)}]
    return doc


def problems(doc, where: str) -> list[str]:
    """Why `doc` cannot be used as a journal: another format, a newer version, a bad entry."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return [f"{where}: not a sparkstack init journal"]
    if doc.get("version") != VERSION:
        return [f"{where}: journal version {doc.get('version')!r}; this sparkstack reads version {VERSION} "
                "(restore with the sparkstack that wrote it)"]
    return [f"{where}: {p}: {f.get('error')}" for p, f in doc.get("files", {}).items() if f.get("error")]


def unreadable(now: dict, files: list[str]) -> list[str]:
    """What init is about to change but cannot journal: a path that is not a regular file."""
    return [f"{p}: {now['files'][p]['error']}" for p in files if now["files"][p].get("error")]


def _file_actions(path: str, before: dict, now: dict) -> list[dict]:
    if not before["exists"]:
        return [{"op": "remove_file", "path": path}] if now.get("exists") else []
    keys = ("sha256", "mode", "uid", "gid")
    if now.get("exists") and all(now.get(k) == before[k] for k in keys):
        return []
    return [{"op": "write_file", "path": path,
             **{k: before[k] for k in ("content_b64", "mode", "uid", "gid", "owner", "group", "size", "sha256")}}]


def _port_actions(netdev: str, before: dict, now: dict) -> list[dict]:
    acts: list[dict] = []
    if now["mtu"] != before["mtu"]:
        acts.append({"op": "set_mtu", "netdev": netdev, "mtu": before["mtu"], "was": now["mtu"]})
    acts += [{"op": "del_addr", "netdev": netdev, "address": a} for a in now["ipv4"] if a not in before["ipv4"]]
    acts += [{"op": "add_addr", "netdev": netdev, "address": a} for a in before["ipv4"] if a not in now["ipv4"]]
    if now["up"] != before["up"]:
        acts.append({"op": "link_up" if before["up"] else "link_down", "netdev": netdev})
    return acts


def restore_plan(journal: dict, now: dict) -> tuple[list[dict], list[str]]:
    """The actions that put a rank back as its journal says it was (files first, then ports; for
    a port its MTU, the addresses init added removed, those it had put back, its link state), and
    what stops it (a port that is gone)."""
    actions: list[dict] = []
    refusals: list[str] = []
    for path, before in sorted(journal["files"].items()):
        actions += _file_actions(path, before, now["files"].get(path, {"exists": False}))
    for netdev, before in sorted(journal["ports"].items()):
        cur = now["ports"].get(netdev, {"exists": False})
        if not before["exists"]:
            continue  # a port init named but that was not there: nothing of it to put back
        if not cur["exists"]:
            refusals.append(f"port {netdev} is gone (it had MTU {before['mtu']}, "
                            f"{', '.join(before['ipv4']) or 'no IPv4 address'}): plug its adapter back, then restore")
            continue
        actions += _port_actions(netdev, before, cur)
    return actions, refusals


def before_state(journal: dict) -> dict:
    """The state the rank must read back after a restore: the journal's entries, as they were."""
    return {"files": dict(journal["files"]), "ports": dict(journal["ports"])}


def describe(action: dict) -> str:
    """One line of `restore --dry-run`."""
    op = action["op"]
    if op == "write_file":
        return (f"write back {action['path']}: {action['size']} bytes (sha256 {action['sha256'][:16]}), "
                f"mode {action['mode']}, owner {action['owner'] or action['uid']}:{action['group'] or action['gid']}")
    if op == "remove_file":
        return f"remove {action['path']} (init created it)"
    if op == "set_mtu":
        return f"{action['netdev']}: MTU {action['was']} -> {action['mtu']}"
    if op == "del_addr":
        return f"{action['netdev']}: remove {action['address']}"
    if op == "add_addr":
        return f"{action['netdev']}: add {action['address']} back"
    return f"{action['netdev']}: link {op[5:]}"


def public(action: dict) -> dict:
    """An action for --json: the file's bytes left out (a netplan file may hold secrets)."""
    return {k: v for k, v in action.items() if k != "content_b64"}


def differences(before: dict, now: dict) -> list[str]:
    """How the rank differs from its journal's before (empty: it matches, byte for byte)."""
    out = []
    for path, b in sorted(before["files"].items()):
        n = now["files"].get(path, {"exists": False})
        if not b["exists"] and n.get("exists"):
            out.append(f"{path} exists (it did not before init)")
        elif b["exists"] and not n.get("exists"):
            out.append(f"{path} is missing")
        elif b["exists"]:
            out += [f"{path}: {k} {n.get(k)} (before: {b[k]})" for k in ("sha256", "mode", "uid", "gid")
                    if n.get(k) != b[k]]
    for netdev, b in sorted(before["ports"].items()):
        n = now["ports"].get(netdev, {"exists": False})
        if b != n:
            out.append(f"{netdev}: now {_port_text(n)} (before: {_port_text(b)})")
    return out


def _port_text(p: dict) -> str:
    if not p.get("exists"):
        return "absent"
    return f"MTU {p['mtu']}, {'up' if p['up'] else 'down'}, {', '.join(p['ipv4']) or 'no IPv4 address'}"
