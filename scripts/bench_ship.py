#!/usr/bin/env python3
"""Figures for `sparkstack ship` against the sandbox (a benchmark, not a test).

Every method in the same run, over the same SSH connections (launcher.transport.remote):

  (a) first ship, one rank and then four in parallel, side by side: a fresh image per round (the
      sandbox base + a stage + a top layer, random so nothing compresses; the ranks have the base),
      then (a2) an image FROM scratch (no rank has any of it: naive and ship move the same bytes)
        ship:  launcher.images.ship, wall from asking the ranks to the last tag, this host's
               `docker save` included; then again after the ranks forgot the image (the layers
               from this host's spool; for an image no rank had any of, the save again);
        naive: `docker save IMG | ssh rank docker load` as the seeds' launchers run it (OpenSSH,
               one save per rank, all ranks at once), of the same image after the ranks forgot it;
               and paramiko's (the save once into memory, then each rank's load over ship's
               connections);
        raw:   `cat > /dev/null` of ship's bytes per rank on stdin, over ship's connections
               (paramiko) and over OpenSSH `ssh`; `cat > /tmp/file` on the rank (a tmpfs in the sandbox);
        load:  `docker load -i` of the saved tar already in each rank's /tmp (no network): the
               ceiling for any path into Docker's store.
      Goals: ship ends no later than naive; ship ≥ 70% of raw, unless `load` is below that.
  (b) re-ship after a change to the top stage only: bytes per rank against that stage's layer
      (goal ≤ 1.1×); naive `docker save IMG | ssh rank docker load` of the same image alongside.
  (c) nothing changed: 0 bytes, seconds for four ranks (goal ≤ 2 s), in-process with fresh
      connections, and the real command line.
  (d) --relay: the bytes over this host's uplink for a new top stage, against once per rank
      without it (twice: over layers that came by plain ships, then over relayed ones).

Each rank's line names its Docker image store (the sandbox's default fleet is mixed: spark4 on
containerd's, the others on the classic overlay2). The registry and the spool live in temporary
directories, so a first ship really is one. Every
image it made is removed from this host and the ranks at the end. The host is shared: compare
figures within one run.
Run: .venv/bin/python scripts/bench_ship.py [--stage-mib 64] [--top-mib 8]
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
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from launcher.inputs import config  # noqa: E402
from launcher.gather import ranks  # noqa: E402
from launcher.images import registry, relay, ship, spool  # noqa: E402
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
    plan = ranks.ship_plan(group, ship.local_image_ids(refs))
    ship.apply(plan, group, say=lambda line: None)
    for r in plan.ranks:
        if r.status not in ("shipped", "up-to-date"):
            sys.exit(f"ship failed: {r.error}")
    return plan, time.monotonic() - started


def raw_cat(connections, nbytes: int, into: str = "/dev/null") -> tuple[float, list[float]]:
    """Wall seconds and per-rank seconds of `cat > into` with nbytes on stdin, in parallel."""
    data = os.urandom(nbytes)
    started = time.monotonic()
    command = f"cat > {into}" + ("" if into == "/dev/null" else f" && sync {into}; rm -f {into}")
    results = remote.Group(connections).run(command, stdin=data, timeout=600).results
    wall = time.monotonic() - started
    for r in results:
        assert r.ok, r.why()
    return wall, [r.seconds for r in results]


def build_scratch(client, name: str, mibs: list[int]) -> str:
    """An image FROM scratch with one layer of random bytes per entry of `mibs`: no rank has any
    of it, so the naive way moves exactly what ship moves."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        lines = ["FROM scratch"]
        for i, mib in enumerate(mibs):
            data = os.urandom(mib << 20)
            info = tarfile.TarInfo(f"payload{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            lines.append(f"COPY payload{i} /payload{i}")
        dockerfile = "\n".join([*lines, f"LABEL {LABEL}", ""]).encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    context.seek(0)
    ref = f"{REPO}:{name}-{RUN}"
    client.images.build(fileobj=context, custom_context=True, tag=ref, rm=True)
    return ref


def first_ship_round(group, client, base: str | None, n: int, args, refs: list[str], round_: int) -> list[tuple]:
    """Ship, naive and raw for a fresh image to the first `n` ranks; rows of (method, bytes per
    rank, wall s). `base`: the image over the sandbox base (which the ranks have); None: an image
    from scratch (the ranks lack all of it)."""
    sub = remote.Group(group.connections[:n])
    if base is None:
        ref = build_scratch(client, f"scratch{n}r{round_}", [args.stage_mib, args.top_mib])
    else:
        stage = build(client, base, f"stage{n}r{round_}", args.stage_mib, f"stage{n}r{round_}")
        refs.append(stage)
        ref = build(client, stage, f"first{n}r{round_}", args.top_mib, f"first{n}r{round_}")
    refs.append(ref)
    forget = f"docker rmi {ref} >/dev/null"
    rows = []
    plan, wall = ship_refs(sub, client, [ref])  # the first: this host reads the image (docker save)
    per_rank = max(r.bytes for r in plan.ranks)
    rows.append(("ship (incl. save)", per_rank, wall))
    sub.run(forget)
    plan, wall = ship_refs(sub, client, [ref])
    rows.append(("ship (again)", max(r.bytes for r in plan.ranks), wall))
    sub.run(forget)
    rows.append(("naive save|ssh load", per_rank if base is None else naive_size(client, ref),
                 naive_openssh(sub, ref)))
    sub.run(forget)
    nbytes, nwall, _ = naive(sub, client, ref)
    rows.append(("naive (paramiko)", nbytes, nwall))
    sub.run(forget)
    rows.append(("load from rank's /tmp", nbytes, load_ceiling(sub, client, ref)))
    sub.run(forget)
    rows.append(("raw cat > /dev/null", per_rank, raw_cat(sub.connections, per_rank)[0]))
    rows.append(("raw cat, OpenSSH", per_rank, raw_openssh(sub, per_rank)))
    rows.append(("raw cat > file", per_rank, raw_cat(sub.connections, per_rank, "/tmp/bench-raw")[0]))
    return rows


def ssh_argv(conn) -> list[str]:
    """OpenSSH to the rank with the key and known_hosts the launcher uses."""
    t = conn.target
    return ["ssh", "-i", str(t.key), "-p", str(t.port), "-o", f"UserKnownHostsFile={conn.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{t.user}@{t.address}"]


def naive_size(client, ref: str) -> int:
    return sum(len(chunk) for chunk in client.images.get(ref).save(named=True))


def naive_openssh(group, ref: str) -> float:
    """`docker save ref | ssh rank 'docker load'`, one pipeline per rank, all at once."""
    started = time.monotonic()
    pipes = [subprocess.Popen(f"docker save {ref} | {' '.join(ssh_argv(c))} 'docker load -q >/dev/null'",
                              shell=True) for c in group.connections]
    assert [p.wait() for p in pipes] == [0] * len(pipes), "naive save|ssh load failed"
    return time.monotonic() - started


def load_ceiling(group, client, ref: str) -> float:
    """`docker load -i` of the image's save, already in each rank's /tmp, all ranks at once."""
    data = b"".join(client.images.get(ref).save(named=True))
    try:
        for r in group.run("cat > /tmp/bench-load.tar", stdin=data, timeout=600).results:
            assert r.ok, f"{r.why()} (the sandbox ranks' /tmp holds 512 MB: a smaller --stage-mib)"
        started = time.monotonic()
        results = group.run("docker load -q -i /tmp/bench-load.tar >/dev/null", timeout=600).results
        wall = time.monotonic() - started
    finally:
        group.run("rm -f /tmp/bench-load.tar")
    for r in results:
        assert r.ok, r.why()
    return wall


def raw_openssh(group, nbytes: int) -> float:
    data = os.urandom(nbytes)
    started = time.monotonic()
    procs = [subprocess.Popen([*ssh_argv(c), "cat > /dev/null"], stdin=subprocess.PIPE) for c in group.connections]
    feeders = [threading.Thread(target=_write_all, args=(p, data)) for p in procs]
    for f in feeders:
        f.start()
    for f in feeders:
        f.join()
    assert [p.wait() for p in procs] == [0] * len(procs), "ssh cat failed"
    return time.monotonic() - started


def _write_all(proc, data: bytes) -> None:
    view = memoryview(data)
    for start in range(0, len(view), 1 << 20):
        proc.stdin.write(view[start:start + (1 << 20)])
    proc.stdin.close()


def show_first(rows_by_n: dict[int, list[tuple]]) -> None:
    print(f"    {'':22} {'ranks':>5} {'MB/rank':>8} {'wall s':>7} {'MB/s all':>9} {'vs raw':>7} {'vs naive':>9}")
    for n, rows in rows_by_n.items():
        raw = next(r for r in rows if r[0] == "raw cat > /dev/null")
        nv = next(r for r in rows if r[0] == "naive save|ssh load")
        for method, per_rank, wall in rows:
            rate = n * per_rank / MB / wall
            print(f"    {method:22} {n:5} {per_rank / MB:8.1f} {wall:7.2f} {rate:9.1f} "
                  f"{rate / (n * raw[1] / MB / raw[2]):7.0%} {nv[2] / wall:8.2f}x")
    print("    (MB/s all: bytes moved to all ranks / wall; vs raw: against raw cat > /dev/null over ship's "
          "connections; vs naive: `docker save | ssh docker load`'s wall / this wall, >1 = faster)")


def naive(group, client, ref: str) -> tuple[int, float, list[float]]:
    """`docker save ref | ssh rank docker load`, all ranks in parallel (the save done once)."""
    started = time.monotonic()
    data = b"".join(client.images.get(ref).save(named=True))
    saved = time.monotonic() - started
    results = group.run("docker load -q >/dev/null", stdin=data, timeout=600).results
    for r in results:
        assert r.ok, r.why()
    return len(data), time.monotonic() - started, [saved + r.seconds for r in results]


def show_ranks(plan, layer: int | None = None) -> None:
    for r in plan.ranks:
        rate = f"{r.bytes / MB / r.seconds:7.1f} MB/s" if r.seconds and r.bytes else " " * 12
        ratio = f"  {r.bytes / layer:.3f}× the layer" if layer else ""
        store = f"{r.store or '':<10}"  # the sandbox's default fleet is mixed: spark4 on containerd's image store
        print(f"    rank {r.rank}  {store} {r.status:<10} {r.bytes / MB:8.2f} MB  {r.seconds:6.2f} s  {rate}{ratio}")


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
    ap.add_argument("--stage-mib", type=int, default=64)
    ap.add_argument("--top-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="first-ship rounds (a fresh image each)")
    ap.add_argument("--first-only", action="store_true", help="only (a) and (a2), the first ships")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still cleans up

    state = cluster.state_dir_default()
    up = cluster.up(state, progress=lambda msg: None)
    cfg = cluster.paths(Path(state).expanduser().resolve())["config"]
    loaded = config.load(cfg)
    base = up["images"]["vllm"]
    client = docker.from_env()
    storage = tempfile.TemporaryDirectory(prefix="sparkstack-bench-registry-")
    registry.LocalRegistry = functools.partial(registry.LocalRegistry, storage=Path(storage.name) / "registry")
    spool.SPOOL = Path(storage.name) / "spool"
    targets = remote.targets_from_config(loaded.cluster)
    group = remote.Group.from_targets(targets, loaded.cluster.ssh.known_hosts)
    refs: list[str] = []
    try:
        print(f"sandbox base {base}: {client.images.get(base).attrs['Size'] / MB:.1f} MB, "
              f"{len(client.images.get(base).attrs['RootFS']['Layers'])} layers")
        stage = build(client, base, "stage", args.stage_mib, "stage")
        refs.append(stage)
        v2 = build(client, stage, "v2", args.top_mib, "v2")
        refs.append(v2)
        group.run("true")  # connect first: no method pays for the handshakes

        cases = ((base, f"(a) first ship of a fresh image (stage {args.stage_mib} MiB + top {args.top_mib} MiB "
                        "over the sandbox base, which the ranks have), one rank, then four"),
                 (None, f"(a2) first ship of an image FROM scratch ({args.stage_mib} MiB + {args.top_mib} MiB "
                        "layers): no rank has any of it, so naive and ship move the same bytes"))
        for case_base, title in cases:
            print(f"\n{title}")
            for round_ in range(1, args.rounds + 1):
                rows = {n: first_ship_round(group, client, case_base, n, args, refs, round_) for n in (1, 4)}
                print(f"    round {round_}:")
                show_first(rows)
        if args.first_only:
            return
        v1 = build(client, stage, "v1", args.top_mib, "v1")
        refs.append(v1)
        plan, _ = ship_refs(group, client, [v1])
        print(f"\n    {v1} shipped to every rank for (b): {[round(r.bytes / MB, 2) for r in plan.ranks]} MB")

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

        # Layers that came by a plain ship (docker load) have no registry digest on the ranks: the
        # first relayed pull over them moves them once more. So v3 first, then v4 measured.
        for name in ("v3", "v4"):
            ref = build(client, stage if name == "v3" else refs[-1], name, args.top_mib, name)
            refs.append(ref)
            layer = top_layer(client, ref)
            print(f"\n(d) --relay: {ref} (its layer {layer / MB:.2f} MB) through a cache on rank 0"
                  + (", over layers that came by plain ships" if name == "v3" else ", over v3 (relayed)"))
            started = time.monotonic()
            plan = ranks.ship_plan(group, ship.local_image_ids([ref]))
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
