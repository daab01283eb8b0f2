#!/usr/bin/env python3
"""Re-ship of a 1 MiB top layer over a small stage and over a stage of several GB (a benchmark, not
a test): issue 34's first row. The goal: over the big stage within 1.5x of over the small one.

For each stage (random bytes, so nothing compresses): the stage over the sandbox base, and three
1 MiB tops over it (v1, v2, v3). Outside the sandbox lock: the images are built and v1 is pushed
into this host's registry (launcher/images/pushed.py: the base goes there once, as a first change
over it would put it). Under the lock (/tmp/sparkstack-sandbox.lock), held only for the ships:
v1 shipped to the four ranks (they now hold the stage), then
  re-ship, chosen:  v2, by the way ship chooses (launcher/images/source.py);
  re-ship, save:    v3, forced to read the image by `docker save` (today's main: its only way).
Everything it made (images here and on the ranks, the registry and spool) is removed at the end.
Run: .venv/bin/python scripts/bench_reship.py [--big-gib 3] [--small-mib 64]
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ship import MB, ROOT, build, cleanup, show_ranks, top_layer  # noqa: E402

sys.path.insert(0, str(ROOT))
import docker  # noqa: E402

from launcher.gather import ranks  # noqa: E402
from launcher.images import pushed, registry, ship, source, spool  # noqa: E402
from launcher.images.local_docker import connect  # noqa: E402
from launcher.inputs import config  # noqa: E402
from launcher.sandbox import cluster  # noqa: E402
from launcher.transport import remote  # noqa: E402

LOCK = "/tmp/sparkstack-sandbox.lock"
CHOOSE = source.choose


def forced_save(ref, layers, min_have):
    image = sum(layers.sizes)
    return source.Source(ref, "save", image, image / source.SAVE_BPS, "forced: `docker save` of the whole image")


def timed_ship(group, refs, save: bool = False):
    source.choose = forced_save if save else CHOOSE
    try:
        started = time.monotonic()
        plan = ranks.ship_plan(group, ship.local_image_ids(refs))
        ship.apply(plan, group, say=lambda line: None)
        wall = time.monotonic() - started
    finally:
        source.choose = CHOOSE
    for r in plan.ranks:
        if r.status not in ("shipped", "up-to-date"):
            sys.exit(f"ship failed: {r.error}")
    return plan, wall


def prepare(client, base: str, name: str, mib: int, refs: list[str]) -> dict:
    started = time.monotonic()
    stage = build(client, base, f"stage-{name}", mib, name)
    refs.append(stage)
    tops = {}
    for v in ("v1", "v2", "v3"):
        tops[v] = build(client, stage, f"{name}-{v}", 1, f"{name}-{v}")
        refs.append(tops[v])
    built = time.monotonic() - started
    engine = connect()
    v1 = client.images.get(tops["v1"]).id
    ids = engine.diff_ids(v1)
    started = time.monotonic()
    pushed.fill(registry.LocalRegistry(), v1, ids, len(ids) - 1)  # the base into the registry, once
    return {"stage": stage, **tops, "built": built, "seeded": time.monotonic() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-gib", type=float, default=3.0)
    ap.add_argument("--small-mib", type=int, default=64)
    args = ap.parse_args()
    state = cluster.state_dir_default()
    cfg = cluster.paths(Path(state).expanduser().resolve())["config"]
    loaded = config.load(cfg)
    client = docker.from_env()
    base = next(t for i in client.images.list("sandbox-vllm") for t in i.tags)
    storage = tempfile.TemporaryDirectory(prefix="sparkstack-bench-reship-", dir=Path.home() / ".cache")
    registry.STORAGE = Path(storage.name) / "registry"
    registry.LocalRegistry = functools.partial(registry.LocalRegistry, storage=registry.STORAGE)
    spool.SPOOL = Path(storage.name) / "spool"
    targets = remote.targets_from_config(loaded.cluster)
    group = remote.Group.from_targets(targets, loaded.cluster.ssh.known_hosts)
    refs: list[str] = []
    cases = {"small": args.small_mib, "big": int(args.big_gib * 1024)}
    try:
        made = {}
        for name, mib in cases.items():  # no lock: nothing here touches the sandbox
            made[name] = prepare(client, base, name, mib, refs)
            print(f"{name}: stage {mib} MiB built with its tops in {made[name]['built']:.0f} s; "
                  f"pushed into this host's registry once in {made[name]['seeded']:.1f} s (outside the lock)")
        rows = {}
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            group.run("true")
            for name, m in made.items():
                plan, wall = timed_ship(group, [m["v1"]])
                print(f"\n{name}: v1 to the ranks (they lacked the stage): {wall:.1f} s, "
                      f"{[src.how for src in plan.sources.values()]}")
                layer = top_layer(client, m["v2"])
                for label, ref, save in (("re-ship, chosen", m["v2"], False), ("re-ship, save (main's way)", m["v3"], True)):
                    plan, wall = timed_ship(group, [ref], save)
                    src = next(iter(plan.sources.values()))
                    print(f"  {label}: {wall:.2f} s wall; this host read it by {src.how} ({src.why})")
                    show_ranks(plan, layer)
                    rows[name, save] = wall
            fcntl.flock(lock, fcntl.LOCK_UN)
        print(f"\nre-ship of a 1 MiB top layer, the ranks holding the stage "
              f"(small {cases['small']} MiB, big {cases['big'] / 1024:.1f} GiB):")
        for save, label in ((False, "chosen (this branch)"), (True, "docker save (main)")):
            ratio = rows["big", save] / rows["small", save]
            print(f"  {label:22} small {rows['small', save]:6.2f} s   big {rows['big', save]:6.2f} s   "
                  f"big/small {ratio:5.2f}x   goal <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'}")
    finally:
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cleanup(client, group.connections, refs)
        group.close()
        storage.cleanup()


if __name__ == "__main__":
    main()
