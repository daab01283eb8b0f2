#!/usr/bin/env python3
"""Figures for `sparkstack ship` against the sandbox (a benchmark, not a test).

Both methods in the same run, over the same SSH connections (launcher.transport.remote):

  (a) first ship of a test image (the sandbox base + a 24 MiB stage + an 8 MiB top stage, both
      random so nothing compresses) to all four ranks through launcher.images.ship: bytes per rank,
      seconds, throughput; and, for comparison, raw `cat > /dev/null` with the same number of
      bytes on stdin through Connection.run, four ranks in parallel and one alone
      (goal: ship ≥ 70% of raw).
  (b) re-ship after a change to the top stage only: bytes per rank against that stage's layer
      (goal ≤ 1.1×); naive `docker save IMG | ssh rank docker load` of the same image alongside.
  (c) nothing changed: 0 bytes, seconds for four ranks (goal ≤ 2 s), in-process with fresh
      connections, and the real command line.
  (d) --relay (issue option): the bytes over this host's uplink for a new top stage, against
      once per rank without it.

The registry runs on a temporary storage directory, so a first ship really is one. Every image
it made is removed from this host and the ranks at the end.
Run: .venv/bin/python scripts/bench_ship.py [--stage-mib 24] [--top-mib 8]
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from launcher.inputs import config  # noqa: E402
from launcher.images import registry, relay, ship  # noqa: E402
from launcher.transport import remote  # noqa: E402
from launcher.sandbox import cluster  # noqa: E402

RUN = uuid.uuid4().hex[:8]
REPO = "sparkstack-bench/ship"
LABEL = f"org.sparkstack.bench={RUN}"
MB = 1e6


def build(client, parent: str, name: str, mib: int, salt: str) -> str:
    """`parent` + one layer of `mib` MiB of random bytes; `salt` makes a new layer on demand."""
    dockerfile = (f"FROM {parent}\nRUN echo {salt} > /opt/salt-{name} && "
                  f"head -c {mib << 20} /dev/urandom > /opt/payload-{name}\nLABEL {LABEL}\n")
    ref = f"{REPO}:{name}-{RUN}"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=ref, rm=True)
    return ref


def top_layer(client, ref: str) -> int:
    """Size of the image's last non-empty layer (LABEL adds none)."""
    return next(h["Size"] for h in client.images.get(ref).history() if h["Size"] > 0)


def ship_refs(group, client, refs):
    started = time.monotonic()
    plan = ship.make_plan(group, ship.local_image_ids(refs, client))
    ship.apply(plan, group, say=lambda line: None)
    for r in plan.ranks:
        if r.status not in ("shipped", "up-to-date"):
            sys.exit(f"ship failed: {r.error}")
    return plan, time.monotonic() - started


WIRE: dict[int, list[float]] = {}  # id(counter) -> [first, last] time a byte crossed


def _timed_add(self, n: int, _add=remote.ByteCounter.add) -> None:
    """ByteCounter.add, also noting when the forward first and last carried bytes: the pull's
    time on the wire, apart from Docker's own work on the rank (gunzip, extract, verify)."""
    now = time.monotonic()
    WIRE.setdefault(id(self), [now, now])[1] = now
    _add(self, n)


def wire_seconds() -> float:
    """From the first byte to the last, over every forward since the last call."""
    spans = list(WIRE.values())
    WIRE.clear()
    return max(last for _, last in spans) - min(first for first, _ in spans) if spans else 0.0


def base_metadata(group, client, base: str) -> list[str]:
    """Per rank, how many of the base's layers the rank's Docker knows a registry digest for.
    A base that came by `docker load` has none: its first registry pull moves its layers again."""
    diff_ids = [d.split(":")[1] for d in client.images.get(base).attrs["RootFS"]["Layers"]]
    probe = "; ".join(f"test -f /var/lib/docker/image/overlay2/distribution/v2metadata-by-diffid/sha256/{d} && echo y"
                      for d in diff_ids)
    return [f"{r.stdout.count('y')}/{len(diff_ids)}" for r in group.run(probe, sudo=True).results]


def raw_cat(connections, nbytes: int) -> tuple[float, list[float]]:
    """Wall seconds and per-rank seconds of `cat > /dev/null` with nbytes on stdin, in parallel."""
    data = os.urandom(nbytes)
    started = time.monotonic()
    results = remote.Group(connections).run("cat > /dev/null", stdin=data, timeout=600).results
    wall = time.monotonic() - started
    for r in results:
        assert r.ok, r.why()
    return wall, [r.seconds for r in results]


def forward_fetch(connections, nbytes: int) -> float:
    """Wall seconds for every rank to fetch nbytes from this host through its reverse forward
    (the path a pull takes) into /dev/null: the transport alone, without Docker's own work."""
    import http.server
    import threading

    data = os.urandom(nbytes)

    class Blob(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blob)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ports = [c.reverse_forward(server.server_address[1])[0] for c in connections]
    fetch = ("python3 -c 'import sys, urllib.request, shutil; "
             "shutil.copyfileobj(urllib.request.urlopen(sys.argv[1]), open(\"/dev/null\", \"wb\"), 1 << 20)' "
             "http://127.0.0.1:{}/blob")
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(len(connections)) as pool:
            results = list(pool.map(lambda cp: cp[0].run(fetch.format(cp[1]), timeout=600), zip(connections, ports)))
        wall = time.monotonic() - started
    finally:
        for c, port in zip(connections, ports):
            c.cancel_forward(port)
        server.shutdown()
    for r in results:
        assert r.ok, r.why()
    return wall


def naive(group, client, ref: str) -> tuple[int, float, list[float]]:
    """`docker save ref | ssh rank docker load`, all ranks in parallel (the save done once)."""
    started = time.monotonic()
    data = b"".join(client.images.get(ref).save(named=True))
    saved = time.monotonic() - started
    results = group.run("docker load -q >/dev/null", stdin=data, timeout=600).results
    for r in results:
        assert r.ok, r.why()
    return len(data), time.monotonic() - started, [saved + r.seconds for r in results]


def loaded_base_bench(group, client, base: str, refs: list[str]) -> None:
    """The first registry pull over a base that came by `docker load`: its layers move again."""
    loaded = build(client, base, "loaded", 16, "loaded")
    refs.append(loaded)
    naive(group, client, loaded)
    known = base_metadata(group, client, loaded)
    over = build(client, loaded, "over1", 4, "over1")
    refs.append(over)
    over2 = build(client, loaded, "over2", 4, "over2")
    refs.append(over2)
    print(f"\n(a') a base that came by `docker load`: {loaded} (sandbox base + "
          f"{top_layer(client, loaded) / MB:.1f} MB layer), then an image with a "
          f"{top_layer(client, over) / MB:.1f} MB layer over it")
    print(f"    the loaded base's layers with a registry digest on each rank: {known}")
    plan, _ = ship_refs(group, client, [over])
    print(f"    first ship over it:  {[round(r.bytes / MB, 2) for r in plan.ranks]} MB per rank")
    plan, _ = ship_refs(group, client, [over2])
    print(f"    second ship over it: {[round(r.bytes / MB, 2) for r in plan.ranks]} MB per rank "
          f"(digests now known: {base_metadata(group, client, loaded)})")


def show_ranks(plan, layer: int | None = None) -> None:
    for r in plan.ranks:
        rate = f"{r.bytes / MB / r.seconds:7.1f} MB/s" if r.seconds and r.bytes else " " * 12
        ratio = f"  {r.bytes / layer:.3f}× the layer" if layer else ""
        print(f"    rank {r.rank}  {r.status:<10} {r.bytes / MB:8.2f} MB  {r.seconds:6.2f} s  {rate}{ratio}")


def cli_noop(cfg: Path, ref: str) -> tuple[float, list[dict]]:
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "sparkstack"), "ship", "-c", str(cfg), "--image", ref,
                           "--json"], capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode:
        sys.exit(f"sparkstack ship failed:\n{done.stdout}{done.stderr}")
    return wall, json.loads(done.stdout)["ranks"]


def cleanup(client, connections, refs) -> None:
    for ref in reversed(refs):
        try:
            client.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass
    quoted = " ".join(refs)
    remote.Group(connections).run(f"docker rmi -f {quoted} >/dev/null 2>&1; docker image prune -f "
                                  f"--filter label={LABEL} >/dev/null 2>&1; true")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage-mib", type=int, default=24)
    ap.add_argument("--top-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="first ships measured (ranks cleared between)")
    args = ap.parse_args()
    remote.ByteCounter.add = _timed_add
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still cleans up

    state = cluster.state_dir_default()
    up = cluster.up(state, progress=lambda msg: None)
    cfg = cluster.paths(Path(state).expanduser().resolve())["config"]
    loaded = config.load(cfg)
    base = up["images"]["vllm"]
    client = docker.from_env()
    storage = tempfile.TemporaryDirectory(prefix="sparkstack-bench-registry-")
    registry.LocalRegistry = functools.partial(registry.LocalRegistry, storage=Path(storage.name))
    targets = remote.targets_from_config(loaded.cluster)
    group = remote.Group.from_targets(targets, loaded.cluster.ssh.known_hosts)
    refs: list[str] = []
    try:
        print(f"sandbox base {base}: {client.images.get(base).attrs['Size'] / MB:.1f} MB, "
              f"{len(client.images.get(base).attrs['RootFS']['Layers'])} layers")
        stage = build(client, base, "stage", args.stage_mib, "stage")
        refs.append(stage)
        v1 = build(client, stage, "v1", args.top_mib, "v1")
        refs.append(v1)
        v2 = build(client, stage, "v2", args.top_mib, "v2")
        refs.append(v2)
        group.run("true")  # connect first: neither method pays for the handshakes

        print(f"\n(a) first ship of {v1} (stage {top_layer(client, stage) / MB:.1f} MB "
              f"+ top {top_layer(client, v1) / MB:.1f} MB over the base)")
        known = base_metadata(group, client, base)
        print(f"    base layers with a registry digest on each rank before: {known}")
        ratios, wires = [], []
        per_rank = top_layer(client, stage) + top_layer(client, v1)
        for round_ in range(1, args.rounds + 1):
            # raw before and after the ship: the host is shared, so both see the same load
            raw_before = raw_cat(group.connections, per_rank)[0]
            wire_seconds()
            plan, wall = ship_refs(group, client, [v1])
            wire = wire_seconds()
            print(f"    round {round_}:" + (" (registry start + push of base and stages included)"
                                            if round_ == 1 else " (registry already holds the blobs)"))
            show_ranks(plan)
            moved = sum(r.bytes for r in plan.ranks)
            pull_wall = max(r.seconds for r in plan.ranks)
            raw_after = raw_cat(group.connections, per_rank)[0]
            raw_rate = 4 * per_rank / MB / ((raw_before + raw_after) / 2)
            ship_rate = moved / MB / pull_wall
            ratios.append(ship_rate / raw_rate)
            wires.append(moved / MB / wire / raw_rate)
            print(f"      ship: wall {wall:.2f} s, pulls {pull_wall:.2f} s, aggregate {ship_rate:.1f} MB/s; "
                  f"raw cat > /dev/null of {per_rank / MB:.1f} MB to each rank in parallel: "
                  f"{raw_before:.2f} s before, {raw_after:.2f} s after, aggregate {raw_rate:.1f} MB/s; "
                  f"ship/raw {ship_rate / raw_rate:.0%}")
            print(f"      ship bytes on the wire from first to last: {wire:.2f} s, "
                  f"{moved / MB / wire:.1f} MB/s aggregate, {wires[-1]:.0%} of raw")
            if round_ < args.rounds:  # the ranks forget the image (and its layers) for the next round
                group.run(f"docker rmi {v1} >/dev/null")
        fwd = [forward_fetch(group.connections, per_rank) for _ in range(2)]
        raw = [raw_cat(group.connections, per_rank)[0] for _ in range(2)]
        print(f"    transport alone, {per_rank / MB:.1f} MB to each of 4 ranks: through the reverse "
              f"forward (HTTP GET into /dev/null) {min(fwd):.2f} s, {4 * per_rank / MB / min(fwd):.1f} MB/s; "
              f"raw cat {min(raw):.2f} s, {4 * per_rank / MB / min(raw):.1f} MB/s; "
              f"forward/raw {min(raw) / min(fwd):.0%} (best of 2 each)")
        one_wall, _ = raw_cat(group.connections[:1], per_rank)
        print(f"    raw cat > /dev/null, one rank alone: {one_wall:.2f} s, {per_rank / MB / one_wall:.1f} MB/s")
        print(f"    ship/raw per round: {', '.join(f'{r:.0%}' for r in ratios)}; "
              f"median {sorted(ratios)[len(ratios) // 2]:.0%}; on the wire alone: "
              f"{', '.join(f'{r:.0%}' for r in wires)}")
        print(f"    base layers with a registry digest on each rank after: "
              f"{base_metadata(group, client, base)}")

        loaded_base_bench(group, client, base, refs)

        layer = top_layer(client, v2)
        print(f"\n(b) re-ship after a change to the top stage only: {v2} (its layer {layer / MB:.2f} MB)")
        plan, wall = ship_refs(group, client, [v2])
        show_ranks(plan, layer)
        print(f"    wall {wall:.2f} s")
        nbytes, nwall, neach = naive(group, client, v2)
        print(f"    naive docker save | ssh docker load: {nbytes / MB:.2f} MB to each rank "
              f"({nbytes / layer:.1f}× the layer), wall {nwall:.2f} s "
              f"(per rank {min(neach):.2f}-{max(neach):.2f} s)")

        print(f"\n(c) nothing changed: {v2} again")
        fresh = remote.Group.from_targets(targets, loaded.cluster.ssh.known_hosts)
        started = time.monotonic()
        plan, _ = ship_refs(fresh, client, [v2])
        wall = time.monotonic() - started
        fresh.close()
        print(f"    in-process, fresh connections: {[r.status for r in plan.ranks]}, "
              f"{sum(r.bytes for r in plan.ranks)} bytes, {wall:.2f} s for 4 ranks")
        cwall, rows = cli_noop(cfg, v2)
        print(f"    `sparkstack ship --image ... --json`: {[r['status'] for r in rows]}, "
              f"{sum(r['bytes'] for r in rows)} bytes, {cwall:.2f} s wall (interpreter start included)")

        v3 = build(client, stage, "v3", args.top_mib, "v3")
        refs.append(v3)
        layer = top_layer(client, v3)
        print(f"\n(d) --relay: {v3} (its layer {layer / MB:.2f} MB) through a cache on rank 0")
        started = time.monotonic()
        plan = ship.make_plan(group, ship.local_image_ids([v3], client))
        ship.apply(plan, group, say=lambda line: None, relay=relay.route(loaded))
        wall = time.monotonic() - started
        show_ranks(plan, layer)
        uplink = sum(r.bytes for r in plan.ranks)
        print(f"    uplink (every byte over this host's SSH connections): {uplink / MB:.2f} MB = "
              f"{uplink / layer:.2f}x the layer, wall {wall:.2f} s; without --relay: "
              f"{len(plan.ranks)}x (once per rank, as in (b))")
    finally:
        cleanup(client, group.connections, refs)
        group.close()
        storage.cleanup()


if __name__ == "__main__":
    main()
