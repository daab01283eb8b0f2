"""`sparkstack fetch` on the sandbox (issue 35): the stand-in Hub listens on the sandbox network's
gateway (this host: the sandbox's checkpoint host, as nfs_link names it), the real client fetches
the fixture checkpoint from it, and `check --deep` then compares every rank's checkpoint with the
Hub's digests (the manifest fetch wrote), not with a copy of ours. The sandbox's own checkpoint
directory is not written: the fetch goes to a directory of the test's, and the manifest applies
to the ranks because their checkpoint has the same fingerprint (the same deterministic files)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.sandbox import cluster, model_fixture, nfs_link
from launcher.sandbox.standins.standin_hub import Hub, Repo

from serving import cli

REPO = "sandbox-org/glm53-sandbox-EXL3"
SPARKSTACK = str(Path(sys.executable).parent / "sparkstack")


def test_fetched_digests_are_what_check_deep_compares_every_rank_with(sandbox, tmp_path):
    src = tmp_path / "hub"
    model_fixture.write_checkpoint(src)
    hub = Hub((nfs_link.server(cluster.subnet()), 0), [Repo(REPO, str(src))]).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), SPARKSTACK_CONFIG=str(sandbox.config))
        done = subprocess.run([SPARKSTACK, "fetch", REPO, "--to", str(tmp_path / "export"), "--json"], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["result"]["moved"] == got["plan"]["total"] == sum(hub.served.values())
        manifest = json.loads(Path(got["result"]["manifest"]).read_text())
        assert manifest["source"]["commit"] == hub.repos[REPO].commit
    finally:
        hub.shutdown()
        hub.server_close()
    result = cli("check", "--json", "--deep", "-c", str(sandbox.config))
    rows = {(r["rank"], c["name"]): c for r in json.loads(result.stdout)["ranks"] for c in r["checks"]}
    for r in range(len(sandbox.names)):
        assert rows[(r, "hashes")]["status"] == "pass", rows[(r, "hashes")]
        assert "files match the manifest" in rows[(r, "hashes")]["value"]
