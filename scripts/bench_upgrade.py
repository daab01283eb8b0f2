#!/usr/bin/env python3
"""An upgrade's downtime on the sandbox (issue 30). Prints, asserts nothing.

From the sandbox's profile serving, `sparkstack upgrade` to the same chain plus seed 000's keys3
stage (a new image: built here and shipped while the old deploy serves), then `rollback`. Two
figures for the swap: the kit's own (old API stopped -> new API up and verified, as `upgrade`
prints it) and one measured from outside, by a client polling the API's /health every 0.1 s
(the longest gap between two answers). The downtime includes the quick verification of the new
deploy (its own seconds printed beside, from the history entry's figures).

Usage: .venv/bin/python scripts/bench_upgrade.py   (brings the sandbox up if needed; uses a
deploy history of its own, leaves nothing serving and the variant's image off the ranks)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from bench_up import ROOT, run  # scripts/ is this script's own folder: (wall seconds, stdout), exits on failure


def variant(config: str, work: Path) -> str:
    """The sandbox's config with profile sandbox-keys3 (its chain + keys3) in a profiles dir here."""
    profiles = work / "profiles"
    profiles.mkdir()
    prof = yaml.safe_load((ROOT / "env/profiles/sandbox.yaml").read_text())
    (profiles / "sandbox.yaml").write_text(yaml.safe_dump(prof))
    prof["image"]["chain"] = [*prof["image"]["chain"], "keys3"]
    (profiles / "sandbox-keys3.yaml").write_text(yaml.safe_dump(prof))
    data = yaml.safe_load(open(config))
    data.update(profiles_dir=str(profiles), profile="sandbox-keys3")
    path = work / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


class Poller(threading.Thread):
    """/health every 0.1 s; the longest time without an answer."""

    def __init__(self, config: str):
        super().__init__(daemon=True)
        from launcher.inputs import config as config_mod
        from launcher.transport import api

        self.api, self.endpoint = api, api.endpoint(config_mod.load(Path(config)))
        self.stop, self.last_ok, self.longest = threading.Event(), None, 0.0

    def run(self):
        while not self.stop.is_set():
            if self.api.health(self.endpoint):
                now = time.monotonic()
                if self.last_ok is not None:
                    self.longest = max(self.longest, now - self.last_ok)
                self.last_ok = now
            time.sleep(0.1)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help runs nothing
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench-upgrade-"))
    os.environ["XDG_STATE_HOME"] = str(work / "state")  # a history (and API key) of its own
    run("sandbox", "up")
    config = json.loads(run("sandbox", "status", "--json")[1])["config"]
    good = variant(config, work)
    try:
        run("up", "-c", config)
        poller = Poller(config)
        poller.start()
        wall, out = run("upgrade", "-c", good, "--json")
        time.sleep(1)
        poller.stop.set()
        report = json.loads(out)["upgrade"]
        verified = json.loads(run("history", "-c", config, "--json")[1])["entries"][-1]["verify"]
        seconds = verified.get("figures", {}).get("seconds")
        print(f"upgrade sandbox -> sandbox-keys3: {wall:.1f} s in all; prepared while serving "
              f"{report['prepared_s']:.1f} s; downtime (old API stopped -> new API up and verified) "
              f"{report['downtime_s']:.1f} s, of which the quick verification "
              f"({verified['status']}) {seconds if seconds is not None else '-'} s; longest gap a "
              f"client polling /health saw {poller.longest:.1f} s")
        wall, _ = run("rollback", "-c", good)
        print(f"rollback by hand to the sandbox profile: {wall:.1f} s")
    finally:
        run("down", "-c", config)
        for n in range(1, 5):
            subprocess.run(["docker", "exec", f"sparkstack-spark{n}", "sh", "-c",
                            "docker rmi -f $(docker images -q sparkstack/keys3) >/dev/null 2>&1; true"])


if __name__ == "__main__":
    main()
