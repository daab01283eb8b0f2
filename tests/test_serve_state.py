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
