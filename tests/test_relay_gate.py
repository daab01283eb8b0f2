"""The relay's gate (launcher/onrank/relay_gate.py) on loopback: only the peers get in, only this ship's
manifests and blobs get through, and it cleans up once the upstream forward is gone. Also how
launcher/images/relay.py hands it its spec and quotes what it runs on rank 0."""

import http.server
import json
import shlex
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from launcher.inputs import config
from launcher.images import relay
from launcher.onrank import relay_gate

REPOS = {"sparkstack/keys": {"manifests": ["abc123", "sha256:m1"], "blobs": ["sha256:l1", "sha256:c1"]}}


@pytest.mark.parametrize("method, path, ok", [
    ("GET", "/v2/", True),
    ("HEAD", "/v2/sparkstack/keys/manifests/abc123", True),
    ("GET", "/v2/sparkstack/keys/manifests/sha256:m1", True),
    ("GET", "/v2/sparkstack/keys/blobs/sha256:l1", True),
    ("GET", "/v2/sparkstack/keys/blobs/sha256:other", False),  # a blob of another image
    ("GET", "/v2/sparkstack/keys/manifests/latest", False),    # another tag
    ("GET", "/v2/sparkstack/dcp/manifests/abc123", False),     # another repository
    ("GET", "/v2/_catalog", False),
    ("GET", "/v2/sparkstack/keys/tags/list", False),
    ("GET", "/v2/sparkstack%2Fkeys/blobs/sha256:l1", False),
    ("GET", "/v2/sparkstack/keys/blobs/sha256:l1?x=1", False),
    ("GET", "/v2/x/../sparkstack/keys/blobs/sha256:l1", False),
    ("POST", "/v2/sparkstack/keys/blobs/uploads/", False),
    ("PUT", "/v2/sparkstack/keys/manifests/abc123", False),
    ("DELETE", "/v2/sparkstack/keys/blobs/sha256:l1", False),
])
def test_allowed(method, path, ok):
    assert relay_gate.allowed(method, path, REPOS) is ok


class Upstream(http.server.BaseHTTPRequestHandler):
    """Stands for the registry cache: answers every GET/HEAD and records the paths it saw."""

    protocol_version = "HTTP/1.1"
    seen: list = []
    accepted: list = []

    def do_GET(self):
        self.seen.append(self.path)
        Upstream.accepted = self.headers.get_all("Accept")
        body = f"served {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Content-Digest", "sha256:m1")
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def gate(tmp_path):
    """The gate as rank 0 runs it, on 127.0.0.1 with 127.0.0.1 its only peer; a stand-in cache
    behind it, a listening socket for the upstream forward, and a process for the cache's pid."""
    cache = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=cache.serve_forever, daemon=True).start()
    forward = socket.create_server(("127.0.0.1", 0))
    cache_process = subprocess.Popen(["sleep", "300"])
    spec = {"listen": "127.0.0.1", "peers": ["127.0.0.1"], "repos": REPOS}
    process = subprocess.Popen([sys.executable, relay_gate.__file__, json.dumps(spec), str(cache.server_address[1]),
                                str(forward.getsockname()[1]), str(cache_process.pid), str(tmp_path)],
                               stderr=subprocess.PIPE, text=True)
    port_file = tmp_path / "gate.port"
    deadline = time.monotonic() + 10
    while not port_file.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the gate did not start"
        time.sleep(0.05)
    Upstream.seen = []
    yield {"port": int(port_file.read_text()), "process": process, "forward": forward,
           "cache_process": cache_process, "dir": tmp_path}
    process.terminate()  # SIGTERM, as the ship's cleanup does (and coverage saves what the gate ran)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("the gate did not stop on SIGTERM") from None
    cache_process.kill()
    cache_process.wait()
    forward.close()
    cache.shutdown()


def request(port, method, path, source="127.0.0.1", headers="") -> bytes:
    """One raw HTTP request from `source`; what came back before the gate closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: rank0\r\n{headers}Connection: close\r\n\r\n".encode())
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def test_a_rank_reads_this_ships_images_through_the_gate(gate):
    answer = request(gate["port"], "GET", "/v2/sparkstack/keys/blobs/sha256:l1")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"served /v2/sparkstack/keys/blobs/sha256:l1")
    assert b"Docker-Content-Digest: sha256:m1" in answer
    # Docker asks for a manifest with one Accept line per type it takes: all of them get through
    head = request(gate["port"], "HEAD", "/v2/sparkstack/keys/manifests/abc123",
                   headers="Accept: application/vnd.oci.image.index.v1+json\r\n"
                           "Accept: application/vnd.docker.distribution.manifest.v2+json\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")  # headers, no body
    assert Upstream.accepted == ["application/vnd.oci.image.index.v1+json",
                                 "application/vnd.docker.distribution.manifest.v2+json"]
    assert Upstream.seen == ["/v2/sparkstack/keys/blobs/sha256:l1", "/v2/sparkstack/keys/manifests/abc123"]


def test_anything_else_is_refused_before_the_cache(gate):
    for method, path, status in [("GET", "/v2/sparkstack/keys/blobs/sha256:other", b"403 Forbidden"),
                                 ("GET", "/v2/_catalog", b"403 Forbidden"),
                                 ("DELETE", "/v2/sparkstack/keys/blobs/sha256:l1", b"501 Unsupported method")]:
        assert request(gate["port"], method, path).startswith(b"HTTP/1.1 " + status)
    assert Upstream.seen == []


def test_a_host_that_is_not_a_rank_gets_nothing(gate):
    assert request(gate["port"], "GET", "/v2/", source="127.0.0.2") == b""
    assert Upstream.seen == []
    gate["process"].kill()
    assert "refused a connection from 127.0.0.2: not a rank" in gate["process"].communicate()[1]


def test_the_gate_ends_the_cache_when_the_forward_goes(gate):
    gate["forward"].close()  # the ship ended, or the build host went away
    assert gate["process"].wait(timeout=30) == 0
    assert gate["cache_process"].wait(timeout=5) == -15  # SIGTERM
    assert not gate["dir"].exists()


def test_start_command_passes_values_as_parameters():
    """Nothing from the config is pasted into the script run on rank 0 (a rendezvous of
    `10.0.0.11$(touch /tmp/x)` would have run there)."""
    hostile = "10.0.0.11$(touch /tmp/x)"
    argv = shlex.split(relay._start_command({"listen": hostile, "peers": [hostile], "repos": {}}, 4242))
    assert "$secret" in relay.START_SCRIPT and "read -r secret" in relay.START_SCRIPT  # from stdin
    assert argv[:3] == ["sh", "-c", relay.START_SCRIPT] and argv[3] == "sh"
    assert json.loads(argv[4])["listen"] == hostile and argv[5] == "4242"
    assert "touch" not in relay.START_SCRIPT


def test_gate_spec_merges_tags_of_one_repository(write_config):
    loaded = config.load(write_config(lambda d: d.update(topology="switch")))
    route = relay.route(loaded)
    assert route.address == "192.168.177.1"  # rank 0's fabric IP on a switch
    assert {"10.0.0.11", "10.0.0.14", "192.168.177.1", "192.168.178.4"} <= set(route.peers)
    spec = relay.gate_spec(route, [("a/b", ["t1", "sha256:m1"], ["sha256:l1"]),
                                   ("a/b", ["t2", "sha256:m2"], ["sha256:l1", "sha256:l2"])])
    assert spec["repos"] == {"a/b": {"manifests": ["sha256:m1", "sha256:m2", "t1", "t2"],
                                     "blobs": ["sha256:l1", "sha256:l2"]}}
    assert spec["listen"] == "192.168.177.1" and spec["peers"] == list(route.peers)


def test_the_upstream_front_reads_only_with_the_ships_secret():
    """Issue 33: rank 0's reverse forward leads to this front, not to the registry: any user of
    rank 0 can open that port, and only the cache has the ship's secret (token auth)."""
    registry = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=registry.serve_forever, daemon=True).start()
    front = relay.UpstreamFront(registry.server_address[1])
    Upstream.seen = []
    url = f"http://127.0.0.1:{front.port}"
    path = "/v2/sparkstack/keys/manifests/abc123"
    try:
        refused = httpx.get(url + path)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == (f'Bearer realm="http://127.0.0.1:{front.port}{relay.TOKEN_PATH}",'
                                                        'service="sparkstack"')
        assert httpx.get(url + relay.TOKEN_PATH, auth=("sparkstack", "a guess")).status_code == 401
        assert httpx.get(url + path, headers={"Authorization": "Bearer a guess"}).status_code == 401
        assert httpx.post(url + "/v2/sparkstack/keys/blobs/uploads/").status_code == 501  # no push, ever
        token = httpx.get(url + relay.TOKEN_PATH + "?scope=repository:sparkstack/keys:pull",
                          auth=("sparkstack", front.password)).json()["token"]
        served = httpx.get(url + path, headers={"Authorization": f"Bearer {token}"})
        assert served.status_code == 200 and served.text == f"served {path}"
        assert Upstream.seen == [path]  # nothing else reached the registry
    finally:
        front.close()
        registry.shutdown()
