"""Facts: each parser on real-format raw output (tests/facts_cases/*.json: raw in, fact out), and
the probe script itself run as a subprocess against fixture trees, its output fed to the parsers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from local_probe import run_probe
from launcher.facts import record as facts
from launcher.facts.checkpoint_dir import parse_checkpoint
from launcher.facts.clock import parse_clock
from launcher.facts.disks import parse_disks
from launcher.facts.docker import parse_docker, parse_docker_api
from launcher.facts.gpu import CdiSpec, parse_cdi_specs, parse_driver, parse_gpu, parse_gpu_clocks, parse_nvidia_ctk
from launcher.facts.kernel import parse_page_size, parse_sysctls, parse_sysfs_root
from launcher.facts.limits import parse_docker_ulimits, parse_rlimits
from launcher.facts.memory import parse_meminfo
from launcher.facts.mounts import parse_mounts
from launcher.facts.nccl_lib import NcclLib, parse_nccl_lib
from launcher.facts.network import parse_default_route, parse_interfaces, parse_ssh_connection
from launcher.facts.parts import FactError
from launcher.facts.rdma import Gid, parse_rdma
from launcher.facts.record import to_jsonable
from launcher.facts.sample import parse_rank_sample

CASES = sorted((Path(__file__).parent / "facts_cases").glob("*.json"))
PARSERS = {
    "meminfo": parse_meminfo,
    "sysctls": parse_sysctls,
    "rlimits": parse_rlimits,
    "docker_ulimits": parse_docker_ulimits,
    "interfaces": parse_interfaces,
    "rdma": parse_rdma,
    "docker": parse_docker,
    "docker_api": parse_docker_api,
    "mounts": parse_mounts,
    "checkpoint": parse_checkpoint,
    "gpu": parse_gpu,
    "disks": parse_disks,
    "clock": parse_clock,
    "nccl_lib": parse_nccl_lib,
    "default_route": parse_default_route,
    "ssh_connection": parse_ssh_connection,
    "driver": parse_driver,
    "gpu_clocks": parse_gpu_clocks,
    "cdi_specs": parse_cdi_specs,
    "nvidia_ctk": parse_nvidia_ctk,
    "page_size": parse_page_size,
    "sysfs_root": parse_sysfs_root,
    "rank_sample": parse_rank_sample,
}


def test_cases_cover_every_parser():
    used = {json.loads(p.read_text())["parser"] for p in CASES}
    assert used == set(PARSERS)


def test_every_field_of_facts_has_one_part():
    """record.PARTS, the subjects' declared parts, fill every field of Facts but `problems`, each once."""
    filled = [part.field for part in facts.PARTS]
    assert sorted(filled) == sorted(f.name for f in dataclasses.fields(facts.Facts) if f.name != "problems")
    assert all(part.checked_as in (None, *filled) for part in facts.PARTS)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case(path):
    case = json.loads(path.read_text())
    parser = PARSERS[case["parser"]]
    if "raises" in case:
        with pytest.raises(FactError, match=case["raises"]):
            parser(**case["raw"])
        return
    assert to_jsonable(parser(**case["raw"])) == case["fact"]


def test_gb10_meminfo_is_about_121_gib():
    case = json.loads((Path(__file__).parent / "facts_cases" / "meminfo_gb10_page_cache_full.json").read_text())
    memory = parse_meminfo(**case["raw"])
    assert 121.5 < memory.total / 2**30 < 122


def test_clock_offset_and_uncertainty():
    clock = parse_clock({"started": 100.400, "finished": 100.450}, sent=100.100, received=100.300)
    assert clock.offset == pytest.approx(0.225)
    assert clock.uncertainty == pytest.approx(0.075)  # (0.2 round trip - 0.05 on the rank) / 2
    assert parse_clock({"started": 1.0}).offset is None


def test_gid_properties():
    v2 = Gid(3, "0000:0000:0000:0000:0000:ffff:c0a8:b101", "RoCE v2", "enp1s0f0np0")
    ll = Gid(1, "fe80:0000:0000:0000:4ebb:47ff:fe10:0000", "RoCE v2", "enp1s0f0np0")
    assert str(v2.ipv4) == "192.168.177.1" and not v2.link_local
    assert ll.ipv4 is None and ll.link_local


def test_docker_image_lookup():
    case = json.loads((Path(__file__).parent / "facts_cases" / "docker_images_with_labels.json").read_text())
    docker = parse_docker(**case["raw"])
    prebuilt = "ghcr.io/drowzeys/keys-tensorfold-glm53-tp4-dgx-spark"
    assert docker.image(prebuilt) is docker.image(prebuilt + ":2026-10-05")
    assert docker.image("sparkstack/keys:3f2a9c1b7e4d").kit
    assert not docker.image(prebuilt).kit
    assert docker.image("sparkstack/keys:other") is None


# --- the probe script ---------------------------------------------------------------------------

def test_invocation_is_one_command_with_the_script_on_stdin():
    args = facts.probe_args("/sandbox/sysfs", "/models/glm53-sandbox", sysctls=("vm.max_map_count",))
    command, stdin = facts.invocation(args)
    argv = shlex.split(command)
    assert argv[:2] == ["python3", "-"] and len(argv) == 3
    assert json.loads(argv[2]) == {"sysfs_root": "/sandbox/sysfs", "ip_addr_file": "/sandbox/ip-addr.json",
                                   "mount_table": "/sandbox/mountinfo", "model_dir": "/models/glm53-sandbox", "sysctls": ["vm.max_map_count"],
                                   "timeout_s": 5.0}
    assert stdin == facts.PROBE_SOURCE.read_bytes()
    assert "ip_addr_file" not in facts.probe_args("/")  # a real host: addresses from `ip` only
    assert "mount_table" not in facts.probe_args("/")  # ... and mounts from the kernel's table


ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
SPARK_HCAS = [("rocep1s0f0", "enp1s0f0np0"), ("roceP2p1s0f0", "enP2p1s0f0np0"),
              ("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")]


def write_spark_sysfs(root: Path, ips: dict[str, str], infiniband: bool = True) -> None:
    """A Spark's sysfs as the kernel lays it out: class/net/<if>/..., and per HCA
    ports/1/{state,link_layer,gids/<i>,gid_attrs/{types,ndevs}/<i>} and device/net/<netdev>;
    unused GID slots read zeros and have no type file (it would read EINVAL)."""
    def put(rel: str, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    for i, (hca, netdev) in enumerate(SPARK_HCAS + [(None, "enP7s7")]):
        mac = f"4c:bb:47:2c:01:{i:02x}"
        speed, mtu = (10000, 1500) if hca is None else (200000, 9000)
        for k, v in {"operstate": "up", "speed": str(speed), "mtu": str(mtu), "address": mac}.items():
            put(f"class/net/{netdev}/{k}", v)
        if hca is None or not infiniband:
            continue
        put(f"class/infiniband/{hca}/device/net/{netdev}/mtu", str(mtu))
        p = f"class/infiniband/{hca}/ports/1"
        put(f"{p}/state", "4: ACTIVE")
        put(f"{p}/link_layer", "Ethernet")
        ll = f"fe80:0000:0000:0000:4ebb:47ff:fe2c:01{i:02x}"
        entries = [(ll, "IB/RoCE v1"), (ll, "RoCE v2")]
        if netdev in ips:
            a, b, c, d = (int(x) for x in ips[netdev].split("."))
            mapped = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
            entries += [(mapped, "IB/RoCE v1"), (mapped, "RoCE v2")]
        for n in range(6):
            gid, kind = entries[n] if n < len(entries) else (ZERO, None)
            put(f"{p}/gids/{n}", gid)
            if kind:
                put(f"{p}/gid_attrs/types/{n}", kind)
                put(f"{p}/gid_attrs/ndevs/{n}", netdev)


def write_ip_addr(path: Path, ips: dict[str, str]) -> None:
    path.write_text(json.dumps([
        {"ifindex": 3 + i, "ifname": netdev, "mtu": 9000, "operstate": "UP",
         "addr_info": [{"family": "inet", "local": ips[netdev], "prefixlen": 30, "scope": "global"}]}
        for i, netdev in enumerate(sorted(ips))]))


def write_checkpoint(model: Path) -> None:
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 78}')
    (model / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    for n, size in ((1, 5 << 30), (2, 3 << 20)):
        with open(model / f"model-0000{n}-of-00002.safetensors", "wb") as f:
            f.truncate(size)  # sparse: the probe must stat, never read, the shards


@pytest.fixture
def ring_rank(tmp_path):
    """spark3 of a ring: fabric IP on the second port, the other port to its other neighbour."""
    ips = {"enp1s0f1np1": "192.168.177.6", "enp1s0f0np0": "192.168.177.9"}
    write_spark_sysfs(tmp_path / "sysfs", ips)
    write_ip_addr(tmp_path / "ip-addr.json", ips)
    write_checkpoint(tmp_path / "model")
    return tmp_path


def test_probe_output_feeds_the_parsers(ring_rank):
    args = facts.probe_args(str(ring_rank / "sysfs"), str(ring_rank / "model"), sysctls=("vm.max_map_count",))
    raw = run_probe(args)
    f = facts.parse_facts(raw, sent=raw["clock"]["started"] - 0.01, received=raw["clock"]["finished"] + 0.01)
    assert f.memory is not None and f.memory.total > 0
    assert {"vm.swappiness", "vm.compaction_proactiveness", "vm.max_map_count"} <= set(f.sysctls)
    assert f.ulimits.nofile is not None and f.ulimits.memlock is not None
    port2 = f.interface("enp1s0f1np1")
    assert port2.ipv4 == ("192.168.177.6/30",) and port2.speed == 200000 and port2.mtu == 9000
    hca = f.rdma_device("rocep1s0f1")
    assert hca.netdevs == ("enp1s0f1np1",)
    assert [(g.index, g.type, str(g.ipv4)) for g in hca.ports[0].gids if g.ipv4] == \
        [(2, "IB/RoCE v1", "192.168.177.6"), (3, "RoCE v2", "192.168.177.6")]
    assert len(f.rdma_device("roceP2p1s0f1").ports[0].gids) == 2  # link-local only; zeros dropped
    ck = f.checkpoint
    assert ck.shards == (("model-00001-of-00002.safetensors", 5 << 30), ("model-00002-of-00002.safetensors", 3 << 20))
    assert ck.total_bytes == (5 << 30) + (3 << 20) and len(ck.fingerprint) == 64
    assert f.disk(str(ring_rank / "model")).size > 0
    assert abs(f.clock.offset) < 0.05
    assert json.loads(json.dumps(f.to_json()))["rdma"][0]["name"] == "roceP2p1s0f0"


def test_probe_reads_the_model_mount_from_a_fixture_table(ring_rank):
    """The sandbox's checkpoint is a bind mount standing in for NFS: the mountinfo beside its
    sysfs fixture says so, and `findmnt -F` reads it as it reads the kernel's own table."""
    model = ring_rank / "model"
    (ring_rank / "mountinfo").write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"90 27 254:0 / {model} ro,relatime - nfs4 172.31.240.1:/models/glm53-sandbox "
        "ro,vers=4.2,soft,timeo=600,retrans=2,addr=172.31.240.1\n")
    f = facts.parse_facts(run_probe(facts.probe_args(str(ring_rank / "sysfs"), str(model))))
    assert (f.model_mount.fstype, f.model_mount.source) == ("nfs4", "172.31.240.1:/models/glm53-sandbox")
    assert "addr=172.31.240.1" in f.model_mount.options
    (ring_rank / "mountinfo").unlink()  # no fixture: the kernel's table
    f = facts.parse_facts(run_probe(facts.probe_args(str(ring_rank / "sysfs"), str(model))))
    assert f.model_mount is not None and f.model_mount.fstype != "nfs4"


def test_probe_fingerprint_follows_content(ring_rank):
    args = facts.probe_args(str(ring_rank / "sysfs"), str(ring_rank / "model"))
    before = facts.parse_facts(run_probe(args)).checkpoint.fingerprint
    assert facts.parse_facts(run_probe(args)).checkpoint.fingerprint == before
    (ring_rank / "model" / "config.json").write_text('{"num_hidden_layers": 79}')
    assert facts.parse_facts(run_probe(args)).checkpoint.fingerprint != before


def test_probe_without_infiniband_or_model(tmp_path):
    write_spark_sysfs(tmp_path / "sysfs", {}, infiniband=False)
    (tmp_path / "ip-addr.json").write_text("[]")
    raw = run_probe(facts.probe_args(str(tmp_path / "sysfs"), str(tmp_path / "no-such-model")))
    f = facts.parse_facts(raw)
    assert f.rdma is None and f.checkpoint is None
    assert any(p.startswith("/sys/class/infiniband: absent") for p in f.problems)
    assert any(p.startswith(f"checkpoint {tmp_path / 'no-such-model'}: FileNotFoundError") for p in f.problems)
    assert f.interface("enP7s7").speed == 10000


def test_probe_missing_commands_are_findings_not_failures(tmp_path):
    """A rank with python3 but no docker, nvidia-smi, ip or findmnt still answers."""
    write_spark_sysfs(tmp_path / "sysfs", {})
    bindir = tmp_path / "bin"
    bindir.mkdir()
    f = facts.parse_facts(run_probe(facts.probe_args(str(tmp_path / "sysfs")), env={"PATH": str(bindir)}))
    assert f.docker is None and f.gpu is None and f.mounts == ()
    assert {"docker: not installed", "nvidia-smi: not installed", "ip: not installed",
            "findmnt: not installed"} <= set(f.problems)
    assert f.interface("enp1s0f0np0").operstate == "up"  # sysfs still read


def test_probe_takes_a_bare_sysfs_root_and_refuses_bad_json(tmp_path):
    write_spark_sysfs(tmp_path / "sysfs", {})
    source = facts.PROBE_SOURCE.read_bytes()
    done = subprocess.run([sys.executable, "-", str(tmp_path / "sysfs")], input=source, capture_output=True, timeout=60)
    assert "rocep1s0f0" in json.loads(done.stdout)["sysfs_infiniband"]
    bad = subprocess.run([sys.executable, "-", "{not json"], input=source, capture_output=True, timeout=60)
    assert bad.returncode == 2 and "bad arguments" in json.loads(bad.stdout)["fatal"]
    with pytest.raises(FactError, match="bad arguments"):
        facts.parse_facts(json.loads(bad.stdout))


def _probe_env(tmp_path, **env):
    write_spark_sysfs(tmp_path / "sysfs", {})
    return run_probe(facts.probe_args(str(tmp_path / "sysfs")), env=env)


@pytest.mark.sandbox  # asks this host's Docker engine at /var/run/docker.sock, whatever DOCKER_HOST says
@pytest.mark.skipif(not shutil.which("docker") or not os.access("/var/run/docker.sock", os.W_OK),
                    reason="needs this host's docker CLI and socket")
def test_probe_asks_the_docker_socket_not_the_cli(tmp_path):
    """Where the socket is usable the probe reads the Engine API (ms) instead of starting the
    docker CLI three or four times (~150 ms of CPU each); the facts are the same."""
    raw = _probe_env(tmp_path, DOCKER_HOST="unix:///var/run/docker.sock")
    assert raw["docker_api"]["socket"] == "/var/run/docker.sock"
    assert "docker_version" not in raw["commands"] and "docker_inspect" not in raw["commands"]
    api = facts.parse_facts(raw).docker
    cli = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    assert api.server_version == cli.stdout.strip()
    ids = subprocess.run(["docker", "images", "-q", "--no-trunc"], capture_output=True, text=True).stdout.split()
    assert {i.id for i in api.images} == set(ids)
    tcp = _probe_env(tmp_path, DOCKER_HOST="tcp://127.0.0.1:9")  # nothing listens on the discard port
    assert tcp["docker_api"] is None and tcp["commands"]["docker_version"]["argv"][0] == "docker"
    f = facts.parse_facts(tcp)
    assert f.docker.server_version is None and any(p.startswith("docker: exit 1") for p in f.problems)


def test_docker_api_problem_names_the_socket(tmp_path):
    raw = _probe_env(tmp_path, PATH=os.environ["PATH"])
    raw["docker_api"] = json.loads((Path(__file__).parent / "facts_cases" / "docker_api_daemon_down.json")
                                   .read_text())["raw"]["api"]
    f = facts.parse_facts(raw)
    assert f.docker.server_version is None
    assert "docker: the daemon does not answer (/version on /var/run/docker.sock: ConnectionRefusedError: " \
           "Connection refused)" in f.problems


# --- the host NCCL library ------------------------------------------------------------------------

def probe_module():
    spec = importlib.util.spec_from_file_location("probe_under_test", facts.PROBE_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_nccl(path: Path, version: str = "2.30.7+cuda13.0") -> None:
    """An ELF-ish file holding, as libnccl.so does, a format string first and then the version."""
    path.write_bytes(b"\x7fELF" + b"\0" * 5000 + b"NCCL version %s\0" + b"x" * 3000
                     + f"NCCL version {version}\0".encode() + b"\0" * 2000)


@pytest.mark.parametrize("block", [1 << 22, 64, 13, 7])
def test_probe_reads_the_nccl_version_across_block_edges(tmp_path, block):
    lib = tmp_path / "libnccl.so.2.30.7"
    fake_nccl(lib)
    assert probe_module().nccl_version_text(str(lib), block) == "NCCL version 2.30.7+cuda13.0"
    plain = tmp_path / "plain"
    plain.write_bytes(b"NCCL version %s\0" * 10)
    assert probe_module().nccl_version_text(str(plain), block) is None


def test_probe_finds_the_host_nccl_behind_its_soname_link(tmp_path):
    write_spark_sysfs(tmp_path / "sysfs", {})
    real = tmp_path / "libnccl.so.2.30.7"
    fake_nccl(real)
    (tmp_path / "libnccl.so.2").symlink_to(real.name)
    found = facts.parse_facts(run_probe(facts.probe_args(str(tmp_path / "sysfs"), nccl_lib=str(tmp_path / "libnccl.so.2"))))
    assert found.nccl_lib == NcclLib(str(tmp_path / "libnccl.so.2"), True, str(real), real.stat().st_size,
                                           "2.30.7+cuda13.0")
    gone = facts.parse_facts(run_probe(facts.probe_args(str(tmp_path / "sysfs"), nccl_lib=str(tmp_path / "nope.so"))))
    assert not gone.nccl_lib.present and gone.nccl_lib.problem == f"{tmp_path / 'nope.so'}: no such file"
    assert facts.parse_facts(run_probe(facts.probe_args(str(tmp_path / "sysfs")))).nccl_lib is None


def test_probe_reports_where_its_ssh_session_arrived(tmp_path):
    write_spark_sysfs(tmp_path / "sysfs", {})
    raw = run_probe(facts.probe_args(str(tmp_path / "sysfs")), env={"SSH_CONNECTION": "10.0.0.2 51234 10.0.0.13 22"})
    assert facts.parse_facts(raw).ssh_address == "10.0.0.13"
    assert raw["route"] is None or raw["route"].startswith("Iface")


def test_probe_reads_the_drift_sources(tmp_path):
    """The probe on a sandbox rank's fixture tree: each HCA's fw_ver, the page size; a CDI spec at
    a given path (the real nvidia-ctk output of tests/facts_cases) read and parsed; no driver here."""
    from launcher.sandbox import fabric_fixture as sfabric

    sfabric.write_tree(tmp_path / "sysfs", sfabric.sysfs_tree(1))
    spec = json.loads((Path(__file__).parent / "facts_cases" / "cdi_specs_generated.json").read_text())
    (tmp_path / "nvidia.yaml").write_text(spec["raw"]["raw"]["/etc/cdi/nvidia.yaml"])
    args = dict(facts.probe_args(str(tmp_path / "sysfs")), cdi_specs=[str(tmp_path / "nvidia.yaml"), str(tmp_path / "none.yaml")])
    (tmp_path / "ip-addr.json").write_text("[]")
    f = facts.parse_facts(run_probe(args))
    assert f.fw_versions == (sfabric.FW_VER,) and all(d.fw_ver == sfabric.FW_VER for d in f.rdma)
    assert f.page_size == os.sysconf("SC_PAGE_SIZE")
    assert f.cdi_specs == (CdiSpec(str(tmp_path / "nvidia.yaml"), "570.133.20"),)
    if shutil.which("nvidia-smi") is None:
        assert f.driver is None and f.gpu_clocks is None


def test_the_probe_reads_the_gpu_clock_record_where_prep_writes_it():
    from launcher.inputs import node_settings
    from launcher.onrank import probe

    assert probe.GPU_CLOCK_FILE == node_settings.GPU_CLOCK_FILE


# --- a sandbox rank declares its stand-in hardware; a Spark declares nothing -------------------

def load_probe_module():
    spec = importlib.util.spec_from_file_location("probe_script", Path(facts.__file__).parents[1] / "onrank" / "probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_reads_a_ranks_declared_hardware_unless_the_kit_names_a_root(tmp_path):
    probe_script = load_probe_module()
    declared = tmp_path / "hardware.json"
    assert probe_script.declared_hardware({"sysfs_root": "/"}, declared) == {"sysfs_root": "/"}  # a Spark
    declared.write_text(json.dumps({"sysfs_root": "/sandbox/sysfs", "ip_addr_file": "/sandbox/ip-addr.json",
                                    "mount_table": "/sandbox/mountinfo", "rm": "-rf /"}))
    assert probe_script.declared_hardware({"sysfs_root": "/", "timeout_s": 5}, declared) == {
        "sysfs_root": "/sandbox/sysfs", "ip_addr_file": "/sandbox/ip-addr.json",
        "mount_table": "/sandbox/mountinfo", "timeout_s": 5}
    named = {"sysfs_root": "/elsewhere/sysfs"}
    assert probe_script.declared_hardware(named, declared) == named  # the kit's own root wins
    declared.write_text("[not, json")
    assert probe_script.declared_hardware({"sysfs_root": "/"}, declared) == {"sysfs_root": "/"}


def test_init_takes_the_root_only_when_every_rank_declares_the_same_one():
    from launcher.init.bringup import Answers, declared_sysfs_root

    a = Answers(user="spark", key=Path("k"), known_hosts=Path("kh"), profile="sandbox", model_path="/m",
                output=Path("c.yaml"))
    from types import SimpleNamespace

    ranks = lambda *roots: {i: SimpleNamespace(sysfs_root=r) for i, r in enumerate(roots)}  # noqa: E731
    assert declared_sysfs_root(ranks("/sandbox/sysfs", "/sandbox/sysfs"), a) == "/sandbox/sysfs"
    assert declared_sysfs_root(ranks("/", "/"), a) is None
    assert declared_sysfs_root(ranks("/sandbox/sysfs", "/"), a) is None  # mixed: nothing assumed
    assert declared_sysfs_root(ranks("/sandbox/sysfs"), dataclasses.replace(a, sysfs_root="/x")) is None
