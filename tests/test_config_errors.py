"""Every bad config ends with one message per problem naming file and field, exit 2, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.commands import main


def run_plan(path):
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline"])
    assert "Traceback" not in result.output
    return result


def drop(key):
    return lambda d: d.pop(key)


def set_in(path, value):
    def edit(d):
        node = d
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return edit


CASES = {
    "missing field": (drop("topology"), ["topology: required but missing"]),
    "wrong type": (set_in(["ranks", 1, "port"], "twenty-two"), ["ranks[1].port:", "twenty-two"]),
    "port out of range": (set_in(["ranks", 0, "port"], 70000), ["ranks[0].port:", "less than or equal to 65535"]),
    "unknown key": (set_in(["rankz"], []), ["rankz: unknown key"]),
    "unknown nested key": (set_in(["ranks", 0, "adress"], "x"), ["ranks[0].adress: unknown key"]),
    "bad topology": (set_in(["topology"], "mesh"), ["topology:", "'switch' or 'ring'", "mesh"]),
    "bad fabric ip": (set_in(["ranks", 2, "fabric_ips"], ["192.168.300.1"]), ["ranks[2].fabric_ips[0]:"]),
    "relative model path": (set_in(["model", "path"], "models/x"), ["model.path: must be an absolute path"]),
    "no ranks": (set_in(["ranks"], []), ["ranks:", "at least 1"]),
    "unknown profile": (set_in(["profile"], "nope"), ["profile 'nope'", "known profiles:", "keys-1m-dcp4"]),
    "duplicate rank address": (set_in(["ranks", 3, "address"], "10.0.0.11"),
                               ["same address 10.0.0.11:22 as ranks[0]"]),
    "tp x pp != ranks": (lambda d: d["ranks"].pop(), ["ranks: 3 ranks listed", "tensor parallel 4 × pipeline parallel 1 = 4"]),
    "tensorfold on 3 ranks": (lambda d: (d["ranks"].pop(), d.update(profile="tensorfold")),
                              ["ranks: 3 ranks listed, but profile tensorfold runs TensorFold's GLM-5.3 "
                               "engine, which serves at --tp 4 only"]),
    "bad override flag": (set_in(["overrides", "engine_args"], ["--max-num-seq 4"]),
                          ["overrides.engine_args:", "did you mean --max-num-seqs?"]),
    "bad override value": (set_in(["overrides", "engine_args"], ["--max-num-seqs eight"]),
                           ["overrides.engine_args: --max-num-seqs: invalid int value 'eight'"]),
    "override changes tp": (set_in(["overrides", "engine_args"], ["--tensor-parallel-size 2"]),
                            ["tensor parallel 2 × pipeline parallel 1 = 2"]),
    "negative gid index": (set_in(["fabric"], {"gid_index": -1}), ["fabric.gid_index:", "greater than or equal to 0"]),
    "gid index in env not a number": (set_in(["overrides", "env"], {"NCCL_IB_GID_INDEX": "three"}),
                                      ["overrides.env.NCCL_IB_GID_INDEX: 'three' is not a GID index"]),
    "two gid indexes": (lambda d: d.update(fabric={"gid_index": 3}, overrides={"env": {"NCCL_IB_GID_INDEX": "5"}}),
                        ["fabric.gid_index 3 and overrides.env.NCCL_IB_GID_INDEX 5 disagree"]),
    "relative host nccl": (set_in(["nccl"], {"host_lib": "lib/libnccl.so.2"}), ["nccl.host_lib: must be an absolute path"]),
    "nccl env without a lib": (set_in(["nccl"], {"env": {"NCCL_SWITCHLESS_RING_ONLY": "1"}}),
                               ["nccl:", "give `host_lib` too"]),
    "serving guard floors upside down": (set_in(["memory_guard"], {"serving": {"soft_free_gib": 2}}),
                                         ["memory_guard.serving:", "hard_available_gib (3) must be below "
                                          "soft_free_gib (2)"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_config_names_file_and_field(write_config, case):
    edit, expected = CASES[case]
    path = write_config(edit)
    result = run_plan(path)
    assert result.exit_code == 2, result.output
    for text in expected:
        assert text in result.output
    assert str(path) in result.output


def test_every_problem_is_reported_on_its_own_line(write_config):
    def edit(d):
        d.pop("topology")
        d["ranks"][0]["port"] = "x"
        d["extra"] = 1
    result = run_plan(write_config(edit))
    assert result.exit_code == 2
    lines = [l for l in result.output.splitlines() if l.startswith("error:")]
    assert len(lines) == 3


def test_malformed_yaml_names_line_and_column(write_config):
    path = write_config(text="profile: keys-1m-dcp4\nranks:\n  - address: [unclosed\n")
    result = run_plan(path)
    assert result.exit_code == 2
    assert f"{path}:4:1: malformed YAML" in result.output


def test_missing_config_file(tmp_path):
    result = run_plan(tmp_path / "nowhere.yaml")
    assert result.exit_code == 2 and "no such cluster config file" in result.output


def test_not_a_mapping(write_config):
    result = run_plan(write_config(text="- just\n- a list\n"))
    assert result.exit_code == 2 and "expected a mapping" in result.output


def with_profile(write_config, tmp_path, arg: str):
    """A cluster.yaml whose profile `mine` passes `--tensor-parallel-size 4` and `arg`."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "mine.yaml").write_text(
        "description: x\nimage: {prebuilt: x}\nserved_name: x\n"
        f"args: ['--tensor-parallel-size 4', '{arg}']\nkv: {{layout: fp8}}\n"
        "defaults: {model_shape: {num_hidden_layers: 2, kv_lora_rank: 512, qk_rope_head_dim: 64}, "
        "weights_per_rank_gib: 1}\n")
    return write_config(lambda d: d.update(profile="mine", profiles_dir=str(profiles)))


def test_profile_with_an_unknown_vllm_flag(write_config, tmp_path):
    result = run_plan(with_profile(write_config, tmp_path, "--enable-prefix-cache"))
    assert result.exit_code == 2
    assert "mine.yaml: args: unrecognized vLLM 0.33 argument --enable-prefix-cache" in result.output
    assert "did you mean --enable-prefix-caching?" in result.output and "plugin_flags" in result.output


def test_config_from_environment_and_real_console_script(write_config, tmp_path):
    """The installed `sparkstack` script, through $SPARKSTACK_CONFIG: exit 2, no traceback."""
    path = write_config(drop("model"))
    script = Path(sys.executable).parent / "sparkstack"  # installed beside the venv's python
    assert script.exists(), "the sparkstack console script is installed with the package"
    proc = subprocess.run([str(script), "plan", "--offline"], capture_output=True, text=True,
                          env={"SPARKSTACK_CONFIG": str(path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 2
    assert "model: required but missing" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_profile_with_a_value_vllm_refuses(write_config, tmp_path):
    result = run_plan(with_profile(write_config, tmp_path, "--kv-cache-memory-bytes 14.5G"))
    assert result.exit_code == 2
    assert ("mine.yaml: args: --kv-cache-memory-bytes: Decimals are not allowed with binary "
            "suffixes like G. Did you mean to use 14.5g instead?") in result.output
    assert "plugin_flags" not in result.output
