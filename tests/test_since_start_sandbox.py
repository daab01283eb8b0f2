"""Every failure explained, on the sandbox: while it serves, spark3's NIC is reset (its fabric
port's MTU back at 1500 on the cable's end and in its sysfs fixture, its GID tables shifted as a new
IPv6 address shifts them) -> `status`, `up`'s failure report and the supervisor's cause line name
the rank and each change against the facts kept at the last good start. Each test mends the
cables and fixtures and leaves no serving container."""

from __future__ import annotations

import json
import signal

import pytest

from launcher.sandbox import cluster
from serving import cli
from test_supervisor import events, keep_cfg, start_keep, wait_for  # noqa: F401 (keep_cfg: a fixture)

SPARK3 = 2  # its fabric IP is on its second port, enp1s0f1np1
RESET = ["rank 2 (spark3): enp1s0f1np1 MTU 1500, was 9000 at the last good start",
         "rank 2 (spark3): rocep1s0f0 RoCE v2 GID index 5 (NCCL's pick), was 3 at the last good start",
         "rank 2 (spark3): rocep1s0f1 RoCE v2 GID index 5 (NCCL's pick), was 3 at the last good start"]


@pytest.fixture
def cfg(sandbox, keep_cfg):
    """The sandbox's config with a quick supervisor, this test's own state dir (the kept start, the
    supervisor's log); after it the cables and fixtures mended, then nothing left serving."""
    try:
        yield keep_cfg
    finally:
        cluster.mend_cables(sandbox.state_dir)


def test_status_and_ups_failure_name_the_rank_and_what_its_nic_reset_changed(sandbox, cfg, tmp_path):
    first = cli("up", "-c", cfg)
    assert first.exit_code == 0, first.output
    kept = json.loads(next((tmp_path / "state" / "sparkstack" / "last-good").glob("*.json")).read_text())
    spark3 = kept["ranks"][SPARK3]
    assert {x["netdev"]: x["mtu"] for x in spark3["links"]} == {"enp1s0f0np0": 9000, "enp1s0f1np1": 9000}
    assert spark3["gid_index"] == {"rocep1s0f0": 3, "rocep1s0f1": 3} and spark3["mem_serving"] > 0
    assert spark3["image_id"].startswith("sha256:")
    quiet = cli("status", "-c", cfg, "--json")
    assert json.loads(quiet.stdout)["since_last_good_start"] == {"at": kept["at"], "changes": []}
    assert "since the last good start" not in cli("status", "-c", cfg).output

    cluster.reset_nic(SPARK3, "enp1s0f1np1", state_dir=sandbox.state_dir)
    shown = cli("status", "-c", cfg)
    assert shown.exit_code == 0, shown.output
    assert f"since the last good start ({kept['at']}):\n" + "".join(f"  {x}\n" for x in RESET) in shown.output
    changes = json.loads(cli("status", "-c", cfg, "--json").stdout)["since_last_good_start"]["changes"]
    assert [(c["rank"], c["fact"], c["subject"], c["now"], c["then"]) for c in changes] == [
        (2, "mtu", "enp1s0f1np1", 1500, 9000), (2, "gid index", "rocep1s0f0", 5, 3), (2, "gid index", "rocep1s0f1", 5, 3)]

    again = cli("up", "-c", cfg, "--restart", "--json")
    assert again.exit_code == 1, again.output
    assert "rank 2 (spark3) mtu: MTU 1500, other ranks 9000" in again.output  # check's row: no port, no before
    assert "error: since the last good start" in again.output
    for line in RESET:
        assert f"error:   {line}\n" in again.output
    said = json.loads(again.stdout)
    assert [c["line"] for c in said["since_last_good_start"]["changes"]] == RESET
    assert kept == json.loads(next((tmp_path / "state" / "sparkstack" / "last-good").glob("*.json")).read_text())


def test_the_supervisors_cause_line_says_what_changed_on_the_failing_rank(sandbox, cfg, tmp_path):
    keep = start_keep(cfg)
    try:
        wait_for(tmp_path, keep, lambda e: any(x["event"] == "serving" for x in e))
        cluster.reset_nic(SPARK3, "enp1s0f1np1", state_dir=sandbox.state_dir)
        assert sandbox.run("spark3", "docker kill sparkstack-engine")[0] == 0
        seen = wait_for(tmp_path, keep, lambda e: any(x["event"] == "up failed" for x in e))
        keep.send_signal(signal.SIGTERM)
        output, _ = keep.communicate(timeout=120)
    finally:
        if keep.poll() is None:
            keep.kill()
    failure = next(x["cause"] for x in seen if x["event"] == "failure")
    head, _, since = failure.partition("\nsince the last good start (")
    assert head.startswith("rank 2 (spark3): exited with code 137") and since, failure
    assert since.split("\n", 1)[1] == "\n".join(f"  {x}" for x in RESET), failure
    redeploy = next(x["cause"] for x in seen if x["event"] == "up failed")
    assert redeploy.startswith("check failed") and redeploy.endswith("\n".join(f"  {x}" for x in RESET)), redeploy
    assert "Traceback" not in output and events(tmp_path)
