"""Relay (`ship --relay`): the build host's uplink carries each missing blob once, not once per rank.

Rank 0 runs a pull-through cache: the same well-kept registry (`docker-registry`, in its proxy
mode) whose upstream is the build host's registry, reached through rank 0's SSH reverse forward.
Every rank that lacks the image -- rank 0 too -- pulls from that cache over the network between
the ranks (rank 0's rendezvous address: the fabric on a switch, the management network in a ring,
where rank 0 is not every rank's fabric neighbour), through a loopback forwarder
(launcher/relay_pull.py), because Docker takes a registry without TLS only on 127.0.0.1.

What crosses the uplink: each missing blob twice, however many ranks ask -- distribution's proxy
mode fetches a blob once to stream it to the first puller and once to store it (measured: 6.0 MB
for a 3 MB layer to four ranks; without the relay 12 MB, once per rank). So one rank pulls first
and the rest after it, from the stored copy: concurrent first pulls would each fetch it again.
Rank 0 needs `docker-registry` (apt install docker-registry); the cache and its storage are
removed when the ship ends.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from .errors import SparkstackError
from .remote import Connection

PULL_SCRIPT = Path(__file__).with_name("relay_pull.py")
READY_S = 15


class RelayError(SparkstackError):
    pass


@dataclass
class Cache:
    """The registry cache running on rank 0."""

    address: str  # where the other ranks reach it
    port: int
    pid: int
    directory: str


def _start_command(address: str, upstream_port: int) -> str:
    """On rank 0: a free port, the proxy config, the registry in the background; prints
    `<port> <pid> <dir>` once it answers, or fails naming what is missing."""
    script = f"""
set -e
bin=$(command -v docker-registry || command -v registry || true)
[ -n "$bin" ] || {{ echo "no docker-registry on rank 0: install it (apt install docker-registry), or ship without --relay" >&2; exit 127; }}
d=$(mktemp -d /tmp/sparkstack-relay.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
cat > "$d/config.yml" <<EOF
version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: $d/data}}}}
http: {{addr: "{address}:$port"}}
proxy: {{remoteurl: "http://127.0.0.1:{upstream_port}"}}
EOF
nohup "$bin" serve "$d/config.yml" >"$d/log" 2>&1 </dev/null &
pid=$!
for i in $(seq 1 {READY_S * 10}); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://{address}:$port/v2/', timeout=1)" 2>/dev/null; then
    echo "$port $pid $d"; exit 0
  fi
  kill -0 $pid 2>/dev/null || {{ echo "the registry cache on rank 0 exited: $(tail -c 400 "$d/log")" >&2; rm -rf "$d"; exit 1; }}
  sleep 0.1
done
kill $pid; echo "the registry cache on rank 0 did not answer on {address}:$port in {READY_S} s: $(tail -c 400 "$d/log")" >&2
rm -rf "$d"; exit 1
"""
    return f"sh -c {shlex.quote(script)}"


def start(conn: Connection, address: str, upstream_port: int) -> Cache:
    result = conn.run(_start_command(address, upstream_port), timeout=READY_S + 15)
    if not result.ok:
        raise RelayError(f"{conn.target.name}: cannot start the relay cache: {result.why()}")
    port, pid, directory = result.stdout.split()
    return Cache(address, int(port), int(pid), directory)


def stop(conn: Connection, cache: Cache) -> None:
    """Stop the cache and delete what it stored (best effort: /tmp goes at the next boot)."""
    conn.run(f"kill {cache.pid} 2>/dev/null; rm -rf {shlex.quote(cache.directory)}", timeout=30)


def pull_invocation(cache: Cache, pull_command: str) -> tuple[str, bytes]:
    """The rank's command (relay_pull.py on stdin): `pull_command` with `{port}` standing for the
    loopback port that leads to the cache."""
    args = {"target": [cache.address, cache.port], "command": pull_command}
    return f"python3 - {shlex.quote(json.dumps(args))}", PULL_SCRIPT.read_bytes()
