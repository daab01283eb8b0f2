"""`sparkstack init`'s answers and the config it writes, without a rank (the end-to-end run on a
bare sandbox is tests/test_init.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.cli.commands import main
from launcher.facts import cabling
from launcher.facts.mounts import Mount
from launcher.init import bringup
from launcher.inputs import config
from local_probe import sandbox_rank_facts

HOSTS = ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"]


def cli(*args, stdin=""):
    result = CliRunner().invoke(main, list(args), input=stdin)
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def key(tmp_path):
    k = tmp_path / "id_ed25519"
    k.write_text("not read before the answers are complete")
    return k


def test_yes_without_the_answers_it_needs_is_one_message_exit_2(key, tmp_path):
    res = cli("init", *HOSTS, "--key", str(key), "--yes", "-o", str(tmp_path / "c.yaml"))
    assert res.exit_code == 2
    assert "--yes asks nothing, and --profile and --model-path are missing" in res.output


def test_an_existing_config_is_not_overwritten_without_force(key, tmp_path):
    out = tmp_path / "cluster.yaml"
    out.write_text("mine\n")
    res = cli("init", *HOSTS, "--key", str(key), "--yes", "--profile", "sandbox", "--model-path", "/m",
              "-o", str(out))
    assert res.exit_code == 2 and f"{out} exists; pass --force" in res.output
    assert out.read_text() == "mine\n"


def test_a_missing_key_says_how_to_make_one(tmp_path):
    res = cli("init", *HOSTS, "--key", str(tmp_path / "nokey"), "--yes", "--profile", "sandbox",
              "--model-path", "/m", "-o", str(tmp_path / "c.yaml"))
    assert res.exit_code == 2 and "ssh-keygen -t ed25519" in res.output


def test_the_written_config_loads_and_says_what_each_part_is(tmp_path):
    answers = bringup.Answers(user="spark", key=Path("/k/id"), known_hosts=tmp_path / "kh", profile="sandbox",
                              model_path="/models/m", output=tmp_path / "cluster.yaml")
    doc = bringup.provisional(HOSTS, answers, "ring")
    doc["ranks"] = [bringup.rank_doc(i, h, answers, f"spark{i + 1}", [f"192.168.177.{4 * i + 1}"])
                    for i, h in enumerate(HOSTS)]
    doc["model"]["nfs"] = {"server": "spark1", "export": "/srv/m"}
    text = bringup.render_config(doc, "ring", "2026-12-01")
    assert text.startswith("# cluster.yaml written by `sparkstack init` (2026-12-01): 4 ranks, rank 0 first, "
                           "cabled as a ring.\n")
    assert "# The ranks in order, rank 0 first" in text
    answers.output.write_text(text)
    loaded = config.load(answers.output)
    assert loaded.cluster.topology == "ring"
    assert [r.name for r in loaded.cluster.ranks] == ["spark1", "spark2", "spark3", "spark4"]
    assert [str(r.fabric_ips[0]) for r in loaded.cluster.ranks] == ["192.168.177.1", "192.168.177.5",
                                                                      "192.168.177.9", "192.168.177.13"]
    assert loaded.cluster.model.nfs.export == "/srv/m"
    assert yaml.safe_load(text) == doc


def test_a_host_name_that_is_no_label_gets_the_ranks_hostname_else_rankN():
    a = bringup.Answers(user="u", key=Path("k"), known_hosts=Path("kh"), profile="p", model_path="/m",
                        output=Path("c"))
    assert bringup.rank_doc(0, "10.0.0.11:2222", a, "spark1")["name"] == "spark1"
    assert bringup.rank_doc(0, "10.0.0.11:2222", a, "spark1")["port"] == 2222
    assert bringup.rank_doc(1, "10.0.0.12", a, "under_score")["name"] == "rank1"
    assert bringup.rank_doc(1, "spark2", a, None)["name"] == "spark2"


def test_the_checkpoint_on_an_nfs_mount_becomes_model_nfs(tmp_path):
    f = sandbox_rank_facts(tmp_path, 1)
    mounted = dataclasses.replace(f, model_mount=Mount("/models/m", "spark1:/srv/models/m", "nfs4", "ro"))
    assert bringup.nfs_of({0: f, 1: mounted}, "/models/m") == {"server": "spark1", "export": "/srv/models/m"}
    assert bringup.nfs_of({0: f}, "/models/m") is None


def test_addresses_that_did_not_stick_are_named_by_rank_and_port(tmp_path):
    f = sandbox_rank_facts(tmp_path, 0)
    want = [cabling.Address(0, "enp1s0f0np0", "192.168.177.1/30", False),
            cabling.Address(0, "enp1s0f1np1", "192.168.177.99/30", False)]
    with pytest.raises(bringup.InitError) as e:
        bringup.confirm_applied({0: f}, want)
    assert "rank 0: enp1s0f1np1 lacks 192.168.177.99/30 after applying it (has 192.168.177.14/30)" in e.value.message
    assert "enp1s0f0np0" not in e.value.message


def test_the_fabric_plays_inventory_carries_each_ranks_netplan_text_as_data(tmp_path):
    answers = bringup.Answers(user="spark", key=Path("/k/id"), known_hosts=tmp_path / "kh", profile="sandbox",
                              model_path="/models/m", output=tmp_path / "cluster.yaml")
    loaded = bringup.load_doc(bringup.provisional(HOSTS, answers), tmp_path)
    addrs = [cabling.Address(0, "enp1s0f0np0", "192.168.177.1/30", False),
             cabling.Address(1, "enp1s0f1np1", "192.168.177.2/30", True)]
    from launcher.plan import inventory

    text = inventory.with_host_vars(loaded.cluster, bringup.fabric_vars(addrs, 9000))
    hosts = yaml.safe_load(text.replace("!unsafe ", ""))["all"]["children"]["spark"]["hosts"]
    first = hosts["rank0"]  # an IP is no host label: rankN
    assert first["spark_node_netplan"] == cabling.netplan(addrs, 0, 9000)
    assert first["spark_node_fabric"] == [{"netdev": "enp1s0f0np0", "address": "192.168.177.1/30"}]
    assert first["spark_node_fabric_mtu"] == 9000 and first["ansible_user"] == "spark"
    assert "spark_node_netplan: !unsafe |" in text  # Ansible takes it as data, never a template


def test_a_prefix_other_than_30_or_31_is_refused_before_any_login(key, tmp_path):
    res = cli("init", *HOSTS, "--key", str(key), "--yes", "--profile", "sandbox", "--model-path", "/m",
              "--prefix", "29", "-o", str(tmp_path / "c.yaml"))
    assert res.exit_code == 2 and "'29' is not one of '30', '31'" in res.output
