"""Real builds of the image chain on the local Docker engine, over a tiny stand-in base.

The base (launcher/sandbox/chain_fixture.py) is imported (`docker import`, nothing pulled) from
a tarball of a static busybox, a fake site-packages with the files the stages patch, and a
`python3` stand-in that answers the one question the stages ask (where a package is). A couple of MB; made once per session and labelled
org.sparkstack.test=<session id>, which every image built over it inherits (intermediate ones
too); the session removes exactly those at the end. The id also makes the base, and so every tag
over it, this session's own: two test sessions at once never build or remove each other's images.
Image IDs prove what was built and what was not.
"""

from __future__ import annotations

import copy
import io
import json
import tarfile
from pathlib import Path

import docker
import pytest
import yaml
from click.testing import CliRunner

from conftest import example_config
from launcher.images import build as build_mod
from launcher.images import local_docker
from launcher.inputs import config as config_mod
from launcher.images import chain as images
from launcher.cli.commands import main
from launcher.sandbox.chain_fixture import (BUSYBOX, PATCH_FILES, SITE, TEST_REPO, make_test_base,
                                            remove_test_images, session_id, write_patches)

pytestmark = pytest.mark.sandbox  # real builds on the local Docker engine (pyproject.toml's markers)

FOUR = ["dcp", "mul1", "v145", "keys"]


@pytest.fixture(scope="session")
def session():
    return session_id()


@pytest.fixture(scope="session")
def docker_client(session):
    if not BUSYBOX.is_file():
        pytest.skip("needs a static busybox at /bin/busybox (apt-get install busybox-static)")
    try:  # asked through docker-py itself, never the code under test: a bug there must fail
        docker.from_env(timeout=10).ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker engine: {e}")
    client = local_docker.connect(timeout=300)
    client.api.ping()
    yield client
    remove_test_images(client, session)


@pytest.fixture(scope="session")
def test_base(docker_client, session):
    return make_test_base(docker_client, session)


class Spy:
    """Forwards to the real client and records which API methods were called."""

    def __init__(self, client):
        self.client, self.calls = client, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.client, name)


def loaded_for(tmp_path, base: str, patches: Path, chain=FOUR):
    data = copy.deepcopy(example_config())
    data.update(profile="sandbox")
    data["images"] = {"base": base, "patches_dir": str(patches)}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = config_mod.load(path)
    if chain != FOUR:
        image = loaded.profile.image.model_copy(update={"chain": list(chain)})
        loaded = loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"image": image})})
    return loaded, path


def chain_of(client, loaded):
    base = build_mod.ensure_base(client, images.base_name(loaded))
    return images.chain_for(loaded, base.image_id, repository=TEST_REPO)


def by_name(results):
    return {r.name: r for r in results}


def test_full_build_then_noop_then_one_file(docker_client, test_base, tmp_path):
    patches = write_patches(tmp_path / "patches")
    loaded, _ = loaded_for(tmp_path, test_base, patches)

    first = by_name(build_mod.build_chain(docker_client, chain_of(docker_client, loaded)))
    assert [first[n].built for n in FOUR] == [True] * 4
    for r in first.values():
        assert r.image_id == docker_client.api.inspect_image(r.tag)["Id"]

    # unchanged: four image lookups and not one docker-py call (no build, pull or tag)
    spy = Spy(docker_client.api)
    engine = local_docker.LocalDocker(api=spy)
    looked_up = []
    lookup = engine.image_id
    engine.image_id = lambda ref: looked_up.append(ref) or lookup(ref)
    again = by_name(build_mod.build_chain(engine, chain_of(docker_client, loaded)))
    assert spy.calls == [] and len(looked_up) == 4
    assert {n: (r.built, r.image_id) for n, r in again.items()} == \
        {n: (False, first[n].image_id) for n in FOUR}

    # one file of mul1 changes: mul1, v145 and keys are rebuilt, dcp is left alone
    (patches / "exl3.py").write_text(PATCH_FILES["exl3.py"] + "# one more line\n")
    third = by_name(build_mod.build_chain(docker_client, chain_of(docker_client, loaded)))
    assert (third["dcp"].built, third["dcp"].image_id) == (False, first["dcp"].image_id)
    for n in ["mul1", "v145", "keys"]:
        assert third[n].built and third[n].image_id != first[n].image_id
        assert third[n].tag != first[n].tag
    # the earlier images keep their tags: going back costs nothing
    (patches / "exl3.py").write_text(PATCH_FILES["exl3.py"])
    back = by_name(build_mod.build_chain(docker_client, chain_of(docker_client, loaded)))
    assert {n: (r.built, r.image_id) for n, r in back.items()} == \
        {n: (False, first[n].image_id) for n in FOUR}


def run_in(client, image: str, script: str) -> str:
    api = client.api
    container = api.create_container(image, ["/bin/sh", "-c", script])
    try:
        api.start(container)
        api.wait(container, timeout=60)
        return api.logs(container).decode()
    finally:
        api.remove_container(container, force=True)


def test_files_land_and_labels(docker_client, test_base, tmp_path):
    patches = write_patches(tmp_path / "patches")
    loaded, _ = loaded_for(tmp_path, test_base, patches, chain=FOUR + ["keys3"])
    chain = chain_of(docker_client, loaded)
    build_mod.build_chain(docker_client, chain)
    top = chain.stages[-1]
    sp = f"/{SITE}"
    text = run_in(docker_client, top.tag, f"cat {sp}/vllm/v1/attention/backends/mla/sm120_dcp.py "
                  f"{sp}/vllm/model_executor/layers/quantization/exl3.py {sp}/exllamav3_ext.*.so "
                  f"{sp}/vllm/model_executor/layers/sparse_attn_indexer.py "
                  f"{sp}/vllm/model_executor/models/ablit_runtime.py "
                  f"{sp}/vllm/model_executor/models/deepseek_v2.py; ls /tmp")
    for name in ["sm120_dcp.py", "exl3.py", "sparse_attn_indexer.py", "ablit_runtime.py"]:
        assert PATCH_FILES[name] in text
    assert "exllamav3 1.4.5" in text and "0.0.43" not in text
    assert "# patched by patch_ablit_dsv2.py" in text
    assert "sparkstack" not in text.split("\n")[-2:]  # the staging directories are gone
    labels = docker_client.api.inspect_image(top.tag)["Config"]["Labels"]
    assert labels["org.sparkstack.stage"] == "keys3"
    assert labels["org.sparkstack.profile"] == "sandbox"
    assert labels["org.sparkstack.chain"] == top.digest
    assert labels["org.sparkstack.parent"] == chain.stage("keys").tag


def test_failing_run_stops_the_chain(docker_client, test_base, tmp_path):
    patches = write_patches(tmp_path / "patches")
    (patches / "exllamav3_ext.so").write_bytes(b"PK\x03\x04 a wheel, not the .so")
    loaded, _ = loaded_for(tmp_path, test_base, patches)
    chain = chain_of(docker_client, loaded)
    with pytest.raises(build_mod.BuildError) as e:
        build_mod.build_chain(docker_client, chain)
    message = e.value.message
    run_line = next(n for n, text in images.instruction_lines(chain.stage("v145").dockerfile)
                    if text.startswith("RUN"))
    assert f"stage v145 ({chain.stage('v145').template}) failed at Dockerfile line {run_line}: RUN" in message
    assert "exllamav3_ext.so is not an ELF shared object" in message
    assert "docker: the command exited with code 1" in message
    assert f"kept: dcp {chain.stage('dcp').tag}, mul1 {chain.stage('mul1').tag}" in message
    for name, present in [("dcp", True), ("mul1", True), ("v145", False), ("keys", False)]:
        assert (build_mod.local_image_id(docker_client, chain.stage(name).tag) is not None) == present


def test_cli_build_json(docker_client, test_base, tmp_path):
    patches = write_patches(tmp_path / "patches")
    _, path = loaded_for(tmp_path, test_base, patches)
    runner = CliRunner()
    first = runner.invoke(main, ["build", "-c", str(path), "--json"])
    assert first.exit_code == 0, first.output
    stages = json.loads(first.output)["stages"]
    assert [s["name"] for s in stages] == FOUR
    assert set(stages[0]) == {"name", "tag", "image_id", "built", "seconds"}
    assert all(s["image_id"].startswith("sha256:") and s["tag"].startswith("sparkstack/") for s in stages)
    second = json.loads(runner.invoke(main, ["build", "-c", str(path), "--json"]).output)["stages"]
    assert [s["built"] for s in second] == [False] * 4
    assert [s["image_id"] for s in second] == [s["image_id"] for s in stages]
    # plan names the chain's top tag, the one just built
    plan = json.loads(runner.invoke(main, ["plan", "-c", str(path), "--json", "--offline"]).output)
    assert stages[-1]["tag"] in plan["ranks"][0]["docker_run"]


def test_cli_build_failure_is_one_message(docker_client, test_base, tmp_path):
    patches = write_patches(tmp_path / "patches")
    (patches / "exllamav3_ext.so").write_bytes(b"PK\x03\x04")
    _, path = loaded_for(tmp_path, test_base, patches)
    result = CliRunner().invoke(main, ["build", "-c", str(path)])
    assert result.exit_code == 1
    assert "error: stage v145" in result.output and "Traceback" not in result.output


def test_missing_base_is_refused(docker_client, tmp_path):
    patches = write_patches(tmp_path / "patches")
    _, path = loaded_for(tmp_path, "sparkstack-test/no-such-base:1", patches)
    result = CliRunner().invoke(main, ["build", "-c", str(path)])
    assert result.exit_code == 1
    assert "base image sparkstack-test/no-such-base:1: not in the local Docker" in result.output


def test_context_is_small(test_base, tmp_path):
    patches = write_patches(tmp_path / "patches")
    (patches / "unrelated-big-file.bin").write_bytes(b"\0" * 2_000_000)
    loaded, _ = loaded_for(tmp_path, test_base, patches)
    for stage in images.chain_for(loaded).stages:
        with tarfile.open(fileobj=io.BytesIO(images.context_tar(stage))) as tar:
            names = {m.name for m in tar.getmembers() if m.isfile()}
        assert names == {"Dockerfile"} | {f.path for f in stage.files}
        assert len(images.context_tar(stage)) < 20_000


def test_base_is_tiny(docker_client, test_base):
    assert docker_client.api.inspect_image(test_base)["Size"] < 5_000_000
