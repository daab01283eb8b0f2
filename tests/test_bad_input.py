"""Bad input found by fuzzing (issue #19): each ends in one message and exit 2 (or 3 when the plan
does not fit), never a traceback. Driven through the real CLI in-process (click's CliRunner)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from launcher.cli.commands import main


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def plan(path, *extra: str):
    return invoke("plan", "--offline", "--json", "-c", str(path), *extra)


# --- the config file itself ---------------------------------------------------------------------

def test_config_that_is_not_utf8(write_config):
    path = write_config(text="profile: keys-1m-dcp4\n")
    path.write_bytes(b"topology: ring\nprofile: caf\xe9\n")  # Latin-1
    result = plan(path)
    assert result.exit_code == 2
    assert f"{path}:2: not UTF-8 text (byte 0xe9)" in result.output


def test_yaml_nested_a_thousand_deep(write_config):
    result = plan(write_config(text="profile: " + "[" * 1000 + "]" * 1000 + "\n"))
    assert result.exit_code == 2 and "nested too deeply" in result.output


# --- engine sizes: what vLLM's parser takes but its engine (or the plan's arithmetic) cannot -----

def with_args(write_config, *args: str):
    return write_config(lambda d: d["overrides"].update(engine_args=list(args)))


@pytest.mark.parametrize("args, shown", [
    (["-dcp 0"], "-dcp 0: expected 1 or more"),  # was a ZeroDivisionError
    (["-tp -2", "-pp -2"], "-tp -2: expected 1 or more"),  # -2 × -2 = 4 ranks passed
    (["--max-model-len -5"], "--max-model-len -5: expected a number of tokens (1 or more), or auto"),
    (["--max-model-len 0"], "--max-model-len 0: expected a number of tokens"),
    (["--kv-cache-memory-bytes -5"], "--kv-cache-memory-bytes -5: expected a number of bytes"),
])
def test_engine_sizes_vllm_would_refuse(write_config, args, shown):
    path = with_args(write_config, *args)
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert f"{path}: overrides.engine_args: {shown}" in result.output


def with_profile(write_config, directory, arg="--decode-context-parallel-size 1", **changes):
    """A cluster.yaml whose profile `mine` (in `directory`) passes `-tp 4` and `arg`; `changes`
    replace its fields (`defaults` and `bench` are YAML flow text, to write .inf)."""
    fields = {"description": "x", "image": "{prebuilt: x}", "served_name": "x",
              "args": f"['--tensor-parallel-size 4', '{arg}']", "kv": "{layout: fp8}",
              "defaults": "{model_shape: {num_hidden_layers: 2, kv_lora_rank: 512, qk_rope_head_dim: 64}, "
                          "weights_per_rank_gib: 1}", **changes}
    (directory / "mine.yaml").write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return write_config(lambda d: d.update(profile="mine", profiles_dir=str(directory)))


def test_a_size_set_in_the_profile_names_the_profile(write_config, tmp_path):
    path = with_profile(write_config, tmp_path, "--decode-context-parallel-size 0")
    result = plan(path)
    assert result.exit_code == 2
    assert f"{path}: profile mine: --decode-context-parallel-size 0: expected 1 or more" in result.output


@pytest.mark.parametrize("spelling", ["auto", "AUTO", "-1"])
def test_max_model_len_auto_plans_the_tokens_that_fit(write_config, spelling):
    """vLLM's auto (also -1): the longest context the KV cache holds; the plan sizes the cache as
    without a length, says so, and passes the flag on as written."""
    import json

    fixed = json.loads(plan(with_args(write_config, "--max-model-len 1000")).output)
    result = plan(with_args(write_config, f"--max-model-len={spelling}"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["kv"]["max_tokens"] == fixed["kv"]["max_tokens"] > 1000
    assert f"--max-model-len={spelling}" in data["ranks"][0]["engine"]
    assert any(line.startswith("--max-model-len auto: vLLM picks the longest context that fits")
               and f"{data['kv']['max_tokens']:,} tokens" in line for line in data["assumed"])


def test_kv_cache_bytes_none_is_unset_as_in_vllm(write_config):
    """vLLM reads `None` as not given: the plan then sets the figure itself."""
    import json

    result = plan(with_args(write_config, "--kv-cache-memory-bytes None"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    engine = data["ranks"][0]["engine"]
    assert engine[engine.index("--kv-cache-memory-bytes") + 1] == str(data["kv"]["kv_cache_memory_bytes"])


# --- memory figures: finite, so the byte arithmetic cannot overflow ------------------------------

@pytest.mark.parametrize("field, value", [("headroom_gib", ".inf"), ("runtime_overhead_gib", "1e308")])
def test_memory_figures_in_gib_are_finite(write_config, field, value):
    import yaml

    path = write_config(lambda d: d["overrides"].update({field: 0}))
    path.write_text(path.read_text().replace(f"{field}: 0", f"{field}: {value}"))
    assert yaml.safe_load(path.read_text())["overrides"][field] != 0
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert f"{path}: overrides.{field}: Input should be" in result.output


SHAPE = "num_hidden_layers: 2, kv_lora_rank: 512, qk_rope_head_dim: 64"


@pytest.mark.parametrize("field, text, problem", [
    ("defaults", f"{{model_shape: {{{SHAPE}}}, weights_per_rank_gib: .inf}}",
     "defaults.weights_per_rank_gib: Input should be a finite number"),
    ("defaults", f"{{model_shape: {{{SHAPE}}}, weights_per_rank_gib: 1, mtp_weights_per_rank_gib: -1}}",
     "defaults.mtp_weights_per_rank_gib: Input should be greater than or equal to 0"),
    ("defaults", f"{{model_shape: {{{SHAPE}, num_nextn_predict_layers: -9}}, weights_per_rank_gib: 1}}",
     "defaults.model_shape.num_nextn_predict_layers: Input should be greater than or equal to 0"),
    ("bench", "{temperature: .inf}", "bench.temperature: Input should be a finite number"),
])
def test_profile_figures_are_finite_and_not_negative(write_config, tmp_path, field, text, problem):
    result = plan(with_profile(write_config, tmp_path, **{field: text}))
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'mine.yaml'}: {problem}" in result.output


# --- what travels into the container and onto its command line -----------------------------------

@pytest.mark.parametrize("where, env, problem", [
    ("overrides", {"A\nB": "1"}, "overrides.env: 'A\\nB' is not an environment variable name"),
    ("overrides", {"NCCL_DEBUG=INFO": "1"}, "overrides.env: 'NCCL_DEBUG=INFO' is not an environment variable name"),
    ("overrides", {"NCCL_DEBUG": "INFO\nLD_PRELOAD=/tmp/x.so"}, "overrides.env: NCCL_DEBUG: the value has a line break"),
    ("nccl", {"X Y": "1"}, "nccl.env: 'X Y' is not an environment variable name"),
])
def test_env_names_and_values_an_env_file_can_carry(write_config, where, env, problem):
    def edit(d):
        if where == "nccl":
            d["nccl"] = {"host_lib": "/opt/nccl/lib/libnccl.so.2", "env": env}
        else:
            d["overrides"]["env"] = env
    path = write_config(edit)
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert f"{path}: {problem}" in result.output


@pytest.mark.parametrize("field, value", [("model", {"path": "/models/glm:5.3"}),
                                          ("model", {"path": "/models/glm\x005.3"}),
                                          ("nccl", {"host_lib": "/opt/nccl:2/libnccl.so.2"})])
def test_mounted_paths_without_colons(write_config, field, value):
    """`-v PATH:PATH:ro` splits on ':' (and a NUL made the checkpoint reader raise)."""
    path = write_config(lambda d: d.update({field: value}))
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert f"{path}: {field}.{next(iter(value))}: must not contain ':'" in result.output


def test_home_of_no_such_user(write_config):
    path = write_config(lambda d: d["ssh"].update(known_hosts="~no-such-user-here/.ssh/known_hosts"))
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert f"{path}: ssh.known_hosts: ~no-such-user-here: no such user on this host" in result.output


# --- a local checkpoint that is not what it claims: the plan falls back on the profile's figures --

SHAPE_JSON = '{"num_hidden_layers": 2, "kv_lora_rank": 512, "qk_rope_head_dim": 64}'
SAFETENSORS_HEADER_ONLY = "model-00001-of-00001.safetensors"


def shard(header: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize("files, assumed", [
    ({"config.json": b"[78]"}, "model shape: profile keys-1m-dcp4's figures ({d}/config.json: expected a JSON object"),
    ({"config.json": b'{"num_hidden_layers": "78", "kv_lora_rank": 512, "qk_rope_head_dim": 64}'},
     "model shape: profile keys-1m-dcp4's figures ({d}/config.json: num_hidden_layers is '78', expected a whole number"),
    ({"config.json": b'{"num_hidden_layers": Infinity, "kv_lora_rank": 512, "qk_rope_head_dim": 64}'},
     "{d}/config.json: num_hidden_layers is inf"),
    ({"config.json": b'{"num_hidden_layers": 0, "kv_lora_rank": 512, "qk_rope_head_dim": 64}'},
     "{d}/config.json: num_hidden_layers is 0, expected a whole number \u2265 1"),
    ({"config.json": b'{"text_config": 5}'}, "{d}/config.json: expected a JSON object"),
    ({"config.json": b'{"num_hidden_layers": "caf\xe9"}'}, "{d}/config.json: not JSON (UnicodeDecodeError"),
    ({"config.json": b"[" * 100_000}, "{d}/config.json: not JSON (RecursionError"),
    ({"model.safetensors.index.json": b"{}"}, "weights per rank: profile keys-1m-dcp4's figures "
                                              "({d}/model.safetensors.index.json: no weight_map object"),
    ({"model.safetensors.index.json": b'{"weight_map": {"x": 5}}'}, "index.json: weight_map names 5, not a shard"),
    ({"model.safetensors.index.json": b'{"weight_map": {"x": "/etc/passwd"}}'}, "weight_map names '/etc/passwd'"),
    ({SAFETENSORS_HEADER_ONLY: shard(b"[1]")}, "weights per rank: profile keys-1m-dcp4's figures "
                                               f"({{d}}/{SAFETENSORS_HEADER_ONLY}: header is not a JSON object"),
    ({SAFETENSORS_HEADER_ONLY: shard(b'{"w": {"dtype": "F16", "shape": [1]}}')},
     f"{SAFETENSORS_HEADER_ONLY}: tensor 'w' has no valid data_offsets"),
    ({SAFETENSORS_HEADER_ONLY: shard(b'{"w": {"data_offsets": [8, 2]}}')}, "tensor 'w' has no valid data_offsets"),
    ({SAFETENSORS_HEADER_ONLY: shard(b'{"w": {"data_offsets": ["0", 2]}}')}, "tensor 'w' has no valid data_offsets"),
])
def test_malformed_local_checkpoint_falls_back_on_the_profile(write_config, tmp_path, files, assumed):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(SHAPE_JSON)
    for name, data in files.items():
        (model / name).write_bytes(data)
    result = plan(write_config(lambda d: d["model"].update(path=str(model))))
    assert result.exit_code == 0, result.output
    assert any(assumed.format(d=model) in line for line in json.loads(result.output)["assumed"]), result.output


# --- the profile's name and directory ------------------------------------------------------------

@pytest.mark.parametrize("edit, shown", [
    (lambda d: d.update(profile="x" * 300), "not a profile name"),  # was OSError: File name too long
    (lambda d: d.update(profiles_dir="y" * 300), "(known profiles: none)"),
])
def test_profile_names_and_directories_that_cannot_be(write_config, edit, shown):
    path = write_config(edit)
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert f"{path}: profile: profile" in result.output and shown in result.output


# --- the command line ----------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["up", "--timeout", "-5"], ["wait", "--timeout", "-5"],
                                  ["logs", "--tail", "-5"]])
def test_negative_timeouts_and_counts(args):
    from conftest import EXAMPLE_CONFIG

    result = invoke(*args, "-c", str(EXAMPLE_CONFIG))
    assert result.exit_code == 2 and f"Invalid value for '{args[1]}'" in result.output


def test_logs_of_a_rank_the_config_does_not_have():
    from conftest import EXAMPLE_CONFIG

    result = invoke("logs", "--rank", "99", "-c", str(EXAMPLE_CONFIG))
    assert result.exit_code == 2
    assert "Invalid value for '--rank': 99: the config has ranks 0..3" in result.output


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("as_json", [False, True])
def test_status_fails_when_no_rank_answers(write_config, as_json):
    """Every rank refuses SSH (a closed port on loopback): status says so and exits 1."""
    port = closed_port()

    def edit(d):
        d["ranks"] = [{"address": "127.0.0.1", "port": port, "user": "spark"}]
        d["overrides"]["engine_args"] = ["--tensor-parallel-size 1", "--decode-context-parallel-size 1"]
        d["overrides"]["api_port"] = port
    result = invoke("status", "-c", str(write_config(edit)), *(["--json"] if as_json else []))
    assert result.exit_code == 1, result.output
    assert "no rank answered (all 1 unreachable)" in result.output
