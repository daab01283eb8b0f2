"""Relay (`ship --relay`): the build host's uplink carries each missing blob once, not once per rank.

Rank 0 runs a pull-through cache: the same well-kept registry (`docker-registry`, in its proxy
mode) whose upstream is the build host's registry, reached through rank 0's SSH reverse forward.
Every rank that lacks the image -- rank 0 too -- pulls from that cache over the network between
the ranks (rank 0's rendezvous address: the fabric on a switch, the management network in a ring,
where rank 0 is not every rank's fabric neighbour), through a loopback forwarder
(launcher/onrank/relay_pull.py), because Docker takes a registry without TLS only on 127.0.0.1.

The cache itself listens on rank 0's 127.0.0.1; the ranks reach it through a gate
(launcher/onrank/relay_gate.py) on the rendezvous address that lets in only the ranks' addresses and
only reads of this ship's manifests and blobs: the build host's registry behind it holds every
image ever shipped, and the cache takes no credentials.

What crosses the uplink: each missing blob twice, however many ranks ask -- distribution's proxy
mode fetches a blob once to stream it to the first puller and once to store it (measured: 6.0 MB
for a 3 MB layer to four ranks; without the relay 12 MB, once per rank). So one rank pulls first
and the rest after it, from the stored copy: concurrent first pulls would each fetch it again.
Rank 0 needs `docker-registry` (apt install docker-registry); the cache, its gate and its storage
are removed when the ship ends (by the gate itself when the build host goes away first).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from .. import onrank
from ..errors import SparkstackError
from ..transport.remote import Connection

PULL_SCRIPT = onrank.path("relay_pull")
GATE_SCRIPT = onrank.path("relay_gate")
READY_S = 15


class RelayError(SparkstackError):
    pass


@dataclass(frozen=True)
class Route:
    """Where the ranks reach rank 0's cache, and from where: the gate lets only the peers in."""

    address: str            # rank 0's rendezvous address (config.rendezvous)
    peers: tuple[str, ...]  # every rank's address and fabric IPs, and the rendezvous itself


def route(loaded) -> Route:
    from ..inputs.config import rendezvous

    ranks = loaded.cluster.ranks
    address = rendezvous(loaded)
    peers = {address} | {r.address for r in ranks} | {str(ip) for r in ranks for ip in r.fabric_ips}
    return Route(address, tuple(sorted(peers)))


def gate_spec(route: Route, contents: list[tuple[str, list[str], list[str]]]) -> dict:
    """The gate's spec (launcher/onrank/relay_gate.py) from each shipped image's (repository,
    manifests, blobs) in this host's registry; several tags may share a repository."""
    repos: dict[str, dict[str, list[str]]] = {}
    for repo, manifests, blobs in contents:
        entry = repos.setdefault(repo, {"manifests": [], "blobs": []})
        entry["manifests"] = sorted({*entry["manifests"], *manifests})
        entry["blobs"] = sorted({*entry["blobs"], *blobs})
    return {"listen": route.address, "peers": list(route.peers), "repos": repos}


@dataclass
class Cache:
    """The registry cache running on rank 0, behind its gate."""

    address: str     # where the other ranks reach it
    port: int        # the gate's
    pids: list[int]  # the cache's and the gate's
    directory: str


# Values arrive as positional parameters ($1, $2), never pasted into the script. The gate's
# script arrives on stdin.
START_SCRIPT = f"""
set -e
spec=$1 upstream=$2
bin=$(command -v docker-registry || command -v registry || true)
[ -n "$bin" ] || {{ echo "no docker-registry on rank 0: install it (apt install docker-registry), or ship without --relay" >&2; exit 127; }}
d=$(mktemp -d /tmp/sparkstack-relay.XXXXXX)
cat > "$d/gate.py"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$d/config.yml" <<EOF
version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: $d/data}}}}
http: {{addr: "127.0.0.1:$port"}}
proxy: {{remoteurl: "http://127.0.0.1:$upstream"}}
EOF
pids=
ready() {{  # ready WHAT PID TEST...: wait until TEST passes; else stop, clean up and say why
  what=$1 pid=$2; shift 2
  for i in $(seq 1 {READY_S * 10}); do
    "$@" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || {{ echo "the relay $what on rank 0 exited: $(tail -c 400 "$d/$what.log")" >&2; kill $pids 2>/dev/null; rm -rf "$d"; exit 1; }}
    sleep 0.1
  done
  echo "the relay $what on rank 0 did not answer in {READY_S} s: $(tail -c 400 "$d/$what.log")" >&2
  kill $pids 2>/dev/null; rm -rf "$d"; exit 1
}}
nohup "$bin" serve "$d/config.yml" >"$d/cache.log" 2>&1 </dev/null &
cache=$!; pids=$cache
ready cache $cache python3 -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/' % sys.argv[1], timeout=1)" "$port"
nohup python3 "$d/gate.py" "$spec" "$port" "$upstream" "$cache" "$d" >"$d/gate.log" 2>&1 </dev/null &
gate=$!; pids="$cache $gate"
ready gate $gate test -s "$d/gate.port"
echo "$(cat "$d/gate.port") $cache $gate $d"
"""


def _start_command(spec: dict, upstream_port: int) -> str:
    """On rank 0: the cache and its gate in the background; prints `<gate port> <cache pid>
    <gate pid> <dir>` once both answer, or fails naming what is missing."""
    return shlex.join(["sh", "-c", START_SCRIPT, "sh", json.dumps(spec), str(upstream_port)])


def start(conn: Connection, spec: dict, upstream_port: int) -> Cache:
    result = conn.run(_start_command(spec, upstream_port), stdin=GATE_SCRIPT.read_bytes(),
                      timeout=2 * READY_S + 15)
    if not result.ok:
        raise RelayError(f"{conn.target.name}: cannot start the relay cache: {result.why()}")
    port, cache_pid, gate_pid, directory = result.stdout.split()
    return Cache(spec["listen"], int(port), [int(cache_pid), int(gate_pid)], directory)


def stop(conn: Connection, cache: Cache) -> None:
    """Stop the gate and the cache, wait (5 s at most) until both are gone, and delete what the
    cache stored (best effort: /tmp goes at the next boot)."""
    pids = " ".join(str(p) for p in cache.pids)
    conn.run(f"kill {pids} 2>/dev/null; for i in $(seq 1 50); do alive=; for p in {pids}; do "
             f"kill -0 $p 2>/dev/null && alive=1; done; [ -n \"$alive\" ] || break; sleep 0.1; done; "
             f"rm -rf {shlex.quote(cache.directory)}", timeout=30)


def pull_invocation(cache: Cache, pull_command: str) -> tuple[str, bytes]:
    """The rank's command (relay_pull.py on stdin): `pull_command` with `{port}` standing for the
    loopback port that leads to the cache."""
    args = {"target": [cache.address, cache.port], "command": pull_command}
    return onrank.invocation("relay_pull", args)
