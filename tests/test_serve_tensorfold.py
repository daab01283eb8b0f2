"""`up` with the TensorFold profile on the sandbox: every rank runs `python3 -m tensorfold.cli serve`
(the stand-in, launcher/sandbox/standins/standin_tensorfold.py) with its own --rank and its own fabric env,
the followers first, then rank 0, which serves the API on :8890 once all four formed one cluster."""

import json
from datetime import datetime

import pytest
import yaml

from serving import TENSORFOLD_RECORD, cli, engine_record, mgmt_if





def write(tmp_path, sandbox, edit=None) -> str:
    data = yaml.safe_load(open(sandbox.config))
    data["profile"] = "tensorfold"
    data["model"].pop("served_name", None)  # the profile's: the recipe's glm-5.3-tf
    if edit:
        edit(data)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def tf_cfg(sandbox, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("tensorfold"), sandbox)
    yield path
    cli("down", "-c", path)


@pytest.fixture(scope="module")
def tf_started(tf_cfg):
    result = cli("up", "-c", tf_cfg)
    assert result.exit_code == 0, result.output
    return result


def record(sandbox, name):
    return engine_record(sandbox, name, TENSORFOLD_RECORD)


def started_at(text: str) -> datetime:
    """Docker's RFC 3339 time with nanoseconds, to the microsecond Python reads."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}")


def test_each_rank_runs_tensorfold_as_planned(sandbox, tf_cfg, tf_started):
    plan = json.loads(cli("plan", "-c", tf_cfg, "--json").stdout)
    head = sandbox.rank("spark1")["address"]
    for r, name in enumerate(sandbox.names):
        rec = record(sandbox, name)
        assert ["python3", "-m", "tensorfold.cli", *rec["argv"]] == plan["ranks"][r]["engine"]
        o = rec["options"]
        assert (o["tp"], o["rank"], o["master"], o["port"], o["host"]) == (4, r, head, 8890, "0.0.0.0")
        assert rec["mode"] == ("api" if r == 0 else "follower")
        for key, value in plan["ranks"][r]["env"].items():
            assert rec["env"][key] == value
        assert not {"NODES", "MODEL"} & set(rec["env"])
        # its own pins, from its own facts: a ring's sockets on its management interface, RDMA
        # on the addressed HCA of each cabled port
        assert rec["env"]["NCCL_SOCKET_IFNAME"] == "=" + mgmt_if(sandbox, name)
        assert rec["env"]["NCCL_IB_HCA"] == "=" + ",".join(sandbox.truth[name]["hcas_in_use"])


def test_followers_start_before_rank_0(tf_cfg, tf_started):
    ranks = json.loads(cli("status", "-c", tf_cfg, "--json").stdout)["ranks"]
    head = started_at(ranks[0]["started_at"])
    assert all(started_at(r["started_at"]) < head for r in ranks[1:]), ranks


def test_rank_0_serves_on_8890(sandbox, tf_cfg, tf_started):
    result = cli("wait", "-c", tf_cfg, "--timeout", "30")
    assert result.exit_code == 0 and "serves glm-5.3-tf" in result.output
    logs = sandbox.run("spark1", "docker logs sparkstack-engine 2>&1")[1]
    assert "serving glm-5.3-tf at http://0.0.0.0:8890/v1 on CUDA, rank 0 of 4" in logs
    worker = cli("logs", "-c", tf_cfg, "--rank", "2", "--tail", "20")
    assert worker.exit_code == 0 and "rank 2 ready in" in worker.output
    assert "following rank 0" in worker.output


def test_second_up_changes_nothing(tf_cfg, tf_started):
    again = cli("up", "-c", tf_cfg)
    assert again.exit_code == 0 and "already running as planned" in again.output


def test_a_context_past_the_window_is_refused_by_every_rank(sandbox, tf_cfg, tf_started, tmp_path):
    """The config's --context wins over the profile's; TensorFold refuses one longer than the
    model's window before it loads anything: nothing stays up, each rank says why."""
    path = write(tmp_path, sandbox, lambda d: d.setdefault("overrides", {}).update(
        engine_args=["--context 300000"]))
    try:
        result = cli("up", "-c", path)
        assert result.exit_code == 1 and "every rank's container was stopped" in result.output
        assert "tensorfold: --context 300000 exceeds this model's 202752-token window" in result.output
    finally:
        cli("down", "-c", path)
        assert cli("up", "-c", tf_cfg).exit_code == 0


def test_a_rank_that_cannot_reach_the_others_stops_everyone(sandbox, tf_cfg, tf_started, tmp_path):
    """NCCL's bootstrap pinned to an interface no rank has: the cluster never forms, every rank
    is stopped, and the failed ranks' logs say what the real stack says (standin_dist)."""
    env = {"NCCL_SOCKET_IFNAME": "=nosuch0", "SANDBOX_TENSORFOLD_WAIT_S": "20"}
    path = write(tmp_path, sandbox, lambda d: d.setdefault("overrides", {}).update(env=env))
    try:
        result = cli("up", "-c", path)
        assert result.exit_code == 1 and "every rank's container was stopped" in result.output
        assert "exited with code 1" in result.output
        status = json.loads(cli("status", "-c", tf_cfg, "--json").stdout)
        assert {r["state"] for r in status["ranks"]} == {"absent"}
    finally:
        cli("down", "-c", path)
        assert cli("up", "-c", tf_cfg).exit_code == 0
