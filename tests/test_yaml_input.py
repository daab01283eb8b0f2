"""YAML that no config needs (issue 33, items 5 and 10): aliases and anchors (an 8 KB alias bomb
in `fabric_ips` took > 8 GB and minutes in every command that loads the config), documents far
larger than a config file, and `init --merge` files that are not a YAML mapping of UTF-8 text.
Each is one `file: problem` message and exit 2, before anything is reached over the network."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import errors
from launcher.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]


def bomb(levels: int = 9, width: int = 10) -> str:
    """The billion laughs as a flow list: width ** levels addresses from a few hundred bytes."""
    parts = [f"&a0 [{', '.join(['10.0.0.1'] * width)}]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def _limited():  # 1.5 GB of address space: the bomb needs many times that
    resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))


def test_an_alias_bomb_in_the_config_is_refused_at_once(write_config):
    """Run as the user runs it, in a process of its own, bounded in memory and time: today's
    loader expands the bomb while validating `fabric_ips` (the process dies or times out)."""
    path = write_config()
    text = path.read_text()
    assert "  fabric_ips:\n  - 192.168.177.1\n" in text
    path.write_text(text.replace("  fabric_ips:\n  - 192.168.177.1\n", f"  fabric_ips: {bomb()}\n", 1))
    assert path.stat().st_size < 8192
    try:
        res = subprocess.run([str(Path(sys.executable).with_name("sparkstack")), "plan", "--offline", "-c", str(path)],
                             capture_output=True, text=True, timeout=60, preexec_fn=_limited, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb was still being expanded after 60 s")
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"{path}:" in res.stderr and "aliases and anchors are not allowed" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("text, problem", [
    ("profile: &p sandbox\ntopology: *p\n", "aliases and anchors are not allowed"),  # the anchor is refused first
    ("x: &base {a: 1}\ny:\n  <<: *base\n", "aliases and anchors are not allowed"),
    ("profile: sandbox\n" + "# padding\n" * 200_000, "is 2000017 bytes"),
])
def test_the_config_loader_refuses(write_config, text, problem):
    path = write_config(text=text)
    res = CliRunner().invoke(main, ["plan", "--offline", "-c", str(path)])
    assert res.exit_code == 2 and problem in res.output, res.output
    assert res.output.startswith(f"{path}") or f"\n{path}" in res.output or f"{path}:" in res.output


def test_a_profile_with_aliases_is_refused(write_config, tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "mine.yaml").write_text((ROOT / "env/profiles/sandbox.yaml").read_text()
                                        + "\nx: &x [1]\ny: *x\n")
    path = write_config(lambda d: d.update(profile="mine", profiles_dir=str(profiles)))
    res = CliRunner().invoke(main, ["plan", "--offline", "-c", str(path)])
    assert res.exit_code == 2 and f"{profiles / 'mine.yaml'}:" in res.output, res.output
    assert "aliases and anchors are not allowed" in res.output


def test_the_loader_itself(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("a: 1\nb: [x, y]\n")
    assert errors.load_yaml(path, "test") == {"a": 1, "b": ["x", "y"]}
    path.write_text("a: " + bomb(30, 30))  # never expanded: refused at its first anchor
    with pytest.raises(errors.ConfigError, match=r"x.yaml:1:5: aliases and anchors are not allowed"):
        errors.load_yaml(path, "test")


# --- init --merge: refused before any login (the hosts here answer nothing) ----------------------

@pytest.mark.parametrize("content, problem", [
    (b"container: {cache_dir: /x\n", "malformed YAML"),
    (b"container:\n  cache_dir: /caf\xe9\n", "2: not UTF-8 text (byte 0xe9)"),
    (b"- container\n- images\n", "expected a mapping of settings, got list"),
    (b"a: &a [1]\nb: *a\n", "aliases and anchors are not allowed"),
])
def test_init_merge_that_is_not_a_mapping_is_exit_2_before_any_login(tmp_path, content, problem):
    merge = tmp_path / "more.yaml"
    merge.write_bytes(content)
    key = tmp_path / "id_ed25519"
    key.write_text("never read: the merge file is refused first")
    res = CliRunner().invoke(main, ["init", "192.0.2.1", "--key", str(key), "--yes", "--profile", "sandbox",
                                    "--model-path", "/m", "-o", str(tmp_path / "c.yaml"), "--merge", str(merge)])
    assert "Traceback" not in res.output and not isinstance(res.exception, (yaml_errors()))
    assert res.exit_code == 2, (res.output, res.exception)
    assert f"{merge}" in res.output and problem in res.output, res.output


def yaml_errors():
    import yaml
    return (yaml.YAMLError, UnicodeDecodeError, AttributeError, TypeError)
