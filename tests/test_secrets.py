"""Secrets: the API asks for a key by default (generated once, kept 0600 on this host), the kit's
own clients send it, no secret value is printed (plan, errors) nor put on a command line (the
serving container, `check --bandwidth`), and an open API is a choice that is said out loud."""

from __future__ import annotations

import json
import stat

import httpx
import pytest
import yaml
from click.testing import CliRunner

from launcher.transport import api
from launcher.inputs import apikey, config
from launcher.bench import run as bench
from launcher.check import report as check
from planned import build_plan
from launcher import redact
from launcher.apply import serve
from launcher.cli.commands import main
from launcher.cli.console import friendly_errors
from launcher.errors import SparkstackError
from local_probe import sandbox_rank_facts
from test_bench import Standin
from test_check import inputs, row, sandbox_cluster

SECRETS = {"HF_TOKEN": "hf_plan_secret", "DB_PASSWORD": "pw_plan_secret", "MY_VAR": "marked_plan_secret"}


def cli(*args, env=None):
    result = CliRunner().invoke(main, list(args), env=env)
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A state dir of the test's own, not yet there."""
    path = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(path))
    return path


def with_secrets(d):
    d["overrides"].update(env={**SECRETS, "NCCL_DEBUG": "WARN"}, secret_env=["MY_VAR"], api_key="sk_plan_secret")


# --- nothing secret in what plan prints ---------------------------------------------------------

def test_plan_shows_no_secret_value_unless_asked(write_config):
    path = write_config(with_secrets)
    for args in (["--json"], []):
        result = cli("plan", "-c", str(path), "--offline", *args)
        assert result.exit_code == 0, result.output
        for value in (*SECRETS.values(), "sk_plan_secret"):
            assert value not in result.output, (args, value)
        assert "WARN" in result.output  # NCCL_DEBUG is no secret
    data = json.loads(cli("plan", "-c", str(path), "--offline", "--json").output)
    env = data["ranks"][0]["env"]
    assert {k: env[k] for k in (*SECRETS, "VLLM_API_KEY")} == dict.fromkeys((*SECRETS, "VLLM_API_KEY"), "***")
    shown = json.loads(cli("plan", "-c", str(path), "--offline", "--json", "--show-secrets").output)
    assert shown["ranks"][0]["env"]["HF_TOKEN"] == "hf_plan_secret" and shown["api"]["key"] == "sk_plan_secret"


def test_serving_command_line_carries_no_env_value(write_config):
    """`docker run` gets its whole environment on stdin (`--env-file /dev/stdin`): `ps` on a
    rank shows no value, the API key and HF_TOKEN included."""
    built = build_plan(config.load(write_config(with_secrets)))
    for rank in built.ranks:
        command, stdin = serve.run_command(rank)
        assert "-e" not in rank.docker_run and "--env-file /dev/stdin" in command
        assert not any(f"{k}={v}" in command for k, v in rank.env.items())
        assert "sk_plan_secret" not in command and "hf_plan_secret" not in command
        assert stdin.decode() == "".join(f"{k}={rank.env[k]}\n" for k in sorted(rank.env))
        assert "VLLM_API_KEY=sk_plan_secret\n" in stdin.decode()


# --- secrets refused where they would show ------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    (lambda o: o.update(engine_args=["--api-key sk-x"]),
     "overrides.engine_args: --api-key with a value would show it on the rank's command line (`ps`): "
     "put the key in overrides.api_key"),
    (lambda o: o.update(engine_args=["--hf-token=hf_x"]),
     "--hf-token with a value would show it on the rank's command line (`ps`): put the token in "
     "overrides.env as HF_TOKEN"),
    (lambda o: o.update(env={"VLLM_API_KEY": "sk-x"}), "overrides: env.VLLM_API_KEY: put the key in overrides.api_key"),
    (lambda o: o.update(api_key="sk-x", open_api=True), "overrides: api_key and open_api: true disagree: give one"),
    (lambda o: o.update(api_key="two words"), "overrides.api_key: must be one word, no spaces or line breaks"),
])
def test_secrets_refused_where_they_would_show(write_config, edit, message):
    result = cli("plan", "-c", str(write_config(lambda d: edit(d["overrides"]))), "--offline")
    assert result.exit_code == 2 and message in result.output, result.output
    assert "sk-x" not in result.output and "hf_x" not in result.output


def test_bare_hf_token_flag_is_fine(write_config):
    """`--hf-token` alone makes vLLM use the token stored on the rank: nothing secret in argv."""
    result = cli("plan", "-c", str(write_config(lambda d: d["overrides"].update(engine_args=["--hf-token"]))),
                 "--offline", "--json")
    assert result.exit_code == 0 and "--hf-token" in json.loads(result.output)["ranks"][0]["engine"]


def test_config_errors_do_not_echo_a_secret_value(write_config):
    result = cli("plan", "-c", str(write_config(lambda d: d["overrides"].update(
        env={"HF_TOKEN": 918273645}, api_key=["sk-in-a-list"]))), "--offline")
    assert result.exit_code == 2, result.output
    assert "overrides.env.HF_TOKEN: Input should be a valid string" in result.output
    assert "918273645" not in result.output and "sk-in-a-list" not in result.output


def test_error_messages_hide_the_secrets_the_run_holds(write_config):
    """A message that echoes a secret (a container's log tail, say) is shown with *** instead."""
    import click

    path = write_config(with_secrets)

    @click.command()
    @friendly_errors
    def echoing():
        loaded = config.load(path)
        raise SparkstackError(f"rank 0 (spark1): exited with code 1\n  | env {loaded.cluster.overrides.env}"
                              f"\n  | --api-key {loaded.cluster.overrides.api_key}")

    result = CliRunner().invoke(echoing, [])
    assert result.exit_code == 1 and "exited with code 1" in result.output and "NCCL_DEBUG" in result.output
    for value in (*SECRETS.values(), "sk_plan_secret"):
        assert value not in result.output
    assert redact.scrub("x hf_plan_secret y") == "x *** y"


# --- the generated key --------------------------------------------------------------------------

def test_key_generated_once_kept_0600_and_masked_by_plan(write_config, state):
    path = write_config()
    before = cli("plan", "-c", str(path), "--offline", "--json")
    assert before.exit_code == 0 and not state.exists()  # plan reads the key, never makes it
    data = json.loads(before.output)
    assert data["api"]["source"] == "not generated" and "VLLM_API_KEY" not in data["ranks"][0]["env"]
    assert any(a.startswith("API key: none yet: `sparkstack up` or `sparkstack api-key`") for a in data["assumed"])

    printed = cli("api-key", "-c", str(path))
    assert printed.exit_code == 0, printed.output
    key = printed.stdout.strip()
    kept = state / "sparkstack" / "api-keys" / "10.0.0.11"
    assert kept.read_text() == key + "\n" and len(key) >= 40
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    assert cli("api-key", "-c", str(path)).stdout.strip() == key  # once: kept, not remade
    assert json.loads(cli("api-key", "-c", str(path), "--json").output) == {
        "key": key, "source": "generated", "file": str(kept), "warning": None, "url": "http://10.0.0.11:8888/v1"}

    masked = cli("plan", "-c", str(path), "--offline")
    assert key not in masked.output and f"api key *** (generated, kept in {kept})" in masked.output
    data = json.loads(cli("plan", "-c", str(path), "--offline", "--json").output)
    assert all(r["env"]["VLLM_API_KEY"] == "***" for r in data["ranks"]) and key not in json.dumps(data)
    shown = json.loads(cli("plan", "-c", str(path), "--offline", "--json", "--show-secrets").output)
    assert {r["env"]["VLLM_API_KEY"] for r in shown["ranks"]} == {key}

    other = write_config(lambda d: d["ranks"][0].update(address="10.0.0.21"), name="other.yaml")
    assert cli("api-key", "-c", str(other)).stdout.strip() not in ("", key)  # another API, another key


def test_default_state_dir_is_under_home(write_config, tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli("api-key", "-c", str(write_config())).exit_code == 0
    assert (tmp_path / "home" / ".local" / "state" / "sparkstack" / "api-keys" / "10.0.0.11").is_file()


def test_unwritable_state_dir_fails_clearly_and_plan_still_works(write_config, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker / "state"))
    path = write_config()
    result = cli("api-key", "-c", str(path))
    assert result.exit_code == 2
    assert f"error: cannot keep the API key in {blocker}/state/sparkstack/api-keys/10.0.0.11 (Not a directory): " \
           "set XDG_STATE_HOME to a writable folder, or give the key in cluster.yaml's overrides.api_key" \
           in result.output
    assert cli("plan", "-c", str(path), "--offline").exit_code == 0


def test_the_kits_clients_send_the_generated_key(write_config, state, tmp_path):
    """A server started with the generated key (as `up` starts vLLM) refuses a request without
    it; `wait` and `bench`'s target find the key themselves."""
    path = write_config(lambda d: d["ranks"][0].update(address="127.0.0.1"))
    key = cli("api-key", "-c", str(path)).stdout.strip()
    server = Standin(tmp_path, ["--served-model-name", "GLM-5.3-EXL3", "--api-key", key])
    try:
        data = yaml.safe_load(path.read_text())
        data["overrides"]["api_port"] = server.port
        path.write_text(yaml.safe_dump(data))
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        waited = cli("wait", "-c", str(path), "--timeout", "20")
        assert waited.exit_code == 0 and "serves GLM-5.3-EXL3" in waited.output, waited.output
        loaded = config.load(path)
        assert api.endpoint(loaded).api_key == key
        assert bench.target_from_config(loaded).api_key == key
    finally:
        server.stop()


# --- an API without a key, said out loud --------------------------------------------------------

@pytest.fixture(scope="module")
def fabric_facts(tmp_path_factory):
    return {r: sandbox_rank_facts(tmp_path_factory.mktemp(f"spark{r + 1}"), r) for r in range(4)}


@pytest.mark.parametrize("changes, source, fix", [
    ({"profile": "tensorfold"}, "tensorfold", "keep rank 0's API port on a private network"),
    ({"overrides": {"open_api": True}}, "open", "remove overrides.open_api"),
])
def test_an_open_api_warns_in_plan_and_check(tmp_path, state, fabric_facts, changes, source, fix):
    loaded = sandbox_cluster(tmp_path, **changes)
    key = apikey.resolve(loaded, create=True)
    assert (key.value, key.source, key.file) == (None, source, None) and not state.exists()
    built = build_plan(loaded)
    assert all("VLLM_API_KEY" not in r.env for r in built.ranks)
    assert built.to_json()["api"]["warning"] == key.warning
    report = check.evaluate(inputs(loaded, fabric_facts))
    found = row(report, 0, "api key")
    assert found.status == "warn" and found.value == key.warning and fix in found.fix
    assert all("api key" not in {c.name for c in r.checks} for r in report.ranks[1:])
    text = cli("plan", "-c", str(loaded.path), "--offline")
    assert text.exit_code == 0 and f"api key none ({key.warning})" in text.output


def test_check_row_passes_with_a_key(tmp_path, state, fabric_facts):
    loaded = sandbox_cluster(tmp_path)
    assert row(check.evaluate(inputs(loaded, fabric_facts)), 0, "api key").value.startswith(
        "required: none yet: `sparkstack up` or `sparkstack api-key` generates it into ")
    apikey.resolve(loaded, create=True)
    found = row(check.evaluate(inputs(loaded, fabric_facts)), 0, "api key")
    assert found.status == "pass" and found.value == f"required: *** (generated, kept in {apikey.key_file(loaded)})"
