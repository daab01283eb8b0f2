"""`sparkstack fetch` (issue 35) against the sandbox's stand-in Hub on loopback: the real client
(huggingface_hub, through HF_ENDPOINT) lists the fixture checkpoint with its LFS sha256, resolves
each file (redirects, ETags) and moves its bytes (Range requests on a resume). No sandbox needed:
this host is the checkpoint's host (--to a directory here, or model.nfs naming this host)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.apply import fetch as fetch_mod
from launcher.check import hashes as judged
from launcher.gather import hashes
from launcher.facts.checkpoint_dir import parse_checkpoint
from launcher.onrank import probe as onrank_probe
from launcher.plan import fetching
from launcher.sandbox import model_fixture
from launcher.sandbox.standins.standin_hub import Hub, Repo

REPO = "sandbox-org/glm53-fixture-EXL3"
GATED = "sandbox-org/glm53-fixture-gated"
GRANTED = "hf_sandboxStandinGrantedToken0000"
SPARKSTACK = [str(Path(sys.executable).parent / "sparkstack")]  # installed beside the venv's python


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub") / "ckpt"
    model_fixture.write_checkpoint(d)
    return d


@pytest.fixture
def hub(source):
    h = Hub(("127.0.0.1", 0), [Repo(REPO, str(source)), Repo(GATED, str(source), gated=True, granted=[GRANTED])])
    h.start()
    yield h
    h.shutdown()
    h.server_close()


@pytest.fixture
def env(tmp_path, hub, write_config):
    """The CLI's environment: the stand-in Hub as HF_ENDPOINT, no token, state and HF home here."""
    cfg = write_config(lambda d: d["model"].update(path=str(tmp_path / "models" / "glm"), nfs=None))
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
             XDG_STATE_HOME=str(tmp_path / "state"), SPARKSTACK_CONFIG=str(cfg), NO_COLOR="1",
             PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return e


def run(env, *args, **kw):
    return subprocess.run([*SPARKSTACK, "fetch", *args], env=env, capture_output=True, text=True, timeout=120, **kw)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_lands_the_publishers_files_and_their_digests_become_the_manifest(tmp_path, env, hub, source):
    dest = tmp_path / "export"
    done = run(env, REPO, "--to", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["plan"]["commit"] == hub.repos[REPO].commit and got["result"]["error"] == ""
    for f in source.iterdir():
        assert (dest / f.name).read_bytes() == f.read_bytes()
    assert not list(dest.glob(".*.partial"))
    assert sum(hub.served.values()) == got["plan"]["total"] == got["result"]["moved"]
    assert "fetch: " in done.stderr and "MB/s" in done.stderr and "ETA" in done.stderr
    # the manifest: named after the fingerprint the ranks' probe reads, the Hub's digests in it
    found = parse_checkpoint(onrank_probe.checkpoint(str(dest)))
    manifest = json.loads(Path(got["result"]["manifest"]).read_text())
    assert Path(got["result"]["manifest"]) == hashes.manifest_file(found.fingerprint).resolve() or \
        got["result"]["manifest"].endswith(f"{found.fingerprint[:24]}.json")
    lfs = {e["rfilename"]: e["lfs"]["sha256"] for e in hub.repos[REPO].files.values() if "lfs" in e}
    assert lfs and all(manifest["sha256"][n] == s for n, s in lfs.items())
    assert manifest["sha256"]["config.json"] == sha256(source / "config.json")
    assert manifest["source"] == {"hub": hub.url, "repo": REPO, "revision": "main",
                                  "commit": hub.repos[REPO].commit}
    # again: nothing moves, nothing is hashed (checked before, same size and mtime)
    hub.reset_counts()
    again = run(env, REPO, "--to", str(dest), "--json")
    assert again.returncode == 0, again.stderr
    assert sum(hub.served.values()) == 0 and json.loads(again.stdout)["result"]["hashed"] == []


def test_an_interrupted_fetch_resumes_and_only_the_rest_moves(tmp_path, env, hub, source):
    dest = tmp_path / "export"
    total = sum(f.stat().st_size for f in source.iterdir())
    hub.rate = total / 6  # ~6 s for the whole checkpoint: Ctrl+C lands mid-file
    p = subprocess.Popen([*SPARKSTACK, "fetch", REPO, "--to", str(dest), "--workers", "2"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(f.stat().st_size > total / 8 for f in dest.glob(".*.partial")):
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=30)
    assert p.returncode == 130, stderr
    assert "re-run `sparkstack fetch` to resume" in stderr and "Traceback" not in stderr
    on_disk = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
    assert 0 < on_disk < total and any(f.stat().st_size for f in dest.glob(".*.partial"))
    dry = json.loads(run(env, REPO, "--to", str(dest), "--dry-run", "--json").stdout)
    assert dry["plan"]["to_move"] == total - on_disk
    assert "partial" in {f["state"] for f in dry["plan"]["files"]}
    hub.rate, _ = 0, hub.reset_counts()
    done = run(env, REPO, "--to", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    moved = sum(hub.served.values())
    assert moved == total - on_disk == json.loads(done.stdout)["result"]["moved"]  # only the rest moved
    assert any(r and r.startswith("bytes=") and not r.startswith("bytes=0-") for _m, _p, r in hub.requests)
    for f in source.iterdir():
        assert sha256(dest / f.name) == sha256(f), f.name


def test_a_shard_corrupted_in_transit_is_named_and_fetched_again(tmp_path, env, hub, source):
    dest = tmp_path / "export"
    shard = model_fixture.shard_name(1)
    hub.corrupt.add(shard)
    done = run(env, REPO, "--to", str(dest))
    assert done.returncode == 0, done.stderr
    assert f"{shard}: corrupted in transit" in done.stderr and "fetching it again" in done.stderr
    assert sha256(dest / shard) == sha256(source / shard)
    assert hub.served[shard] == 2 * (source / shard).stat().st_size  # once bad, once good
    assert f"fetched again: {shard}" in done.stdout


def test_a_lost_connection_is_resumed_in_the_same_run(tmp_path, env, hub, source):
    """The connection drops mid-shard: the client asks for the rest (a Range request) and the
    file lands whole; what moved again is at most the chunk that was in flight."""
    from launcher.apply.fetch import CHUNK

    dest = tmp_path / "export"
    shard = model_fixture.shard_name(0)
    size = (source / shard).stat().st_size
    hub.cut[shard] = size // 2
    done = run(env, REPO, "--to", str(dest))
    assert done.returncode == 0, done.stderr
    assert sha256(dest / shard) == sha256(source / shard)
    assert size <= hub.served[shard] < size + CHUNK
    assert any(p.startswith("/cdn/") and r and r != "bytes=0-" for _m, p, r in hub.requests)


def test_a_file_spoiled_on_disk_after_the_fetch_is_found_by_verify_all(tmp_path, env, hub, source):
    dest = tmp_path / "export"
    assert run(env, REPO, "--to", str(dest)).returncode == 0
    shard = dest / model_fixture.shard_name(2)
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    done = run(env, REPO, "--to", str(dest), "--verify-all")
    assert done.returncode == 0, done.stderr
    assert f"{shard.name}: present, but its digest" in done.stderr
    assert sha256(shard) == sha256(source / shard.name)


def test_a_gated_repository_without_a_token_says_where_to_accept_and_what_to_set(tmp_path, env, hub):
    dest = tmp_path / "export"
    done = run(env, GATED, "--to", str(dest))
    assert done.returncode == 2
    assert f"{hub.url}/{GATED}" in done.stderr and "HF_TOKEN" in done.stderr and "accept" in done.stderr
    assert "Traceback" not in done.stderr and not dest.exists()
    assert not [r for r in hub.requests if "/cdn/" in r[1]]
    # a token the repository has not granted: the Hub's 403, said the same way
    denied = subprocess.run([*SPARKSTACK, "fetch", GATED, "--to", str(dest)], env={**env, "HF_TOKEN": "hf_notGranted"},
                       capture_output=True, text=True, timeout=120)
    assert denied.returncode == 2 and "has not been granted access" in denied.stderr
    assert f"{hub.url}/{GATED}" in denied.stderr and "Traceback" not in denied.stderr
    assert "hf_notGranted" not in denied.stderr + denied.stdout  # the token is never printed
    ok = subprocess.run([*SPARKSTACK, "fetch", GATED, "--to", str(dest)], env={**env, "HF_TOKEN": GRANTED},
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert GRANTED not in ok.stderr + ok.stdout


def test_the_token_file_is_read_too(tmp_path, env, hub):
    (tmp_path / "hf").mkdir(exist_ok=True)
    (tmp_path / "hf" / "token").write_text(GRANTED)
    done = run(env, GATED, "--to", str(tmp_path / "export"))
    assert done.returncode == 0, done.stderr


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_is_refused_before_anything_moves(env, hub, small_tmpfs):
    done = run(env, REPO, "--to", str(small_tmpfs / "glm"))
    assert done.returncode == 1
    assert "free" in done.stderr and "nothing was downloaded" in done.stderr and "Traceback" not in done.stderr
    assert sum(hub.served.values()) == 0 and not [r for r in hub.requests if "/resolve/" in r[1]]
    assert not list(small_tmpfs.iterdir())


def test_the_destination_is_the_export_on_its_server_else_rank_0():
    here = {"127.0.0.1", "10.0.0.5"}
    assert fetching.destination("/models/glm", "10.0.0.5", "/srv/models/glm", None, here, "10.0.0.11") == \
        ("/srv/models/glm", "model.nfs.export: this host is the NFS server 10.0.0.5")
    with pytest.raises(ValueError, match="run `sparkstack fetch` there"):
        fetching.destination("/models/glm", "10.0.0.9", "/srv/glm", None, here, "10.0.0.11")
    assert fetching.destination("/models/glm", None, None, None, {"10.0.0.11"}, "10.0.0.11")[0] == "/models/glm"
    with pytest.raises(ValueError, match="on rank 0"):
        fetching.destination("/models/glm", None, None, None, here, "10.0.0.11")
    assert fetching.destination("/models/glm", "10.0.0.9", "/srv", "/mnt/x", here, "10.0.0.11") == ("/mnt/x", "--to")


def test_the_plan_counts_partials_and_refuses_a_short_disk():
    files = (fetching.HubFile("a.safetensors", 3 << 30, "b1", "s" * 64), fetching.HubFile("config.json", 100, "b2"))
    listing = fetching.Listing("o/r", "main", "c" * 40, False, files)
    plan = fetching.make_plan(listing, "/d", {"a.safetensors": fetching.Have(None, 1 << 30)}, 10 << 30)
    assert [s.state for s in plan.steps] == ["partial", "missing"] and plan.to_move == (2 << 30) + 100
    assert plan.refusals() == []
    short = fetching.make_plan(listing, "/d", {}, 3 << 30)
    assert short.refusals() and "nothing was downloaded" in short.refusals()[0]
    done = fetching.make_plan(listing, "/d", {"a.safetensors": fetching.Have(3 << 30, 0, True),
                                              "config.json": fetching.Have(100)}, 0)
    assert [s.state for s in done.steps] == ["verified", "present"] and done.to_move == 0 and not done.refusals()


def test_the_stand_in_listens_only_on_loopback_or_the_sandbox_network(source):
    with pytest.raises(ValueError, match="loopback or the sandbox network"):
        Hub(("8.8.8.8", 0), [Repo(REPO, str(source))])


def test_check_deep_names_the_hubs_digest_and_the_fetch_that_repairs(tmp_path, monkeypatch, hub, source):
    """A rank's shard that differs from a manifest `fetch` wrote: the finding names the Hub's
    commit and the fetch that re-fetches it."""
    from types import SimpleNamespace

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    found = parse_checkpoint(onrank_probe.checkpoint(str(source)))
    sha = {n: sha256(source / n) for n in hashes.files(SimpleNamespace(checkpoint=found))}
    hashes.write(found.fingerprint, str(source), sha, {"repo": REPO, "commit": "c" * 40})
    bad = dict(sha, **{model_fixture.shard_name(0): "0" * 64})
    kept = hashes.load(found.fingerprint), hashes.source(found.fingerprint)
    finding = judged._judge(0, SimpleNamespace(checkpoint=found), bad, "", "/models/glm", {}, False, *kept)
    assert "the Hub's digest" in finding.value and f"sparkstack fetch {REPO}" in finding.fix
    good = judged._judge(0, SimpleNamespace(checkpoint=found), sha, "", "/models/glm", {}, False, *kept)
    assert good.status == "pass"
    assert "files match the manifest (the Hub's digests: " + REPO in good.value


def test_a_short_disk_as_the_free_space_fact_says_is_refused_in_process(tmp_path, env, hub, monkeypatch):
    """The same refusal without root: the free-space fact faked, the command run in-process."""
    from click.testing import CliRunner

    from launcher.cli.commands import main

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(fetch_mod, "free_bytes", lambda dest: 5_000_000)
    result = CliRunner().invoke(main, ["fetch", REPO, "--to", str(tmp_path / "export")])
    assert result.exit_code == 1 and "5.0 MB free, the fetch needs" in result.output
    assert "nothing was downloaded" in result.output and not (tmp_path / "export").exists()
    assert sum(hub.served.values()) == 0


def test_include_fetches_only_the_files_it_names(tmp_path, env, hub):
    dest = tmp_path / "export"
    done = run(env, REPO, "--to", str(dest), "--include", "*.json", "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir() if p.is_file()) == \
        ["config.json", "generation_config.json", "model.safetensors.index.json"]
    assert json.loads(done.stdout)["result"]["manifest"] == ""  # no shards: no manifest to compare ranks with
    assert "no file matches" in run(env, REPO, "--to", str(dest), "--include", "*.gguf").stderr


def test_a_listed_name_that_escapes_the_destination_is_refused(tmp_path, env, hub, source):
    repo = hub.repos[REPO]
    entry = dict(next(iter(repo.files.values())), rfilename="../escaped.json")
    repo.files["../escaped.json"] = entry
    try:
        done = run(env, REPO, "--to", str(tmp_path / "export"))
    finally:
        del repo.files["../escaped.json"]
    assert done.returncode == 1 and "would land outside the destination" in done.stderr
    assert not (tmp_path / "escaped.json").exists() and not (tmp_path / "export").exists()
