"""One rank's probe output in a shape the probe never prints (wrong types, extra fields, extra
lines) must fail that rank with a message naming it and the part, and leave the other ranks'
facts alone (issue #19). Real-format outputs (the probe run on a sandbox rank's fixture tree, and
one assembled from tests/facts_cases) are mutated at every path; each result must either parse
into Facts of the declared types that `check`, the plan and `prep` then use without failing, or
be refused with a FactError."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from local_probe import sandbox_rank_facts, sandbox_rank_raw
from launcher.check import report as check
from planned import build_plan
from launcher.facts import record as facts
from launcher.gather import extras, here, probe as gather
from launcher.gather.value import Gathered
from launcher.inputs import apikey
from launcher.plan import cluster_plan as plan
from launcher.apply import prep
from launcher.facts.parts import FactError
from launcher.transport.remote import Result, Target

CASES = Path(__file__).parent / "facts_cases"

# facts_cases file -> {its raw argument: where that part sits in the probe's output}
PARTS = {
    "meminfo_gb10_caches_dropped": {"text": ("meminfo",)},
    "sysctls": {"raw": ("sysctls",)},
    "rlimits_login_shell": {"raw": ("rlimits",)},
    "docker_ulimits_default_ulimits": {"daemon_json": ("docker_daemon_json",), "dockerd_limits": ("dockerd_limits",)},
    "interfaces_ring_fabric_ip_on_second_port": {"ip_addr": ("commands", "ip_addr"), "sysfs_net": ("sysfs_net",),
                                                 "ip_addr_file": ("ip_addr_file",)},
    "rdma_gid_tables": {"sysfs_infiniband": ("sysfs_infiniband",)},
    "docker_images_with_labels": {"version": ("commands", "docker_version"), "images": ("commands", "docker_images"),
                                  "inspect": ("commands", "docker_inspect"), "root_dir": ("disk_docker_root",),
                                  "disk": ("disk",)},
    "mounts_nfs_checkpoint": {"findmnt": ("commands", "findmnt")},
    "checkpoint_fingerprint": {"raw": ("checkpoint",)},
    "gpu_gb10_memory_na": {"nvidia_smi": ("commands", "nvidia_smi")},
    "clock_offset": {"raw": ("clock",)},
    "nccl_lib_host_build": {"raw": ("nccl_lib",)},
    "default_route_two_defaults": {"text": ("route",)},
    "ssh_connection": {"text": ("ssh_connection",)},
    "driver_legacy_module_line": {"nvidia_smi_clocks": ("commands", "nvidia_smi_clocks"),
                                  "proc_version": ("nvidia_driver_proc",)},
    "gpu_clocks_locked": {"lock_file": ("gpu_clock_file",)},
    "cdi_specs_generated": {"raw": ("cdi_specs",)},
    "nvidia_ctk_version": {"result": ("commands", "nvidia_ctk")},
    "page_size_64k": {"raw": ("page_size",)},
}
DOCKER_API = {"api": ("docker_api",)}  # docker_api_images_with_labels: the socket instead of the CLI


def assembled(parts: dict) -> dict:
    raw = {"probe_version": facts.PROBE_VERSION, "hostname": "spark1", "kernel": "6.11.0-1016-nvidia",
           "commands": {}}
    for case, where in parts.items():
        given = json.loads((CASES / f"{case}.json").read_text())["raw"]
        for arg, path in where.items():
            node = raw
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = given[arg]
    return raw


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, dict]:
    with_api = assembled(PARTS)
    with_api["docker_api"] = json.loads((CASES / "docker_api_images_with_labels.json").read_text())["raw"]["api"]
    return {"probe on a sandbox rank": sandbox_rank_raw(tmp_path_factory.mktemp("spark1"), 0),
            "facts_cases, docker CLI": trimmed(assembled(PARTS)), "facts_cases, docker API": trimmed(with_api)}


WRONG = [None, 7, "x", [], {"x": 1}, float("inf"), True]  # null, and each for another type


# objects keyed by data (interface, HCA, GID slot, sysctl, path, label names): the first two stand
# for the rest
MAPS = {"sysfs_net", "sysfs_infiniband", "ports", "gids", "gid_types", "gid_ndevs", "sysctls", "disk", "Labels",
        "cdi_specs"}


def embedded(text: str):
    """JSON (or JSON lines, as `docker image inspect --format '{{json .}}'` prints) inside a
    command's output: (value, how to write it back), or None."""
    try:
        return json.loads(text), json.dumps
    except ValueError:
        pass
    try:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        return None
    return (lines, lambda value: "".join(json.dumps(v) + "\n" for v in value)
            if isinstance(value, list) else json.dumps(value)) if lines else None


def trimmed(node, key=None):
    """`node` with only the first two entries of each object in MAPS (what the mutations reach)."""
    if isinstance(node, dict):
        kept = list(node.items())[:2] if key in MAPS else node.items()
        return {k: trimmed(v, k) for k, v in kept}
    return [trimmed(v) for v in node] if isinstance(node, list) else node


def mutations(node, where: str = ""):
    """(what, a copy of `node` with one change): each value replaced by each wrong one, an extra
    field in every object, an extra line (with a tab) after every string, and the same inside the
    JSON a command printed."""
    yield from ((f"{where} = {w!r}", w) for w in WRONG)
    if isinstance(node, dict):
        yield f"{where} + field", {**node, "unexpected": ["x"]}
    if isinstance(node, str):
        yield f"{where} + line", node + "\nextra\tline {}\n"
        inner = embedded(node)
        if inner is not None and isinstance(inner[0], (dict, list)):
            value, write = inner
            yield from ((what, write(new)) for what, new in mutations(value, f"{where} (its JSON)"))
    children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))[:2] if isinstance(node, list) else []
    for key, child in children:
        for what, new in mutations(child, f"{where}/{key}"):
            changed = copy.copy(node)
            changed[key] = new
            yield what, changed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from test_check import sandbox_cluster

    return sandbox_cluster(tmp_path_factory.mktemp("cfg"))


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """Ranks 1..3 of the sandbox, healthy."""
    return {r: sandbox_rank_facts(tmp_path_factory.mktemp(f"spark{r + 1}"), r) for r in (1, 2, 3)}


def use(loaded, f: facts.Facts, others: dict) -> None:
    """What `check`, `plan` and `prep` do with a rank's facts, rank 0 being `f`."""
    by_rank = {0: f, **others}
    ranks = {r: gather.RankFacts(r, f"spark{r + 1}", x, None, 0.1) for r, x in by_rank.items()}
    inp = Gathered(loaded, ranks, here.read_model(loaded), "sandbox-vllm:latest", apikey.resolve(loaded))
    inp.targets = extras.ping_targets(loaded, inp.facts)
    check.evaluate(inp)
    build_plan(loaded, by_rank)
    prep.plan_rank(loaded, 0, f)


@pytest.mark.parametrize("name, part", [("facts_cases, docker CLI", None), ("facts_cases, docker API", "docker_api")])
def test_every_mutation_is_parsed_and_used_or_refused(outputs, cluster, others, name, part):
    """`part`: only that part is mutated (the rest is as in the case before)."""
    whole = outputs[name]
    use(cluster, facts.parse_facts(whole), others)  # the unmutated output is fine
    changed = ((w, {**whole, part: new}) for w, new in mutations(whole[part], f"/{part}")) if part else mutations(whole)
    refused, used = 0, set()
    for what, raw in changed:
        try:
            parsed = facts.parse_facts(raw)
        except FactError as e:
            assert str(e), what
            refused += 1
            continue
        seen = json.dumps(parsed.to_json(), sort_keys=True)
        if seen in used:  # the same facts as another mutation gave: used once
            continue
        used.add(seen)
        try:
            use(cluster, parsed, others)
        except plan.PlanRefused:  # e.g. a rank's memory that cannot hold the model: the plan says so
            pass
        except Exception as e:  # noqa: BLE001 -- the point: nothing else may escape
            raise AssertionError(f"{name}: {what}: {type(e).__name__}: {e}") from e
    assert refused > 0


@pytest.mark.parametrize("change, named", [
    (lambda raw: raw["commands"]["docker_inspect"].update(stdout='{"Id": ["not", "an", "id"]}\n'),
     "docker: output of an unexpected shape (TypeError: unhashable type: 'list')"),
    (lambda raw: raw["disk"]["/var/lib/docker"].update(avail="lots"),
     "docker: docker.storage_avail is 'lots', expected int"),
    (lambda raw: raw.update(clock={"started": "noon"}), "clock: clock.remote_started is 'noon', expected float"),
    (lambda raw: raw["commands"].update(ip_addr={"rc": 0, "stdout": json.dumps([{"ifname": "eth0", "addr_info": [
        {"family": "inet", "local": "10.0.0.300", "prefixlen": 24}]}])}),
     "interfaces: eth0: '10.0.0.300/24' is not an IPv4 address with its prefix length"),
    (lambda raw: raw["rlimits"].update(nofile="unlimited"), "rlimits: output of an unexpected shape (ValueError: "),
    (lambda raw: raw.update(commands=[]), "commands: expected an object"),
])
def test_the_rank_fails_naming_the_part_and_the_others_stay(outputs, cluster, change, named):
    """gather.probe_rank on each rank's answer: the odd one is that rank's error, named."""
    good = outputs["facts_cases, docker CLI"]
    bad = copy.deepcopy(good)
    change(bad)
    answers = {0: good, 1: bad, 2: good}

    class Answers:  # a connection that answers the probe with the output given for its rank
        def __init__(self, r):
            self.target = Target(r, f"spark{r + 1}", f"10.0.0.{11 + r}")

        def run(self, command, stdin=None, timeout=None):
            return Result(self.target, 0, json.dumps(answers[self.target.rank]))

    found = {r: gather.probe_rank(Answers(r), cluster) for r in answers}
    assert found[0].ok and found[2].ok
    assert not found[1].ok and found[1].error.startswith("rank 1 (spark2): the probe's output cannot be used: ")
    assert named in found[1].error


def test_a_memtotal_of_zero_is_a_problem_not_a_division(outputs, cluster, others):
    raw = copy.deepcopy(outputs["facts_cases, docker CLI"])
    raw["meminfo"] = "MemTotal: 0 kB\nMemAvailable: 0 kB\n"
    parsed = facts.parse_facts(raw)
    assert parsed.memory is None and "/proc/meminfo: MemTotal is 0" in parsed.problems
    use(cluster, parsed, others)
