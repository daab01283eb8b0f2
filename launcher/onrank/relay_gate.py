"""Rank 0's gate in front of the relay's registry cache (launcher/images/relay.py): the cache listens on
a Unix socket in the relay's 0700 directory (or, given a number, a port on 127.0.0.1), and this is
what the ranks reach on the rendezvous address. Run there as

    python3 relay_gate.py '<spec>' <cache socket or port> <upstream port> <cache pid> <relay dir>

spec: {"listen": "<address>", "peers": ["<host or IP>", ...],
       "repos": {"<repo>": {"manifests": ["<tag or digest>", ...], "blobs": ["<digest>", ...]}}}

- a connection from anything but the peers (the ranks) is closed at once;
- only GET and HEAD of /v2/, and of this ship's manifests and blobs, reach the cache (403 else):
  the cache's upstream is the build host's registry, which holds every image ever shipped;
- when the upstream forward goes away (the ship ended, or the build host is gone) the gate stops
  the cache, deletes its directory and exits.
It writes its port to <relay dir>/gate.port once listening. Standard library only.
"""

import http.client
import http.server
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time

REQUEST = re.compile(r"/v2/(.+)/(manifests|blobs)/([^/?#]+)")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade"}
WATCH_S = 2


def allowed(method, path, repos):
    """Whether this request may reach the cache: only reads of /v2/ and of the listed
    manifests (by tag or digest) and blobs of the listed repositories, compared literally."""
    if method not in ("GET", "HEAD"):
        return False
    if path == "/v2/":
        return True
    match = REQUEST.fullmatch(path)
    if not match:
        return False
    repo, kind, ref = match.groups()
    return ref in repos.get(repo, {}).get(kind, ())


def addresses(hosts):
    """Every IP address the peers' names and addresses resolve to here."""
    out = set()
    for host in hosts:
        try:
            out.update(ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            sys.stderr.write("gate: %s does not resolve on rank 0; it cannot pull\n" % host)
    return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if not allowed(self.command, self.path, self.server.repos) or self._has_body():
            self.log_message("refused %s %s", self.command, self.path)
            self.send_error(403, explain="not part of this ship")
            return
        upstream = cache_connection(self.server.cache)
        try:  # header by header: Docker sends one Accept line per manifest type
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in self.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    upstream.putheader(key, value)
            upstream.endheaders()
            self._relay(upstream.getresponse())
        finally:
            upstream.close()

    do_HEAD = do_GET

    def _has_body(self):
        return self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers

    def _relay(self, response):
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        if response.getheader("Content-Length") is None and self.command != "HEAD":
            self.send_header("Connection", "close")  # a body without a length ends with the connection
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            shutil.copyfileobj(response, self.wfile, 1 << 16)

    def log_request(self, code="-", size="-"):  # only refusals are logged
        pass

    def log_message(self, fmt, *args):
        sys.stderr.write("gate: %s: %s\n" % (self.client_address[0], fmt % args))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        http.client.HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def cache_connection(cache):
    """To the cache: its Unix socket (a path), or a port on 127.0.0.1 (digits)."""
    if cache.isdigit():
        return http.client.HTTPConnection("127.0.0.1", int(cache), timeout=300)
    return UnixHTTPConnection(cache, 300)


def server_class(listen):
    family = socket.getaddrinfo(listen, None)[0][0]

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

        def verify_request(self, request, client_address):  # False: closed at once
            if ipaddress.ip_address(client_address[0]) in self.peers:
                return True
            sys.stderr.write("gate: refused a connection from %s: not a rank\n" % client_address[0])
            return False

    return Server


def watch(upstream_port, cache_pid, directory):
    """Ends everything once nothing listens on the upstream forward any more."""
    while True:
        time.sleep(WATCH_S)
        try:
            socket.create_connection(("127.0.0.1", upstream_port), timeout=WATCH_S).close()
        except ConnectionRefusedError:
            break
        except OSError:
            continue
    try:
        os.kill(cache_pid, signal.SIGTERM)
    except OSError:
        pass
    shutil.rmtree(directory, ignore_errors=True)
    os._exit(0)


def main(argv):
    spec = json.loads(argv[1])
    cache, upstream_port, cache_pid, directory = argv[2], int(argv[3]), int(argv[4]), argv[5]
    server = server_class(spec["listen"])((spec["listen"], 0), Handler)
    server.peers, server.repos, server.cache = addresses(spec["peers"]), spec["repos"], cache
    port_file = os.path.join(directory, "gate.port")
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    threading.Thread(target=watch, args=(upstream_port, cache_pid, directory), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
