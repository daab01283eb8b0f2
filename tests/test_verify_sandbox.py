"""`up`'s verification and `sparkstack verify` on the sandbox, through the real CLI: the good image
chain serves and passes (a baseline recorded, then compared with); a variant whose EXL3 overlay
emits noise, and one wrong only at 4+ concurrent requests, both load without error and both fail
verification: `up` says so with the figures and the fix and leaves no rank running.

The variants are the sandbox chain with one patch file broken (launcher/sandbox/model_fixture.py
VARIANTS), built and shipped by `up` like any changed recipe; their images are removed after."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.apply import verify as verifying
from launcher.inputs.config import load
from launcher.sandbox import model_fixture
from serving import cli, states


@pytest.fixture
def cfg(sandbox, tmp_path, monkeypatch):
    """The sandbox's config, with a state dir (deploy history, baselines, API key) of the test's own."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = str(sandbox.config)
    yield path
    assert cli("down", "-c", path).exit_code == 0
    assert set(states(path).values()) == {"absent"}


def history(cfg: str) -> list[dict]:
    result = cli("history", "-c", cfg, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["entries"]


def variant_config(sandbox, tmp_path, variant: str) -> str:
    """The sandbox's config with its patches_dir holding `variant`'s broken overlay."""
    model_fixture.write_patches(tmp_path / "patches", variant)
    data = yaml.safe_load(open(sandbox.config))
    data["images"]["patches_dir"] = str(tmp_path / "patches")
    path = tmp_path / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def without_images(sandbox):
    """The variant images a test made, removed from every rank and this host after it."""
    made: list[str] = []
    yield made
    for image in made:
        ids = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                             capture_output=True, text=True).stdout.split()
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi -f {' '.join(ids) or image} >/dev/null 2>&1; true")
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def test_the_good_chain_serves_verified_and_keeps_a_baseline(sandbox, cfg):
    up = cli("up", "-c", cfg, "--json")
    assert up.exit_code == 0, up.output
    report = json.loads(up.stdout)
    assert report["verify"]["status"] == "passed" and "verified" in report["steps"]
    assert set(report["verify"]["figures"]["perplexity"]) == {"prose", "code"}
    recorded = history(cfg)  # the deploy history keeps the verification's figures
    assert [(e["how"], e["verify"]["status"]) for e in recorded] == [("up", "passed")]
    assert recorded[0]["verify"]["figures"] == report["verify"]["figures"]
    assert "verify passed" in cli("history", "-c", cfg).output
    # `up` again changes nothing: the history's verdict stands, nothing is asked of the model
    steady = cli("up", "-c", cfg, "--json")
    assert steady.exit_code == 0, steady.output
    kept = json.loads(steady.stdout)
    assert kept["verify"] == report["verify"] and "verified (when it started)" in kept["steps"]
    assert "verifying the served model" not in steady.output
    assert len(history(cfg)) == 1
    loaded = load(Path(cfg))
    baseline = verifying.baseline_path(loaded)
    try:
        recorded = cli("verify", "-c", cfg, "--full", "--record-baseline")
        assert recorded.exit_code == 0, recorded.output
        assert "baseline recorded" in recorded.output and baseline.is_file()
        again = json.loads(cli("verify", "-c", cfg, "--json").stdout)
        assert again["ok"] and again["baseline"] is not None
        assert all("baseline" in line["bound"] for line in again["lines"] if line["what"].startswith("perplexity"))
        assert "seed 001" in cli("verify", "-c", cfg).output  # the cards' figures, as context
    finally:
        baseline.unlink(missing_ok=True)


@pytest.mark.parametrize("variant, failing", [
    ("noise", ("perplexity prose", "perplexity code", "probes alone")),
    ("crowded", ("probes 4 at once", "probes 8 at once")),
])
def test_a_broken_overlay_fails_and_nothing_is_left_serving(sandbox, cfg, tmp_path, without_images,
                                                             variant, failing):
    path = variant_config(sandbox, tmp_path, variant)
    without_images.append(verifying.recipe(load(Path(path)))["image"])  # the variant's content tag
    up = cli("up", "-c", path)
    assert up.exit_code != 0, up.output
    assert "failed verification, so it is not serving" in up.output
    for what in failing:
        assert what in up.output
    assert "every rank's container was stopped" in up.output and "fix:" in up.output
    assert set(states(path).values()) == {"absent"}, "a half-started cluster"
    # --no-verify serves it, on purpose; `verify` then fails it with the same figures
    unverified = cli("up", "-c", path, "--no-verify")
    assert unverified.exit_code == 0, unverified.output
    assert "not verified (--no-verify)" in unverified.output
    # only what served is recorded: the failed `up` is not, the skipped verification is said
    assert [(e["how"], e["verify"]) for e in history(path)] == [("up", {"status": "skipped"})]
    checked = cli("verify", "-c", path, "--json")
    assert checked.exit_code == 1 and not json.loads(checked.stdout)["ok"]
