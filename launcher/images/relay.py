"""Relay (`ship --relay`): the build host's uplink carries each missing blob once, not once per rank.

Rank 0 runs a pull-through cache: the same well-kept registry (`docker-registry`, in its proxy
mode) whose upstream is the build host's registry, reached through rank 0's SSH reverse forward.
Every rank that lacks the image -- rank 0 too -- pulls from that cache over the network between
the ranks (rank 0's rendezvous address: the fabric on a switch, the management network in a ring,
where rank 0 is not every rank's fabric neighbour), through a loopback forwarder
(launcher/onrank/relay_pull.py), because Docker takes a registry without TLS only on 127.0.0.1.

The cache itself listens on a Unix socket in its own 0700 directory on rank 0 (no port on the
loopback, so no other user of rank 0 reaches it); the ranks reach it through a gate
(launcher/onrank/relay_gate.py) on the rendezvous address that lets in only the ranks' addresses and
only reads of this ship's manifests and blobs: the build host's registry behind it holds every
image ever shipped, and the cache takes no credentials.

The cache's upstream, rank 0's SSH reverse forward on its 127.0.0.1, is a port any user there can
open: it leads to UpstreamFront on this host, which serves only reads and only to a client that
has this ship's secret (registry token auth: a 401 challenge, the secret as the token request's
basic credentials, a bearer token after). The secret reaches rank 0 on stdin, into the cache's
config in that 0700 directory; never on a command line (issue 33).

What crosses the uplink: each missing blob twice, however many ranks ask -- distribution's proxy
mode fetches a blob once to stream it to the first puller and once to store it (measured: 6.0 MB
for a 3 MB layer to four ranks; without the relay 12 MB, once per rank). So one rank pulls first
and the rest after it, from the stored copy: concurrent first pulls would each fetch it again.
Rank 0 needs `docker-registry` (apt install docker-registry); the cache, its gate and its storage
are removed when the ship ends (by the gate itself when the build host goes away first).
"""

from __future__ import annotations

import base64
import hmac
import http.client
import http.server
import json
import re
import secrets
import shlex
import shutil
import threading
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


TOKEN_PATH = "/sparkstack-token"
FRONT_USER = "sparkstack"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade"}
_HOST = re.compile(r"(127\.0\.0\.1|localhost)(:[0-9]{1,5})?")


class UpstreamFront:
    """This host's registry as rank 0's reverse forward reaches it: reads only (GET, HEAD), and
    only with this ship's secret (module docstring). `close()` when the ship ends."""

    def __init__(self, registry_port: int):
        self.registry_port = registry_port
        self.password = secrets.token_urlsafe(32)  # the per-ship secret: rank 0's cache has it
        self.token = secrets.token_urlsafe(32)  # what the cache gets for it, sent on each request
        self._basic = "Basic " + base64.b64encode(f"{FRONT_USER}:{self.password}".encode()).decode()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_FrontHandler,),
                                                                               {"front": self}))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _FrontHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    front: UpstreamFront

    def do_GET(self):
        given = self.headers.get("Authorization", "")
        if self.path.split("?")[0] == TOKEN_PATH:
            if not hmac.compare_digest(given.encode(), self.front._basic.encode()):
                return self._challenge()
            return self._answer(200, json.dumps({"token": self.front.token, "expires_in": 86400}).encode())
        if not hmac.compare_digest(given.encode(), f"Bearer {self.front.token}".encode()):
            return self._challenge()
        upstream = http.client.HTTPConnection("127.0.0.1", self.front.registry_port, timeout=300)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in self.headers.items():
                if key.lower() not in HOP_BY_HOP and key.lower() != "authorization":
                    upstream.putheader(key, value)
            upstream.endheaders()
            response = upstream.getresponse()
            self.send_response_only(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            if response.getheader("Content-Length") is None and self.command != "HEAD":
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                shutil.copyfileobj(response, self.wfile, 1 << 16)
        finally:
            upstream.close()

    do_HEAD = do_GET

    def _challenge(self):
        host = self.headers.get("Host", "")
        host = host if _HOST.fullmatch(host) else f"127.0.0.1:{self.front.port}"
        self._answer(401, b'{"errors": [{"code": "UNAUTHORIZED", "message": "this ship\'s secret is needed"}]}',
                     {"WWW-Authenticate": f'Bearer realm="http://{host}{TOKEN_PATH}",service="sparkstack"'})

    def _answer(self, status: int, body: bytes, headers: dict | None = None):
        self.send_response_only(status)
        for key, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                           "Docker-Distribution-Api-Version": "registry/2.0", **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code="-", size="-"):
        pass

    def log_message(self, fmt, *args):
        pass


# Values arrive as positional parameters ($1, $2), never pasted into the script. On stdin: the
# per-ship secret (one line), then the gate's script.
START_SCRIPT = f"""
set -e
spec=$1 upstream=$2
bin=$(command -v docker-registry || command -v registry || true)
[ -n "$bin" ] || {{ echo "no docker-registry on rank 0: install it (apt install docker-registry), or ship without --relay" >&2; exit 127; }}
umask 077
d=$(mktemp -d /tmp/sparkstack-relay.XXXXXX)
IFS= read -r secret
cat > "$d/gate.py"
cat > "$d/config.yml" <<EOF
version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: $d/data}}}}
http: {{addr: "$d/cache.sock", net: unix}}
proxy: {{remoteurl: "http://127.0.0.1:$upstream", username: {FRONT_USER}, password: "$secret"}}
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
ready cache $cache python3 -c "import socket, sys; s = socket.socket(socket.AF_UNIX); s.settimeout(1); s.connect(sys.argv[1]); s.sendall(b'GET /v2/ HTTP/1.0\\r\\n\\r\\n'); assert s.recv(12).startswith(b'HTTP/1.')" "$d/cache.sock"
nohup python3 "$d/gate.py" "$spec" "$d/cache.sock" "$upstream" "$cache" "$d" >"$d/gate.log" 2>&1 </dev/null &
gate=$!; pids="$cache $gate"
ready gate $gate test -s "$d/gate.port"
echo "$(cat "$d/gate.port") $cache $gate $d"
"""


def _start_command(spec: dict, upstream_port: int) -> str:
    """On rank 0: the cache and its gate in the background; prints `<gate port> <cache pid>
    <gate pid> <dir>` once both answer, or fails naming what is missing."""
    return shlex.join(["sh", "-c", START_SCRIPT, "sh", json.dumps(spec), str(upstream_port)])


def start(conn: Connection, spec: dict, upstream_port: int, secret: str) -> Cache:
    """The cache and its gate on rank 0; `secret`: the UpstreamFront's password, sent on stdin."""
    result = conn.run(_start_command(spec, upstream_port), stdin=f"{secret}\n".encode() + GATE_SCRIPT.read_bytes(),
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
