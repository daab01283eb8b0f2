"""`sparkstack ansible-inventory` and launcher/inputs/node_settings.py: pure tests, no ranks needed.

The golden inventories come from env/cluster.example.yaml (as shipped, and with its commented
`nfs` and `jump` lines switched on), with HOME fixed so `~` expands the same everywhere.
`pytest --update-golden` rewrites them (and fails: review the diff, re-run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from launcher.cli import commands as cli
from launcher.inputs import config, node_settings
from launcher.plan import inventory
from launcher.inputs.node_settings import NodeSettingsError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "inventory"
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def _nfs_and_jump(data: dict) -> None:
    data["model"]["nfs"] = {"server": "spark1", "export": "/srv/models/keys-GLM-5.3-EXL3"}
    data["ranks"][3]["jump"] = "admin@bastion.lan:2222"


VARIANTS = {"example": None, "example-nfs-jump": _nfs_and_jump}


@pytest.fixture
def load_example(write_config, monkeypatch):
    monkeypatch.setenv("HOME", "/home/operator")

    def load(variant: str = "example", edit=None):
        def edits(data):
            for change in (VARIANTS[variant], edit):
                if change:
                    change(data)

        return config.load(write_config(edits)).cluster

    return load


@pytest.mark.parametrize("fmt", inventory.FORMATS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_inventory_matches_golden(load_example, variant, fmt, golden):
    golden.check(GOLDEN / f"{variant}.{fmt}", inventory.render(load_example(variant), fmt))


@pytest.mark.skipif(not ANSIBLE_INVENTORY.exists(), reason="ansible-core is not installed")
@pytest.mark.parametrize("fmt", inventory.FORMATS)
def test_ansible_reads_back_what_was_meant(load_example, tmp_path, fmt):
    """Both formats, parsed by Ansible itself, give every host exactly build()'s variables
    (the INI form depends on Ansible's literal_eval of each value)."""
    cluster = load_example("example-nfs-jump")
    path = tmp_path / f"inventory.{'yml' if fmt == 'yaml' else 'ini'}"
    path.write_text(inventory.render(cluster, fmt))
    listed = json.loads(subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(path), "--list"],
                                       capture_output=True, text=True, check=True).stdout)
    group = inventory.build(cluster)["all"]["children"]["spark"]
    assert listed["spark"]["hosts"] == list(group["hosts"])
    for name, hv in group["hosts"].items():
        marked = []
        assert _unwrap(listed["_meta"]["hostvars"][name], marked) == {**group["vars"], **hv}, name
        if fmt == "yaml":  # what comes from the config is data, never a template
            config_strings = [v for v in hv.values() if isinstance(v, str)] + [group["vars"]["spark_node_model_path"]]
            assert set(config_strings) <= set(marked), name


def _unwrap(value, marked: list):
    """`ansible-inventory --list` shows a string marked !unsafe as {"__ansible_unsafe": s}: s,
    noted in `marked`."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            marked.append(value["__ansible_unsafe"])
            return value["__ansible_unsafe"]
        return {k: _unwrap(v, marked) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v, marked) for v in value]
    return value


TEMPLATE = "{{ lookup('pipe', 'id -u') }}"


@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-core is not installed")
def test_config_strings_are_never_templates(load_example, tmp_path):
    """A Jinja expression in the config (here in model.path) would run on the control host when
    Ansible reads the variable: the YAML inventory hands it over as data, the INI one refuses it."""
    cluster = load_example(edit=lambda data: data["model"].update(path=f"/models/{TEMPLATE}"))
    path = tmp_path / "inventory.yml"
    path.write_text(inventory.render(cluster, "yaml"))
    play = tmp_path / "show.yml"
    play.write_text("- hosts: spark1\n  connection: local\n  gather_facts: false\n"
                    "  tasks: [{debug: {var: spark_node_model_path}}]\n")
    shown = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(path), str(play)],
                           capture_output=True, text=True, check=True).stdout
    assert f'"spark_node_model_path": "/models/{TEMPLATE}"' in shown
    with pytest.raises(inventory.InventoryError, match=r"group spark: spark_node_model_path = .* holds "
                                                       r"Jinja syntax .* use --format yaml"):
        inventory.render(cluster, "ini")


def test_a_name_that_carries_inventory_variables_is_refused(write_config):
    path = write_config(lambda data: data["ranks"][0].update(name="spark1 ansible_connection=local"))
    result = CliRunner().invoke(cli.main, ["ansible-inventory", "-c", str(path)])
    assert result.exit_code == 2
    assert "ranks[0].name: expected a name of letters, digits, '-', '_' and '.'" in result.output
    assert "ansible_connection=local" in result.output and "Traceback" not in result.output


def test_host_vars_reach_ranks_like_the_launcher(load_example):
    hosts = inventory.build(load_example("example-nfs-jump"))["all"]["children"]["spark"]["hosts"]
    assert list(hosts) == ["spark1", "spark2", "spark3", "spark4"]
    assert [h["spark_rank"] for h in hosts.values()] == [0, 1, 2, 3]
    s1, s4 = hosts["spark1"], hosts["spark4"]
    assert (s1["ansible_host"], s1["ansible_port"], s1["ansible_user"]) == ("10.0.0.11", 22, "spark")
    assert s1["ansible_ssh_private_key_file"] == "/home/operator/.ssh/id_ed25519"
    assert s1["ansible_ssh_common_args"] == (
        "-o UserKnownHostsFile=/home/operator/.ssh/known_hosts -o StrictHostKeyChecking=yes")
    # the bastion is verified against the same known_hosts, with the rank's key
    assert "ProxyCommand=ssh -o UserKnownHostsFile=/home/operator/.ssh/known_hosts " \
           "-o StrictHostKeyChecking=yes -p 2222 -i /home/operator/.ssh/id_ed25519 " \
           "-W %h:%p admin@bastion.lan" in s4["ansible_ssh_common_args"]
    assert [h["spark_nfs_server"] for h in hosts.values()] == [True, False, False, False]


def test_fstab_bind_mounts_on_the_nfs_server_and_mounts_nfs_elsewhere(load_example):
    cluster = load_example("example-nfs-jump")
    assert node_settings.nfs_server_index(cluster) == 0
    assert node_settings.fstab_entry(cluster, 0) == (
        "/srv/models/keys-GLM-5.3-EXL3 /models/keys-GLM-5.3-EXL3 none bind,nofail 0 0")
    for i in (1, 2, 3):
        assert node_settings.fstab_entry(cluster, i) == (
            "spark1:/srv/models/keys-GLM-5.3-EXL3 /models/keys-GLM-5.3-EXL3 nfs "
            "ro,soft,timeo=600,retrans=2,noatime,nofail,_netdev 0 0")


def _nfs(**changes):
    return lambda data: data["model"]["nfs"].update(changes)


def test_fstab_cases(load_example):
    assert node_settings.fstab_entry(load_example(), 0) is None  # no model.nfs
    nas = load_example("example-nfs-jump", _nfs(server="nas.lan"))  # not a rank: all are clients
    assert node_settings.nfs_server_index(nas) is None
    assert all(node_settings.fstab_entry(nas, i).startswith("nas.lan:") for i in range(4))
    by_fabric_ip = load_example("example-nfs-jump", _nfs(server="192.168.178.3"))
    assert node_settings.nfs_server_index(by_fabric_ip) == 2
    # the export already is the shared path: nothing to bind on the server
    same_path = load_example("example-nfs-jump", _nfs(export="/models/keys-GLM-5.3-EXL3"))
    assert node_settings.fstab_entry(same_path, 0) is None
    spaced = load_example("example-nfs-jump", _nfs(export="/srv/my models"))
    with pytest.raises(NodeSettingsError, match="model.nfs.export.*cannot go into /etc/fstab"):
        node_settings.fstab_entry(spaced, 1)


def test_sysctls_base_and_config_extras():
    assert node_settings.sysctls() == {"vm.compaction_proactiveness": 0, "vm.swappiness": 1}
    cluster = SimpleNamespace(overrides=SimpleNamespace(
        sysctls={"net.ipv4.ip_forward": 1, "vm.swappiness": 10}))
    assert node_settings.sysctls(cluster) == {"net.ipv4.ip_forward": 1,
                                              "vm.compaction_proactiveness": 0, "vm.swappiness": 10}
    assert node_settings.sysctl_conf(cluster).splitlines()[1:] == [
        "net.ipv4.ip_forward = 1", "vm.compaction_proactiveness = 0", "vm.swappiness = 10"]
    for bad in ({"swappiness": 1}, {"vm.swappiness": "1\nkernel.x = 1"}, {"vm.swappiness": True}):
        with pytest.raises(NodeSettingsError, match="overrides.sysctls"):
            node_settings.sysctls(SimpleNamespace(overrides=SimpleNamespace(sysctls=bad)))


def test_drop_caches_rule_is_narrow():
    assert node_settings.sudoers_rule("spark") == (
        "spark ALL=(root) NOPASSWD: /usr/sbin/sysctl -w vm.drop_caches=3, "
        "/usr/sbin/sysctl -w vm.compact_memory=1\n")
    assert node_settings.drop_caches_command("spark") == (
        "sync && sudo -n /usr/sbin/sysctl -w vm.drop_caches=3")
    assert node_settings.drop_caches_command("root") == "sync && echo 3 > /proc/sys/vm/drop_caches"
    with pytest.raises(NodeSettingsError, match="cannot be named in a sudoers rule"):
        node_settings.sudoers_rule("spark ALL=(ALL) NOPASSWD: ALL #")


def test_prep_and_the_role_comment_out_the_same_swap_lines(tmp_path):
    """`prep`'s sed (POSIX ERE) and the role's replace task (Python's re, what Ansible runs)
    comment out the same fstab lines, the swap ones only, and a second run changes nothing."""
    import re

    fstab = ("UUID=ab12 / ext4 errors=remount-ro 0 1\n/swap.img\tnone\tswap\tsw\t0\t0\n"
             "# /old.img none swap sw 0 0\nUUID=cd34 none swap sw,pri=5 0 0\n"
             "/srv/swap /mnt/swap ext4 defaults 0 0\n/z.img none swap\n/w.img none swap sw 0 0\nnas:/swap /mnt/x nfs ro 0 0\n")
    path = tmp_path / "fstab"
    path.write_text(fstab)
    sed = ["sh", "-c", node_settings.comment_out_swap_command(str(path))]
    subprocess.run(sed, check=True)
    by_sed = path.read_text()
    mark = node_settings.SWAP_FSTAB_MARK
    assert by_sed.splitlines() == [
        "UUID=ab12 / ext4 errors=remount-ro 0 1", f"{mark} /swap.img\tnone\tswap\tsw\t0\t0",
        "# /old.img none swap sw 0 0", f"{mark} UUID=cd34 none swap sw,pri=5 0 0",
        "/srv/swap /mnt/swap ext4 defaults 0 0", f"{mark} /z.img none swap", f"{mark} /w.img none swap sw 0 0", "nas:/swap /mnt/x nfs ro 0 0"]
    # ansible.builtin.replace: re.subn with MULTILINE over the whole file
    role = lambda text: re.compile(node_settings.SWAP_LINE_RE, re.MULTILINE).sub(mark + " \\1", text)  # noqa: E731
    assert role(fstab) == by_sed
    subprocess.run(sed, check=True)
    assert path.read_text() == by_sed == role(by_sed)  # a second run changes nothing


def test_memory_relief_uses_exactly_the_rule():
    """The load-time watcher's drop-and-compact: by /proc as root, else `sudo -n` of exactly the
    rule's two commands; its pre-flight asks sudo about both and nothing else."""
    assert node_settings.COMPACT_MEMORY_SUDO == "/usr/sbin/sysctl -w vm.compact_memory=1"
    assert node_settings.memory_relief_command("root") == (
        "sync && echo 3 > /proc/sys/vm/drop_caches && echo 1 > /proc/sys/vm/compact_memory")
    assert node_settings.memory_relief_command("spark") == (
        "sync && sudo -n /usr/sbin/sysctl -w vm.drop_caches=3 && "
        "sudo -n /usr/sbin/sysctl -w vm.compact_memory=1")
    assert node_settings.relief_sudo_check_command("root") == "true"
    assert node_settings.relief_sudo_check_command("spark") == (
        "sudo -n -l /usr/sbin/sysctl -w vm.drop_caches=3 >/dev/null && "
        "sudo -n -l /usr/sbin/sysctl -w vm.compact_memory=1 >/dev/null")
    rule = node_settings.sudoers_rule("spark")
    for command in node_settings.SUDO_COMMANDS:  # every sudo the relief runs is in the rule
        assert command in rule and f"sudo -n {command}" in node_settings.memory_relief_command("spark")


@pytest.mark.skipif(shutil.which("visudo") is None, reason="no visudo here")
def test_sudoers_file_passes_visudo(tmp_path):
    path = tmp_path / "rule"
    path.write_text(node_settings.sudoers_file("spark"))
    subprocess.run(["visudo", "-cf", str(path)], check=True, capture_output=True)


def test_limits_and_docker_ulimits():
    rows = node_settings.limits_conf().splitlines()[1:]
    assert "* hard nofile 1048576" in rows and "root hard memlock unlimited" in rows
    assert node_settings.docker_default_ulimits() == {
        "memlock": {"Name": "memlock", "Soft": -1, "Hard": -1},
        "nofile": {"Name": "nofile", "Soft": 1048576, "Hard": 1048576}}


def test_sandbox_ranks_get_files_only(load_example):
    assert all(inventory.group_vars(load_example())[k] for k in _LIVE_SWITCHES)
    cluster = load_example(edit=lambda data: data["ranks"][0].update(sysfs_root="/sandbox/sysfs"))
    assert inventory.is_sandbox(cluster)
    assert not any(inventory.group_vars(cluster)[k] for k in _LIVE_SWITCHES)


_LIVE_SWITCHES = ("spark_node_apply_live", "spark_node_mount_now", "spark_node_manage_services",
                  "spark_node_install_packages")


def test_duplicate_rank_names_are_refused(load_example):
    cluster = load_example(edit=lambda data: data["ranks"][2].update(name="spark1"))
    with pytest.raises(inventory.InventoryError, match=r"ranks\[2\] and ranks\[0\] are both called"):
        inventory.build(cluster)


def test_ini_values_read_back_as_the_same_type():
    assert inventory._ini_value("True") == "'True'"  # a string, not a boolean
    assert inventory._ini_value("10.0.0.11") == "10.0.0.11"
    assert inventory._ini_value(False) == "False"
    assert inventory._ini_value({"a": [1]}) == "{'a': [1]}"


@pytest.mark.parametrize("fmt", inventory.FORMATS)
def test_cli_prints_the_inventory(load_example, write_config, fmt):
    path = write_config()
    result = CliRunner().invoke(cli.main, ["ansible-inventory", "-c", str(path), "--format", fmt])
    assert result.exit_code == 0, result.output
    assert result.output == inventory.render(config.load(path).cluster, fmt)


def test_cli_bad_config_is_one_message(tmp_path):
    result = CliRunner().invoke(cli.main, ["ansible-inventory", "-c", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such cluster config file" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("profile, overrides, wanted", [
    ("keys35-200k", {}, True),                   # seed 001: "no swap"
    ("keys-1m-dcp4", {}, False),                 # seeds 000/004 say nothing of swap
    ("keys-1m-dcp4", {"no_swap": True}, True),   # cluster.yaml asks
    ("tensorfold", {"no_swap": False}, False),   # cluster.yaml wins over the profile
])
def test_inventory_turns_swap_off_as_the_profile_or_config_says(write_config, profile, overrides, wanted):
    path = write_config(lambda d: d.update(profile=profile) or d["overrides"].update(overrides))
    result = CliRunner().invoke(cli.main, ["ansible-inventory", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert f"spark_node_no_swap={wanted}" in result.output.splitlines()


def test_earlyoom_prefers_the_engine_and_spares_the_way_in(write_config):
    """earlyoom matches --prefer / --avoid (POSIX ERE, unanchored) against /proc/PID/comm, 15
    characters: vLLM's processes are preferred, sshd, dockerd and systemd's avoided. TensorFold's
    engine is `python3` by name, so the plan also raises every engine container's oom_score
    (--oom-score-adj 1000), which earlyoom and the kernel's OOM killer rank by."""
    import re

    prefer, avoid = re.compile(node_settings.EARLYOOM_PREFER), re.compile(node_settings.EARLYOOM_AVOID)
    engine = ["VLLM::Worker_TP", "VLLM::EngineCor", "vllm", "pt_main_thread"]
    keep = ["sshd", "sshd-session", "dockerd", "containerd", "containerd-shim", "systemd",
            "systemd-journal", "earlyoom", "init"]
    assert all(prefer.search(n) and not avoid.search(n) for n in engine)
    assert all(avoid.search(n) and not prefer.search(n) for n in keep)
    assert not prefer.search("python3") and not avoid.search("python3")  # hence the score below
    assert f"--prefer {node_settings.EARLYOOM_PREFER} --avoid {node_settings.EARLYOOM_AVOID}" in \
        node_settings.earlyoom_defaults()
    from launcher.plan import cluster_plan as planning
    for profile in ("keys-1m-dcp4", "tensorfold"):
        result = CliRunner().invoke(cli.main, ["plan", "-c", str(write_config(lambda d: d.update(profile=profile))),
                                               "--offline", "--json"])
        for rank in json.loads(result.output)["ranks"]:
            run = rank["docker_run"]
            assert run[run.index("--oom-score-adj") + 1] == str(planning.OOM_SCORE_ADJ) == "1000"


@pytest.mark.skipif(not ANSIBLE_INVENTORY.exists(), reason="ansible-core is not installed")
@pytest.mark.parametrize("fmt", inventory.FORMATS)
def test_gpu_clock_reaches_the_role_as_prep_runs_it(load_example, tmp_path, fmt):
    """gpu_clock: the role's unit gets exactly prep's command (node_settings), read back by Ansible."""
    cluster = load_example(edit=lambda d: d.update(gpu_clock={"max_mhz": 2400, "min_mhz": 600}))
    path = tmp_path / f"inventory.{'yml' if fmt == 'yaml' else 'ini'}"
    path.write_text(inventory.render(cluster, fmt))
    listed = json.loads(subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(path), "--list"],
                                       capture_output=True, text=True, check=True).stdout)
    got = _unwrap(next(iter(listed["_meta"]["hostvars"].values())), [])["spark_node_gpu_clock_command"]
    assert got == node_settings.gpu_clock_command(600, 2400)
    assert "nvidia-smi -lgc 600,2400" in got and node_settings.GPU_CLOCK_FILE in got


# Issue 33, item 2: every line separator Python's str.splitlines() knows (Ansible's INI parser
# splits with it), and the other control characters.
LINE_SEPARATORS = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
CONTROLS = LINE_SEPARATORS + ["\t", "\x00", "\x1b", "\x7f", "\x9b"]


def _injected(separators) -> str:
    """A model.path whose every separator starts an inventory line of its own."""
    return "/models/m" + "".join(f"{sep}spark_injected_{i}=1" for i, sep in enumerate(separators)) + \
        f"{separators[0]}ansible_ssh_extra_args=-o ProxyCommand=touch /tmp/pwned"


@pytest.mark.skipif(not ANSIBLE_INVENTORY.exists(), reason="ansible-core is not installed")
def test_ini_inventory_takes_no_injected_lines(load_example, tmp_path):
    """A model.path holding a line separator other than \\n (which the writer quotes) became new
    [spark:vars] lines, ansible_ssh_extra_args among them (a ProxyCommand runs on the control
    host). The config refuses it (below); the writer refuses it too, for a cluster built past the
    config's checks, so Ansible never reads such a file."""
    cluster = load_example()
    bad = cluster.model_copy(update={"model": cluster.model.model_copy(
        update={"path": _injected(LINE_SEPARATORS[1:])})})  # model_copy validates nothing
    path = tmp_path / "inventory.ini"
    try:
        path.write_text(inventory.render(bad, "ini"))
    except inventory.InventoryError as e:
        assert "spark_node_model_path" in e.message and "line break or control character" in e.message
        path.write_text(inventory.render(cluster, "ini"))  # what the writer writes instead: nothing bad
    listed = json.loads(subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(path), "--list"],
                                       capture_output=True, text=True, check=True).stdout)
    hostvars = _unwrap(listed["_meta"]["hostvars"]["spark1"], [])
    assert "ansible_ssh_extra_args" not in hostvars
    assert not [k for k in hostvars if k.startswith("spark_injected")]


@pytest.mark.parametrize("char", CONTROLS, ids=repr)
def test_inventory_refuses_control_characters_in_any_string(load_example, char):
    cluster = load_example()
    for fmt in inventory.FORMATS:
        bad = cluster.model_copy(update={"model": cluster.model.model_copy(update={"path": f"/models/a{char}b"})})
        with pytest.raises(inventory.InventoryError, match="spark_node_model_path.*line break or control character"):
            inventory.render(bad, fmt)


MOUNTED = {"model.path", "model.local_path", "container.cache_dir"}  # docker -v: a NUL was refused already


@pytest.mark.parametrize("char", CONTROLS, ids=repr)
@pytest.mark.parametrize("field, edit", [
    ("model.path", lambda d, v: d["model"].update(path=f"/models/a{v}b")),
    ("model.local_path", lambda d, v: d["model"].update(local_path=f"/srv/a{v}b")),
    ("container.cache_dir", lambda d, v: d.setdefault("container", {}).update(cache_dir=f"/var/cache/a{v}b")),
    ("ssh.known_hosts", lambda d, v: d.setdefault("ssh", {}).update(known_hosts=f"/home/o/kh{v}x")),
    ("ranks[1].key", lambda d, v: d["ranks"][1].update(key=f"/home/o/id{v}x")),
    ("ranks[0].user", lambda d, v: d["ranks"][0].update(user=f"spark{v}x")),
    ("model.nfs.export", lambda d, v: d["model"].update(nfs={"server": "spark1", "export": f"/srv/a{v}b"})),
    ("model.nfs.server", lambda d, v: d["model"].update(nfs={"server": f"spark1{v}x", "export": "/srv/a"})),
    ("overrides.sysctls.net.core.x", lambda d, v: d["overrides"].update(sysctls={"net.core.x": f"1{v}2"})),
    ("profiles_dir", lambda d, v: d.update(profiles_dir=f"/home/o/p{v}x")),
])
def test_config_refuses_control_characters_with_the_field_path(write_config, field, edit, char):
    path = write_config(lambda d: edit(d, char))
    with pytest.raises(config.ConfigError) as raised:
        config.load(path)
    said = "must not contain ':' or NUL" if char == "\x00" and field in MOUNTED else "line break or control character"
    assert any(p.startswith(f"{path}: {field}: ") and said in p for p in raised.value.problems), raised.value.problems
