"""A rank's side of a relayed ship: a loopback port forwarded to rank 0's registry cache, and the
pull through it. Sent on stdin like the probe and run on the rank as

    python3 - '{"target": ["<rank 0 address>", <port>], "command": "<shell; {port} = the local port>"}'

Why a forwarder at all: Docker pulls from a registry without TLS only on 127.0.0.1, and rank 0's
cache is on another host. Standard library only; it ends when the command ends, with its exit
status and its output passed through.
"""

import json
import socket
import subprocess
import sys
import threading


def pump(src, dst):
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listener, target):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(target, timeout=10)
            upstream.settimeout(None)
        except OSError as e:
            sys.stderr.write("relay: cannot reach rank 0's cache at %s:%s: %s\n" % (target[0], target[1], e))
            client.close()
            continue
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


def main(argv):
    args = json.loads(argv[1])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    threading.Thread(target=serve, args=(listener, tuple(args["target"])), daemon=True).start()
    done = subprocess.run(["sh", "-c", args["command"].replace("{port}", str(port))])
    listener.close()
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
