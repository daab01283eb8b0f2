"""The rank's side of init's journal (launcher/plan/init_journal.py says what it holds), run as root
(`sudo -n`) with `python3 -c <loader> '<{"op": ...}>'`, the script first on stdin and, for `write`
and `restore`, one JSON payload after it. Standard library only (Python 3.8), like probe.py.

- read:    {"files": [...], "netdevs": [...], "journal": PATH} -> the journal kept there (or
           null) and the state now of those files and ports and of every one the journal names.
- write:   payload: the journal -> written to PATH atomically, 0600 root, in a 0700 folder.
- restore: payload: {"actions": [...], "before": {...}} -> the actions run in order; the state
           read again; when it equals `before`, the journal is renamed PATH.restored-<time> so a
           later init records afresh. Prints {"done", "error", "state", "retired"}.
Prints ONE JSON object; the decisions are the control host's, this only reads and does.
"""

import base64
import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess
import sys
import time


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return None


def read_file(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    if not stat.S_ISREG(st.st_mode):
        return {"exists": True, "error": "not a regular file"}
    with open(path, "rb") as f:
        data = f.read()
    return {"exists": True, "mode": "%04o" % stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "owner": _name(pwd.getpwuid, st.st_uid), "group": _name(grp.getgrgid, st.st_gid),
            "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "content_b64": base64.b64encode(data).decode("ascii")}


def read_port(netdev):
    res = subprocess.run(["ip", "-j", "addr", "show", "dev", netdev], capture_output=True, text=True)
    if res.returncode != 0:
        return {"exists": False}
    [link] = json.loads(res.stdout)
    return {"exists": True, "mtu": link["mtu"], "up": "UP" in link.get("flags", []),
            "ipv4": ["%s/%d" % (a["local"], a["prefixlen"]) for a in link.get("addr_info", [])
                     if a.get("family") == "inet"]}


def load_journal(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, "%s: unreadable (%s)" % (path, e)


def state(files, netdevs):
    return {"files": {p: read_file(p) for p in sorted(set(files))},
            "ports": {nd: read_port(nd) for nd in sorted(set(netdevs))}}


def op_read(args):
    journal, error = load_journal(args["journal"])
    files, netdevs = list(args.get("files", [])), list(args.get("netdevs", []))
    if isinstance(journal, dict):
        files += list(journal.get("files", {}))
        netdevs += list(journal.get("ports", {}))
    retired = sorted(n for n in os.listdir(os.path.dirname(args["journal"]))
                     if n.startswith(os.path.basename(args["journal"]) + ".restored-")) \
        if os.path.isdir(os.path.dirname(args["journal"])) else []
    return {"journal": journal, "journal_error": error, "retired": retired, "state": state(files, netdevs)}


def write_atomic(path, data, mode, uid, gid):
    """The new bytes under a temporary name in the same folder, mode and owner set, then renamed
    over `path`: a reader sees the old file or the new one, never half of either."""
    tmp = "%s.sparkstack-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchown(f.fileno(), uid, gid)
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def op_write(args, payload):
    folder = os.path.dirname(args["journal"])
    os.makedirs(folder, mode=0o700, exist_ok=True)
    data = (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode()
    write_atomic(args["journal"], data, 0o600, 0, 0)
    return {"written": args["journal"], "size": len(data)}


def ip(*argv):
    res = subprocess.run(["ip"] + list(argv), capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError("`ip %s`: %s" % (" ".join(argv), (res.stderr or res.stdout).strip()))


def run_action(a):
    op = a["op"]
    if op == "write_file":
        write_atomic(a["path"], base64.b64decode(a["content_b64"]), int(a["mode"], 8), a["uid"], a["gid"])
    elif op == "remove_file":
        if os.path.lexists(a["path"]):
            os.unlink(a["path"])
    elif op == "set_mtu":
        ip("link", "set", "dev", a["netdev"], "mtu", str(a["mtu"]))
    elif op == "del_addr":
        ip("addr", "del", a["address"], "dev", a["netdev"])
    elif op == "add_addr":
        ip("addr", "add", a["address"], "dev", a["netdev"])
    elif op in ("link_up", "link_down"):
        ip("link", "set", "dev", a["netdev"], op[5:])
    else:
        raise RuntimeError("unknown action %r" % op)


def op_restore(args, payload):
    done, error = [], None
    for a in payload["actions"]:
        try:
            run_action(a)
        except (OSError, RuntimeError) as e:
            error = "%s: %s" % (a["op"], e)
            break
        done.append(a["op"])
    before = payload["before"]
    now = state(before.get("files", {}), before.get("ports", {}))
    retired = None
    if error is None and now == before and os.path.exists(args["journal"]):
        retired = "%s.restored-%s" % (args["journal"], time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
        os.rename(args["journal"], retired)
    return {"done": done, "error": error, "state": now, "retired": retired}


def main(argv):
    args = json.loads(argv[1])
    payload = json.loads(sys.stdin.read() or "null") if args["op"] in ("write", "restore") else None
    if args["op"] == "read":
        out = op_read(args)
    elif args["op"] == "write":
        out = op_write(args, payload)
    else:
        out = op_restore(args, payload)
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
