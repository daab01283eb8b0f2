"""`check`'s failure branches as a user meets them: each row's verdict, its value, the fix, the
rank named in the table, and `check`'s exit code (0: nothing failed, 1: a row failed).

The facts come from the real formats: a probe's output (the real probe run here on a sandbox
rank's fixture tree) with one part replaced by a tests/facts_cases raw part, parsed by the real
`facts.parse_facts`, so each row sees the `problems` line a rank really gives. The CLI is then
run on those facts (preflight.run returns their report instead of probing the ranks): its table, its
lines per non-pass row, its exit code. One test puts real sandbox ranks in such states.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from local_probe import sandbox_rank_raw
from test_check import fabric_facts, inputs, row, sandbox_cluster, sandbox_config, with_container  # noqa: F401
from launcher.apply import preflight
from launcher.check import report as check
from launcher.status import Finding
from launcher.facts import record as facts
from launcher.cli.commands import main
from launcher.facts.clock import Clock, parse_clock
from launcher.facts.docker import Docker, Image
from launcher.facts.kernel import parse_sysctls
from launcher.facts.memory import Memory, parse_meminfo

GIB = 1 << 30
CASES = Path(__file__).parent / "facts_cases"
MODEL = "/models/glm53-sandbox"


def case(name: str) -> dict:
    return json.loads((CASES / f"{name}.json").read_text())["raw"]


@pytest.fixture(scope="module")
def probe_raw(tmp_path_factory) -> dict:
    """The probe's real output for sandbox rank 2 (spark3), run here on its fixture tree."""
    return sandbox_rank_raw(tmp_path_factory.mktemp("spark3"), 2)


def probed(raw: dict, *, commands: dict | None = None, **parts) -> facts.Facts:
    """`raw` with probe output parts (and commands) replaced, parsed as gather parses a rank's."""
    raw = copy.deepcopy(raw)
    raw["commands"].update(commands or {})
    raw.update(parts)
    return facts.parse_facts(raw, sent=raw["clock"]["started"], received=raw["clock"]["finished"])


def cli_check(monkeypatch, inp):
    """`sparkstack check` on these facts: its output and exit code."""
    monkeypatch.setattr(preflight, "run", lambda loaded, **kw: check.evaluate(inp))
    result = CliRunner().invoke(main, ["check", "-c", str(inp.loaded.path)])
    assert "Traceback" not in result.output, result.output
    return result


def said(result, status: str, rank: int, host: str, name: str, value: str, fix: str | None) -> None:
    """The CLI's lines for one non-pass row: `STATUS rank R HOST NAME: VALUE` and `fix: FIX`."""
    lines = result.output.splitlines()
    at = lines.index(f"{status} rank {rank} {host} {name}: {value}")
    if fix:
        assert lines[at + 1] == f"     fix: {fix}", lines[at:at + 2]


def table_cells(result, name: str) -> list[str]:
    """The table's cells for check `name`, one per rank."""
    line = next(x for x in result.output.splitlines() if re.match(rf"{re.escape(name)}\s{{2,}}", x))
    return line[len(name):].split()


# --- docker ---------------------------------------------------------------------------------

DOCKER_FIX = "sudo systemctl start docker; and the SSH user must be in the docker group"


def docker_cli(name: str) -> dict:
    raw = case(name)
    return {"docker_version": raw["version"], "docker_images": raw["images"], "docker_inspect": raw["inspect"]}


@pytest.mark.parametrize("commands, api, value, fix", [
    (docker_cli("docker_missing"), None, "docker CLI not installed",
     "install Docker (DGX OS ships it): apt install docker.io"),
    (docker_cli("docker_daemon_down"), None, "docker: exit 1: Cannot connect to the Docker daemon at "
     "unix:///var/run/docker.sock. Is the docker daemon running?", DOCKER_FIX),
    ({}, case("docker_api_daemon_down")["api"], "docker: the daemon does not answer (/version on "
     "/var/run/docker.sock: ConnectionRefusedError: Connection refused)", DOCKER_FIX),
], ids=["cli-missing", "daemon-down-cli", "daemon-down-socket"])
def test_docker_missing_or_not_running_fails_naming_the_rank(monkeypatch, sandbox_config, fabric_facts,
                                                            probe_raw, commands, api, value, fix):
    """No Docker on spark3, or its daemon not running: its docker row fails with the cause and
    the fix, the image row cannot ask; check exits 1."""
    f = probed(probe_raw, commands=commands, docker_api=api)
    inp = inputs(sandbox_config, fabric_facts, {2: {"docker": f.docker, "problems": f.problems}})
    report = check.evaluate(inp)
    assert row(report, 2, "docker") == Finding("docker", "fail", value, fix)
    assert row(report, 2, "image").value.endswith(": cannot ask (no Docker)")
    if f.docker is None:  # no CLI, no socket: nothing says where its storage is
        assert row(report, 2, "disk") == Finding("disk", "warn", "Docker's storage not readable",
                                                   "fix the docker row first")
    assert {row(report, r, "docker").status for r in (0, 1, 3)} == {"pass"}
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == 1
    assert table_cells(result, "docker") == ["pass", "pass", "FAIL", "pass"]
    said(result, "FAIL", 2, "spark3", "docker", value, fix)
    assert result.output.splitlines()[-1].startswith("not ready (")


# --- gpu ----------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus, smi, status, value", [
    ("all", "gpu_gb10_memory_na", "pass", "NVIDIA GB10, driver 580.95.05"),
    (None, "gpu_gb10_memory_na", "pass", "not required by config (container.gpus: null); nvidia-smi "
     "shows NVIDIA GB10"),
    ("all", "gpu_driver_not_loaded", "fail", "nvidia-smi: exit 9: NVIDIA-SMI has failed because it "
     "couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is "
     "installed and running."),
], ids=["required-present", "not-required-present", "required-driver-not-loaded"])
def test_gpu_row_with_a_gpu_there_or_its_driver_not_loaded(monkeypatch, sandbox_config, fabric_facts,
                                                           probe_raw, gpus, smi, status, value):
    """A GB10 that nvidia-smi lists passes (required or not); nvidia-smi failing for want of
    its driver fails the rank, with nvidia-smi's own words (it prints them on stdout)."""
    loaded = with_container(sandbox_config, gpus=gpus)
    f = probed(probe_raw, commands={"nvidia_smi": case(smi)["nvidia_smi"]})
    gb10 = probed(probe_raw, commands={"nvidia_smi": case("gpu_gb10_memory_na")["nvidia_smi"]})
    overrides = {r: {"gpu": gb10.gpu, "problems": gb10.problems} for r in range(4)}
    overrides[2] = {"gpu": f.gpu, "problems": f.problems}
    inp = inputs(loaded, fabric_facts, overrides)
    got = row(check.evaluate(inp), 2, "gpu")
    assert (got.status, got.value) == (status, value)
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == (0 if status == "pass" else 1), result.output
    if status == "fail":
        said(result, "FAIL", 2, "spark3", "gpu", value, "install the NVIDIA driver and container "
             "toolkit (DGX OS ships them); `nvidia-smi` must list the GB10")


# --- drift: the driver after an upgrade on one rank, and its stale CDI spec -------------------

def test_a_driver_upgrade_on_one_rank_fails_its_driver_and_cdi_rows(monkeypatch, sandbox_config, fabric_facts,
                                                                    probe_raw):
    """spark3 got driver 455.45.01's successor by itself: its nvidia-smi header (the real
    `nvidia-smi -q -d CLOCK` case) names another driver than the other ranks', and the CDI spec
    nvidia-ctk generated before (the real spec of the cdi_specs_generated case, for 570.133.20)
    is stale. The table fails spark3 in both rows; the lines name it, the others' driver and the fix."""
    smi = case("driver_nvidia_smi_q_clock")["nvidia_smi_clocks"]
    spec = case("cdi_specs_generated")["raw"]
    f = probed(probe_raw, commands={"nvidia_smi_clocks": smi}, cdi_specs=spec)
    assert (f.driver.version, f.driver.cuda) == ("455.45.01", "11.1")
    inp = inputs(sandbox_config, fabric_facts, {2: {"driver": f.driver, "cdi_specs": f.cdi_specs,
                                                    "gpu_clocks": f.gpu_clocks}})
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == 1
    assert table_cells(result, "driver") == ["pass", "pass", "FAIL", "pass"]
    said(result, "FAIL", 2, "spark3", "driver", "455.45.01 (CUDA 11.1): rank 2 has 455.45.01 (CUDA 11.1); "
         "ranks 0, 1, 3 have 580.95.05 (CUDA 13.0)", None)
    said(result, "FAIL", 2, "spark3", "nvidia runtime", "stale CDI spec: /etc/cdi/nvidia.yaml names driver "
         "570.133.20, the rank runs 455.45.01", "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    assert row(check.evaluate(inp), 2, "gpu clock").value == "the driver's (no lock); now 139 of max 1911 MHz"


# --- swap, sysctls --------------------------------------------------------------------------

def gb10_meminfo(swap_total_kb: int, swap_free_kb: int) -> Memory:
    """The GB10 (caches dropped) meminfo of facts_cases, with its swap lines set."""
    text = case("meminfo_gb10_caches_dropped")["text"]
    text = re.sub(r"SwapTotal:\s+\d+", f"SwapTotal: {swap_total_kb:>15}", text)
    text = re.sub(r"SwapFree:\s+\d+", f"SwapFree: {swap_free_kb:>16}", text)
    return parse_meminfo(text)


@pytest.mark.parametrize("free_kb, status, value", [
    (12 << 20, "warn", "4.0 GiB of 16.0 GiB swapped out: memory was squeezed"),
    ((16 << 20) - (100 << 10), "pass", "16.0 GiB, 0.1 GiB used"),
], ids=["swapped-out", "little-used"])
def test_swap_on_warns_when_memory_was_squeezed(monkeypatch, sandbox_config, fabric_facts, free_kb,
                                                 status, value):
    """Swap configured on spark2: more than 256 MiB in use warns (check still exits 0)."""
    inp = inputs(sandbox_config, fabric_facts, {1: {"memory": gb10_meminfo(16 << 20, free_kb)}})
    assert (row(check.evaluate(inp), 1, "swap").status, row(check.evaluate(inp), 1, "swap").value) == (status, value)
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == 0, result.output
    assert table_cells(result, "swap") == ["pass", "WARN" if status == "warn" else "pass", "pass", "pass"]
    if status == "warn":
        said(result, "WARN", 1, "spark2", "swap", value, "find what pushed it out (`ps aux --sort=-rss`); "
             "`sudo swapoff -a && sudo swapon -a` empties it")


def test_free_while_serving_from_each_ranks_measured_memory(monkeypatch, tmp_path, fabric_facts):
    """`plan` expects free memory from offline figures; `check` reckons it from each rank's
    measured MemAvailable: spark3 has 20 GiB less than the others, and with the pool taking all
    that fits beside a 4 GiB headroom it would keep 4 GiB free while serving, below the 8 GiB
    floor: that rank fails with the fix, the others (24 GiB more free) pass."""
    gib_ = 1 << 30
    loaded = sandbox_cluster(tmp_path, overrides={"kv_policy": "max", "headroom_gib": 4})
    low = Memory(127_600_000 * 1024, 98 * gib_, 90 * gib_, 1 * gib_, 0, 0, 0)
    inp = inputs(loaded, fabric_facts, {2: {"memory": low}})
    report = check.evaluate(inp)
    kv_bytes = check.Case(inp).kv().kv_cache_memory_bytes
    assert kv_bytes == (98 * gib_ - int(0.01 * gib_) - 14 * gib_ - 4 * gib_) // (1 << 20) * (1 << 20)
    failed = row(report, 2, "free while serving")
    assert failed.status == "fail" and failed.value.startswith("4.0 GiB = MemAvailable 98.0 GiB − weights ")
    assert failed.value.endswith("(max) < overrides.free_floor_gib 8.0 GiB")
    for r in (0, 1, 3):
        ok = row(report, r, "free while serving")
        avail = inp.facts[r].memory.available
        assert ok.status == "pass" and ok.value.startswith(f"{(avail - 98 * gib_ + 4 * gib_) / gib_:.1f} GiB = "
                                                           f"MemAvailable {avail / gib_:.1f} GiB")
    result = cli_check(monkeypatch, inp)
    assert result.exit_code != 0, result.output
    assert table_cells(result, "free while serving") == ["pass", "pass", "FAIL", "pass"]
    said(result, "FAIL", 2, "spark3", "free while serving", failed.value, failed.fix)
    assert "overrides.headroom_gib (4) at least the floor" in failed.fix


def test_swap_on_fails_when_the_config_says_no_swap(monkeypatch, tmp_path, fabric_facts):
    """overrides.no_swap (or a seed-001 profile's no_swap): any swap on a rank fails it, even
    unused, with `prep` as the fix; a rank without swap passes."""
    loaded = sandbox_cluster(tmp_path, overrides={"no_swap": True})
    inp = inputs(loaded, fabric_facts, {2: {"memory": gb10_meminfo(16 << 20, 16 << 20)}})
    value = "16.0 GiB on (0.0 GiB used); overrides.no_swap says no swap"
    assert (row(check.evaluate(inp), 2, "swap").status, row(check.evaluate(inp), 2, "swap").value) == ("fail", value)
    result = cli_check(monkeypatch, inp)
    assert result.exit_code != 0, result.output
    assert table_cells(result, "swap") == ["pass", "pass", "FAIL", "pass"]
    said(result, "FAIL", 2, "spark3", "swap", value, "`sparkstack prep` turns it off (swapoff -a, swap "
         "lines of /etc/fstab commented out), or the Ansible role spark_node")


def test_wrong_and_absent_sysctls_warn_with_prep_as_the_fix(monkeypatch, tmp_path, fabric_facts):
    """A freshly booted rank (facts_cases/sysctls.json: swappiness 60, compaction 20) and a
    sysctl the config asks for that its kernel lacks: one warn naming each, check exits 0."""
    loaded = sandbox_cluster(tmp_path, overrides={"sysctls": {"vm.not_in_this_kernel": 1}})
    booted = parse_sysctls(**case("sysctls"))
    inp = inputs(loaded, fabric_facts, {3: {"sysctls": booted}})
    for r in range(3):  # the healthy ranks have the config's extra one
        inp.ranks[r].facts.sysctls["vm.not_in_this_kernel"] = "1"
    value = ("vm.compaction_proactiveness=20 (want 0), vm.not_in_this_kernel=absent (want 1), "
             "vm.swappiness=60 (want 1)")
    assert row(check.evaluate(inp), 3, "sysctls") == Finding(
        "sysctls", "warn", value, "sparkstack prep (and the Ansible role for after reboots)")
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == 0, result.output
    assert table_cells(result, "sysctls") == ["pass", "pass", "pass", "WARN"]
    said(result, "WARN", 3, "spark4", "sysctls", value, "sparkstack prep (and the Ansible role for after reboots)")


# --- checkpoint, disk, clock ----------------------------------------------------------------

def test_checkpoint_dir_missing_fails_with_the_mount_as_the_fix(monkeypatch, sandbox_config, fabric_facts,
                                                                probe_raw):
    """The model dir is not there on spark2 (NFS not mounted: facts_cases/checkpoint_dir_missing)."""
    missing = dict(case("checkpoint_dir_missing")["raw"], dir=MODEL)
    f = probed(probe_raw, checkpoint=missing)
    assert f.checkpoint is None
    inp = inputs(sandbox_config, fabric_facts, {1: {"checkpoint": f.checkpoint, "problems": f.problems}})
    value = f"checkpoint {MODEL}: FileNotFoundError: No such file or directory"
    fix = f"mount the checkpoint at {MODEL} on every rank (sparkstack prep)"
    assert row(check.evaluate(inp), 1, "checkpoint") == Finding("checkpoint", "fail", value, fix)
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == 1
    assert table_cells(result, "checkpoint") == ["pass", "FAIL", "pass", "pass"]
    said(result, "FAIL", 1, "spark2", "checkpoint", value, fix)


def docker_with(free: int, has_image: bool = True) -> Docker:
    """The healthy facts' Docker (the 20 GiB serving image) with `free` bytes left."""
    from test_check import IMAGE, IMAGE_ID

    image = Image(IMAGE_ID, (IMAGE,), {}, 20 * GIB)
    return Docker("20.10", "20.10", "/var/lib/docker", free, 250 * GIB, (image,) if has_image else ())


@pytest.mark.parametrize("free, has_image, status, value, fix, code", [
    (10 * GIB, False, "fail", "/var/lib/docker: 10.0 GiB free, image needs up to 20.0 GiB",
     "free space under /var/lib/docker (`docker image prune`)", 1),
    (30 * GIB, False, "warn", "/var/lib/docker: 30.0 GiB free, image needs up to 20.0 GiB",
     "keep 20.0 GiB free beyond the images (`docker image prune`)", 1),  # the image row fails
    (15 * GIB, True, "warn", "/var/lib/docker: 15.0 GiB free",
     "keep 20.0 GiB free beyond the images (`docker image prune`)", 0),
], ids=["no-room-for-the-image", "room-but-no-margin", "image-there-little-left"])
def test_too_little_disk_fails_or_warns(monkeypatch, sandbox_config, fabric_facts, free, has_image,
                                        status, value, fix, code):
    """spark4's Docker storage: less free than the image it lacks fails; less than 20 GiB
    beyond that warns."""
    inp = inputs(sandbox_config, fabric_facts, {3: {"docker": docker_with(free, has_image)}})
    assert row(check.evaluate(inp), 3, "disk") == Finding("disk", status, value, fix)
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == code, result.output
    assert table_cells(result, "disk") == ["pass", "pass", "pass", "FAIL" if status == "fail" else "WARN"]
    said(result, status.upper(), 3, "spark4", "disk", value, fix)


def test_clock_not_measured_warns(monkeypatch, sandbox_config, fabric_facts):
    """A rank's clock without this host's send/receive times (facts_cases/clock_offset parsed
    alone) cannot be compared: warn "not measured", the other ranks still judged, exit 0."""
    unstamped = parse_clock(**{k: v for k, v in case("clock_offset").items() if k == "raw"})
    assert unstamped.offset is None
    late = Clock(1003.0, 1003.1, 1000.0, 1000.1)
    inp = inputs(sandbox_config, fabric_facts, {0: {"clock": unstamped}})
    report = check.evaluate(inp)
    assert row(report, 0, "clock") == Finding("clock", "warn", "not measured", "re-run check")
    assert [row(report, r, "clock").status for r in (1, 2, 3)] == ["pass"] * 3
    result = cli_check(monkeypatch, inp)
    assert result.exit_code == 0, result.output
    said(result, "WARN", 0, "spark1", "clock", "not measured", "re-run check")
    # the medians leave the unmeasured rank out: a rank 3 s late still fails
    inp = inputs(sandbox_config, fabric_facts, {0: {"clock": unstamped}, 2: {"clock": late}})
    assert row(check.evaluate(inp), 2, "clock").status == "fail"
    assert cli_check(monkeypatch, inp).exit_code == 1


# --- on the sandbox: real ranks put in these states, and put back -----------------------------

def prebuilt_config(sandbox, tmp_path: Path, image: str) -> Path:
    """The sandbox's cluster.yaml on a copy of its profile that serves `image` as it is (no
    chain to build or ship first), so the image row can pass and `check` can exit 0."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    prof = yaml.safe_load((Path(__file__).parents[1] / "env" / "profiles" / "sandbox.yaml").read_text())
    prof["image"] = {"prebuilt": image}
    (profiles / "sandbox-prebuilt.yaml").write_text(yaml.safe_dump(prof))
    doc = yaml.safe_load(Path(sandbox.config).read_text())
    doc.update(profile="sandbox-prebuilt", profiles_dir=str(profiles))
    doc.setdefault("images", {}).pop("base", None)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_swap_sysctl_and_an_unmounted_checkpoint_on_real_ranks(sandbox, tmp_path):
    """spark2 has swapped 2 GiB out, spark3 booted with vm.swappiness=60, spark4's model dir
    has nothing mounted on it (an empty mount point, as when the NFS mount did not come up):
    `sparkstack check` warns for the first two (exit 0), fails the third (exit 1), each line
    naming the rank and the fix. Everything is put back."""
    cfg = prebuilt_config(sandbox, tmp_path, sandbox.images["vllm"])
    from launcher.sandbox import meminfo

    before = {n: sandbox.run(n, "cat /proc/sys/vm/swappiness /proc/sys/vm/compaction_proactiveness")[1].split()
              for n in sandbox.names}
    assert all(len(v) == 2 for v in before.values()), before
    hide = f"sudo mount -t tmpfs -o size=1m,ro sparkstack-test-hidden {MODEL}"
    try:
        for n in sandbox.names:  # the state `prep` leaves, but for spark3's swappiness
            swappiness = 60 if n == "spark3" else 1
            assert sandbox.run(n, f"sudo sysctl -q -w vm.swappiness={swappiness} vm.compaction_proactiveness=0")[0] == 0
        meminfo.set_swap(sandbox.state_dir, "spark2", total=8 << 30, free=6 << 30)
        warned = CliRunner().invoke(main, ["check", "-c", str(cfg)])
        assert warned.exit_code == 0, warned.output
        assert table_cells(warned, "swap") == ["pass", "WARN", "pass", "pass"]
        said(warned, "WARN", 1, "spark2", "swap", "2.0 GiB of 8.0 GiB swapped out: memory was squeezed",
             "find what pushed it out (`ps aux --sort=-rss`); `sudo swapoff -a && sudo swapon -a` empties it")
        assert table_cells(warned, "sysctls") == ["pass", "pass", "WARN", "pass"]
        said(warned, "WARN", 2, "spark3", "sysctls", "vm.swappiness=60 (want 1)",
             "sparkstack prep (and the Ansible role for after reboots)")

        assert sandbox.run("spark4", hide)[0] == 0
        failed = CliRunner().invoke(main, ["check", "-c", str(cfg)])
        assert failed.exit_code == 1, failed.output
        assert table_cells(failed, "checkpoint") == ["pass", "pass", "pass", "FAIL"]
        said(failed, "FAIL", 3, "spark4", "checkpoint", f"no *.safetensors in {MODEL}",
             f"mount the checkpoint at {MODEL} on every rank (sparkstack prep)")
        assert failed.output.splitlines()[-1].startswith("not ready (")
    finally:
        sandbox.run("spark4", f"findmnt -n -o SOURCE {MODEL} | grep -qx sparkstack-test-hidden && sudo umount {MODEL}")
        meminfo.set_swap(sandbox.state_dir, "spark2", total=0, free=0)
        for n, (swappiness, compaction) in before.items():
            sandbox.run(n, f"sudo sysctl -q -w vm.swappiness={swappiness} vm.compaction_proactiveness={compaction}")
    assert sandbox.run("spark4", f"ls {MODEL}")[1].strip(), "the checkpoint is back on spark4"


def test_a_row_is_one_declaration_found_by_the_folder(sandbox_config, fabric_facts):
    """Every module of launcher/check/rows/ declares its rows (name, order, the facts read), and
    the report shows them in their declared order; a row declared anywhere (as a new module there
    would) is judged on every reached rank at its place, with nothing else to touch."""
    from launcher.check import rows
    from launcher.status import Status

    names = [d.name for d in rows.declared()]
    always = tuple(d.name for d in rows.declared() if not d.sometimes)  # staged, engine config: where they apply
    assert always == check.ORDER and check.SHOWN[:len(names)] == tuple(names)
    assert {d.name for d in rows.declared() if d.sometimes} == {"staged", "engine config"}
    assert all(d.reads for d in rows.declared())

    @rows.row("toy", order=255, reads=("kernel",))  # between clock (250) and api key (260)
    def _check_toy(inp, r, f, rr):
        rr.add("toy", Status.PASS, f"kernel {f.kernel}")

    try:
        report = check.evaluate(inputs(sandbox_config, fabric_facts))
        shown = [c.name for c in report.ranks[0].checks]
        assert shown[-3:] == ["clock", "toy", "api key"], shown
        assert [c.name for c in report.ranks[1].checks][-2:] == ["clock", "toy"]  # api key: rank 0's
    finally:
        del rows._DECLARED["toy"]
    with pytest.raises(ValueError, match="order 250 is 'clock'"):
        rows.row("another", order=250, reads=("clock",))(lambda *a: None)
