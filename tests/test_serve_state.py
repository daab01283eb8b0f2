"""serve's reading of each rank's `docker inspect` line (serve._INSPECT): output of another shape
(extra lines, extra fields, wrong types) is that rank's `unknown` state, named, never an exception
that hides the other ranks (issue #19)."""

import json

import pytest

from launcher.apply import serve
from launcher.transport.remote import Result, Target

RANK = Target(2, "spark3", "10.0.0.13")
STATE = {"Status": "running", "Running": True, "OOMKilled": False, "ExitCode": 0,
         "StartedAt": "2026-11-30T21:04:05.123456789Z"}


def inspect_line(state=STATE, label="0123456789abcdef", image="sparkstack/keys:3f2a9c1b7e4d",
                 profile="keys-1m-dcp4", cluster="lab") -> str:
    return f"{json.dumps(state)}\t{label}\t{image}\t{profile}\t{cluster}\n"


def read(stdout: str) -> serve.RankState:
    return serve._parse_state(Result(RANK, 0, stdout))


def test_a_running_container():
    s = read(inspect_line())
    assert (s.state, s.exit_code, s.plan_hash, s.image) == ("running", 0, "0123456789abcdef", "sparkstack/keys:3f2a9c1b7e4d")
    assert (s.profile, s.cluster) == ("keys-1m-dcp4", "lab")


def test_a_container_without_the_newer_labels():
    s = read(inspect_line(profile="", cluster=""))
    assert s.state == "running" and (s.profile, s.cluster) == (None, None)


def test_a_banner_before_the_line():
    assert read("Welcome to DGX OS\n\n" + inspect_line()).state == "running"


@pytest.mark.parametrize("stdout", [
    inspect_line() + "WARNING: something else\n",       # a line after ours
    inspect_line().replace("\tsparkstack", "\textra\tsparkstack"),  # a field more
    inspect_line(label="").replace("\t\t", "\t"),       # a field less
    inspect_line({"Status": 5}),                         # wrong types
    inspect_line({**STATE, "ExitCode": "0"}),
    inspect_line([1, 2]),                                # not an object
    "{not json\tx\ty\n",
    "",
])
def test_output_of_another_shape_is_that_ranks_unknown_state(stdout):
    s = read(stdout)
    assert s.state == "unknown"
    assert s.describe().startswith("rank 2 (spark3): `docker inspect` printed ")


def test_the_probe_reads_the_serving_container_as_inspect_does():
    """The probe's `container` part (Engine API or CLI): the same state `docker inspect` gives."""
    from launcher.facts import remote as rank_facts
    from launcher.facts.parts import FactError

    body = json.dumps({"Id": "c0ffee", "State": {"Status": "running", "ExitCode": 0, "OOMKilled": False,
                                                  "StartedAt": "2026-12-02T01:00:00Z"},
                        "Config": {"Image": "sparkstack/serve:abc", "Labels": {"org.sparkstack.plan": "h1",
                                                                               "org.sparkstack.cluster": "c"}}})
    found = rank_facts.parse_probed_container({"api": {"status": 200, "body": body}}, "org.sparkstack.plan",
                                              ("org.sparkstack.profile", "org.sparkstack.cluster"))
    assert (found.status, found.label, found.image, found.extra, found.id) == (
        "running", "h1", "sparkstack/serve:abc", (None, "c"), "c0ffee")
    cli_found = rank_facts.parse_probed_container({"cli": {"rc": 0, "stdout": body + "\n"}}, "org.sparkstack.plan")
    assert (cli_found.status, cli_found.label, cli_found.id) == ("running", "h1", "c0ffee")
    assert rank_facts.parse_probed_container({"api": {"status": 404, "body": "{}"}}, "x") is None
    assert rank_facts.parse_probed_container(
        {"cli": {"rc": 1, "stdout": "", "stderr": "Error: No such object: sparkstack-engine\n"}}, "x") is None
    with pytest.raises(FactError, match="Cannot connect"):
        rank_facts.parse_probed_container({"cli": {"rc": 1, "stderr": "Cannot connect to the Docker daemon"}}, "x")
    with pytest.raises(FactError, match="not Docker's"):
        rank_facts.parse_probed_container({"api": {"status": 200, "body": "[]"}}, "x")
