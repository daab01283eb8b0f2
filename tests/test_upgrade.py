"""`upgrade`, `rollback` and `history` on the sandbox (issue 30): an upgrade whose new start fails,
or whose verification fails (the sandbox chain's variant whose overlay emits noise), rolls back by
itself and the old deploy serves again, verified; a good one serves, verified, with its downtime
printed; `rollback` by hand goes back, and refuses, naming the rank, when a rank no longer has
the entry's image. Each test starts from the sandbox's own profile served (and verified), with a
deploy history of its own, and ends with nothing serving and the images it shipped removed from
the ranks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from serving import cli, states

ROOT = Path(__file__).resolve().parents[1]
VARIANT = "sandbox-keys3"  # the sandbox's chain with seed 000's optional keys3 stage: a new image


@pytest.fixture
def base(sandbox, tmp_path, monkeypatch):
    """The sandbox's profile serving, recorded as history entry 1 (a history of this test's own)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    cfg = str(sandbox.config)
    up = cli("up", "-c", cfg)
    assert up.exit_code == 0, up.output
    yield cfg
    assert cli("down", "-c", cfg).exit_code == 0
    for name in sandbox.names:  # the variant's image, shipped by the upgrade
        sandbox.run(name, f"docker rmi -f $(docker images -q 'sparkstack/keys3') >/dev/null 2>&1; true")


def variant_config(sandbox, tmp_path, profile: str | None = None, env: dict | None = None) -> str:
    """The sandbox's config with VARIANT among its profiles (and `profile`, `env` overrides)."""
    profiles = tmp_path / "profiles"
    profiles.mkdir(exist_ok=True)
    prof = yaml.safe_load((ROOT / "env/profiles/sandbox.yaml").read_text())
    (profiles / "sandbox.yaml").write_text(yaml.safe_dump(prof))
    prof["image"]["chain"] = [*prof["image"]["chain"], "keys3"]
    (profiles / f"{VARIANT}.yaml").write_text(yaml.safe_dump(prof))
    data = yaml.safe_load(open(sandbox.config))
    data["profiles_dir"] = str(profiles)
    if profile:
        data["profile"] = profile
    if env:
        data["overrides"] = {"env": env}
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def entries(cfg: str) -> list[dict]:
    result = cli("history", "-c", cfg, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["entries"]


def running(cfg: str) -> dict[int, str]:
    return {r["rank"]: r["plan_hash"] for r in json.loads(cli("status", "-c", cfg, "--json").stdout)["ranks"]
            if r["state"] == "running"}


def hashes(entry: dict) -> dict[int, str]:
    return {r["rank"]: r["plan_hash"] for r in entry["ranks"]}


def test_an_upgrade_whose_start_fails_rolls_back_by_itself(sandbox, base, tmp_path):
    first = entries(base)
    assert [(e["id"], e["how"], e["outcome"]) for e in first] == [(1, "up", "serving")]
    assert first[0]["verify"]["status"] == "passed"  # `up`'s quick verification, its figures kept
    assert set(first[0]["verify"]["figures"]["perplexity"]) == {"prose", "code"}
    assert len({r["image_id"] for r in first[0]["ranks"]}) == 1 and first[0]["ranks"][0]["image_id"]
    assert all(r["checkpoint"] for r in first[0]["ranks"])
    broken = variant_config(sandbox, tmp_path, env={"SANDBOX_VLLM_FAIL": "exit:3"})
    result = cli("upgrade", "-c", broken)
    assert result.exit_code == 1, result.output
    assert "error: the upgrade to sandbox failed (history entry 2):" in result.output
    assert "exited with code 3" in result.output
    assert re.search(r"rolled back by itself: entry 1 \(sandbox, \S+\) serves again as entry 3 "
                     r"\(verify: passed\); downtime \d+\.\d s", result.output), result.output
    assert set(states(base).values()) == {"running"}
    assert running(base) == hashes(first[0])  # the old deploy, exactly
    shown = entries(base)
    assert [(e["id"], e["how"], e["outcome"]) for e in shown] == [
        (1, "up", "serving"), (2, "upgrade", "failed"), (3, "rollback", "serving")]
    assert "exited with code 3" in shown[1]["error"]
    assert shown[2]["note"] == "rolled back by itself to entry 1 after entry 2 failed"
    listed = cli("history", "-c", base)
    assert listed.exit_code == 0 and " 2  " in listed.output and "upgrade  failed" in listed.output


def noise_config(sandbox, tmp_path) -> str:
    """The sandbox's config with its patches_dir holding the chain variant whose EXL3 overlay
    emits noise (launcher/sandbox/model_fixture.py VARIANTS): it loads, and answers gibberish."""
    from launcher.sandbox import model_fixture

    model_fixture.write_patches(tmp_path / "patches", "noise")
    data = yaml.safe_load(open(sandbox.config))
    data["images"]["patches_dir"] = str(tmp_path / "patches")
    path = tmp_path / "noise.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_an_upgrade_that_fails_verification_rolls_back_by_itself(sandbox, base, tmp_path):
    """The broken variant is built and shipped while the old deploy still answers, starts, fails
    the quick verification; the old deploy is started again and verified."""
    from launcher.apply import cluster_lock, deploy, upgrade, verify as verifying
    from launcher.inputs import config as config_mod
    from launcher.transport import api

    loaded = config_mod.load(Path(noise_config(sandbox, tmp_path)))
    image = verifying.recipe(loaded)["image"]
    endpoint = api.endpoint(config_mod.load(Path(base)))
    said, served_while = [], []

    def say(line):
        said.append(line)
        if line.startswith(("building", "prepared in")):
            served_while.append(api.health(endpoint))

    try:
        with deploy.group_for(loaded, say=say) as group, cluster_lock.held(loaded, group, 0, say):
            with pytest.raises(upgrade.RolledBack) as raised:
                upgrade.upgrade(loaded, group, verify=verifying.quick, say=say)
        assert served_while == [True, True], said  # the old API answered while the new one was prepared
        message = raised.value.message
        assert "what it serves failed verification, so it is not serving: verify (quick) FAILED" in message
        assert "perplexity prose" in message and "probes alone" in message
        assert "rolled back by itself: entry 1" in message and "(verify: passed)" in message
        shown = entries(base)
        assert [(e["how"], e["outcome"], e["verify"].get("status")) for e in shown] == [
            ("up", "serving", "passed"), ("upgrade", "failed", "failed"), ("rollback", "serving", "passed")]
        assert all(p > 100 for p in shown[1]["verify"]["figures"]["perplexity"].values())
        assert shown[1]["image"] == image != shown[0]["image"]
        assert running(base) == hashes(shown[0])
    finally:
        ids = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                             capture_output=True, text=True).stdout.split()
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi -f {' '.join(ids) or image} >/dev/null 2>&1; true")
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def test_a_good_upgrade_serves_then_rollback_by_hand(sandbox, base, tmp_path):
    first = entries(base)[0]
    good = variant_config(sandbox, tmp_path, profile=VARIANT)
    result = cli("upgrade", "-c", good)
    assert result.exit_code == 0, result.output
    assert re.search(r"upgraded to sandbox-keys3: serving \(history entry 2\); downtime \d+\.\d s", result.output)
    second = entries(base)[1]
    assert (second["how"], second["outcome"], second["note"]) == ("upgrade", "serving", "upgraded from entry 1")
    assert second["downtime_s"] > 0 and running(base) == hashes(second)
    assert second["verify"]["status"] == "passed"  # `upgrade` verifies what it starts

    dry = cli("rollback", "-c", good, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith(f"roll back from entry 2 (sandbox-keys3) to entry 1: profile sandbox, "
                                 f"recorded {first['at']}")
    assert running(base) == hashes(second)  # --dry-run changed nothing

    back = cli("rollback", "-c", good)
    assert back.exit_code == 0, back.output
    assert "rolled back to entry 1: serving sandbox (recorded as entry 3" in back.output
    assert running(base) == hashes(first)

    # the variant's image gone from one rank: going forward again is refused, naming the rank
    image_id = second["ranks"][2]["image_id"]
    assert sandbox.run("spark3", f"docker rmi -f {image_id}")[0] == 0
    refused = cli("rollback", "-c", good, "2")
    assert refused.exit_code == 1, refused.output
    assert (f"error: cannot roll back, nothing was changed:\nerror: rank 2 (spark3): no longer has image "
            f"{image_id.removeprefix('sha256:')[:12]} of entry 2") in refused.output
    assert f"sparkstack ship --profile {VARIANT}" in refused.output
    assert running(base) == hashes(first)
