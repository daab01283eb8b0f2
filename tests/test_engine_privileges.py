"""The serving container's privileges (issue 33): `--security-opt no-new-privileges` and no
capabilities (`--cap-drop ALL`) unless the config says otherwise (container.no_new_privileges,
container.capabilities); what RDMA and CUDA IPC need stays (the devices, memlock, --ipc host)."""

from __future__ import annotations

import pytest

from launcher.inputs import config
from launcher.inputs.profile import profile_names
from test_plan import plan_json


def options(argv: list[str]) -> list[tuple[str, str]]:
    return [(a, argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in ("--security-opt", "--cap-drop", "--cap-add")]


@pytest.mark.parametrize("profile", profile_names())
def test_every_engine_runs_without_new_privileges_or_capabilities(write_config, profile):
    for rank in plan_json(write_config(lambda d: d.update(profile=profile)))["ranks"]:
        argv = rank["docker_run"]
        assert options(argv) == [("--security-opt", "no-new-privileges"), ("--cap-drop", "ALL")], argv
        # what RDMA and CUDA IPC need is still there
        assert ("--ipc", "host") in zip(argv, argv[1:]) and ("--device", "/dev/infiniband") in zip(argv, argv[1:])
        assert "memlock=-1:-1" in argv


def test_the_config_gives_capabilities_back_or_turns_it_off(write_config):
    some = plan_json(write_config(lambda d: d.setdefault("container", {}).update(capabilities=["sys_nice", "CAP_IPC_LOCK"])))
    assert options(some["ranks"][0]["docker_run"]) == [
        ("--security-opt", "no-new-privileges"), ("--cap-drop", "ALL"), ("--cap-add", "SYS_NICE"),
        ("--cap-add", "IPC_LOCK")]
    off = plan_json(write_config(lambda d: d.setdefault("container", {}).update(no_new_privileges=False,
                                                                                 capabilities=None)))
    assert options(off["ranks"][0]["docker_run"]) == []


@pytest.mark.parametrize("bad", ["ALL", "SYS ADMIN", "--privileged", "", "cap_"])
def test_a_capability_that_is_no_name_is_refused(write_config, bad):
    path = write_config(lambda d: d.setdefault("container", {}).update(capabilities=[bad]))
    with pytest.raises(config.ConfigError, match=r"container\.capabilities\[0\]: "):
        config.load(path)
