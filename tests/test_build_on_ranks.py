"""`build --on-ranks` against the sandbox: every rank's own Docker builds the chain over SSH.

The ranks get this session's tiny stand-in base of test_build (busybox + a fake vLLM layout,
labelled org.sparkstack.test=<session>) through launcher.images.ship, so the test depends on neither
the sandbox's own base nor its patch files. Every image the session made carries the label, on
this host and on the ranks, and is removed at the end.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from launcher.images import build as build_mod
from launcher.gather import ranks
from launcher.images import ship
from launcher.cli.commands import main
from test_build import FOUR, chain_of, loaded_for
from test_build import docker_client, session, test_base  # noqa: F401 (fixtures)
from launcher.sandbox.chain_fixture import TEST_LABEL, write_patches


@pytest.fixture(scope="module")
def ranks_base(sandbox, group, docker_client, test_base, session):
    """The session's base on every rank, by ship (its image ID is the host's)."""
    plan = ranks.ship_plan(group, ship.local_image_ids([test_base]))
    ship.apply(plan, group, say=lambda line: None)
    assert {r.status for r in plan.ranks} <= {"shipped", "up-to-date"}, [r.error for r in plan.ranks]
    yield test_base
    for _ in range(5):  # children before parents: repeat until none is left
        group.run(f"docker images -q --filter label={TEST_LABEL}={session} | sort -u | "
                  f"xargs -r docker rmi -f >/dev/null 2>&1; true")


def by_stage(rank: build_mod.RankBuild) -> dict[str, dict]:
    return {s["name"]: s for s in rank.stages}


def test_builds_on_every_rank_then_nothing(ranks_base, group, docker_client, tmp_path, sandbox):
    loaded, _ = loaded_for(tmp_path, ranks_base, write_patches(tmp_path / "patches"))
    chain = chain_of(docker_client, loaded)
    lines = []
    first = build_mod.build_on_ranks(loaded, chain, say=lines.append, group=group)
    assert [r.status for r in first] == ["built"] * 4, "\n".join(r.error or "" for r in first)
    assert [list(by_stage(r)) for r in first] == [FOUR] * 4
    assert all(s["built"] for r in first for s in r.stages)
    assert sorted(line.split(":")[0] for line in lines) == [f"rank {i} (spark{i + 1})" for i in range(4)]
    # the same stage on every rank: its content tag and its chain label (the classic builder
    # stamps each step's creation time into the image, so the IDs differ from rank to rank)
    for stage in chain.stages:
        for name in sandbox.names:
            rc, out, _ = sandbox.run(name, f"docker image inspect --format "
                                           f"'{{{{index .Config.Labels \"org.sparkstack.chain\"}}}}' {stage.tag}")
            assert rc == 0 and out.strip() == stage.digest, (name, stage.name)
    # the files landed as on a host build
    rc, out, _ = sandbox.run("spark2", f"docker run --rm {chain.top} cat /usr/lib/python3/dist-packages/"
                                       f"vllm/model_executor/layers/sparse_attn_indexer.py")
    assert rc == 0 and "stock indexer" not in out

    again = build_mod.build_on_ranks(loaded, chain, group=group)
    assert [r.status for r in again] == ["up-to-date"] * 4
    for before, after in zip(first, again):
        assert {n: (s["built"], s["image_id"]) for n, s in by_stage(after).items()} == \
            {n: (False, s["image_id"]) for n, s in by_stage(before).items()}


def test_failing_run_is_reported_per_rank(ranks_base, group, docker_client, tmp_path):
    patches = write_patches(tmp_path / "patches")
    (patches / "exllamav3_ext.so").write_bytes(b"PK\x03\x04 a wheel, not the .so")
    loaded, _ = loaded_for(tmp_path, ranks_base, patches)
    chain = chain_of(docker_client, loaded)
    results = build_mod.build_on_ranks(loaded, chain, group=group)
    assert [r.status for r in results] == ["failed"] * 4
    for i, r in enumerate(results):
        assert r.error.startswith(f"rank {i} (spark{i + 1}): stage v145 ")
        assert "failed at Dockerfile line" in r.error and ": RUN" in r.error
        assert "exllamav3_ext.so is not an ELF shared object" in r.error  # the build's own output
        assert "docker: the command exited with code 1" in r.error
        assert list(by_stage(r)) == ["dcp", "mul1"]  # kept; nothing tagged for v145 or keys


def test_a_rank_without_the_base_fails_alone(ranks_base, group, docker_client, tmp_path, sandbox, session):
    loaded, _ = loaded_for(tmp_path, ranks_base, write_patches(tmp_path / "patches"), chain=["dcp"])
    chain = chain_of(docker_client, loaded)
    sandbox.run("spark3", f"docker tag {ranks_base} sparkstack-test/moved:{session.replace('-', '')} && "
                          f"docker rmi {ranks_base}")
    try:
        results = build_mod.build_on_ranks(loaded, chain, group=group)
    finally:
        sandbox.run("spark3", f"docker tag sparkstack-test/moved:{session.replace('-', '')} {ranks_base}")
    assert all(results[i].status in ("built", "up-to-date") for i in (0, 1, 3)), [r.error for r in results]
    assert results[2].status == "failed"
    assert results[2].error == (f"rank 2 (spark3): base image {ranks_base} is not on the rank; ship it "
                                f"(`sparkstack ship --image {ranks_base}`) or load it there, then re-run")


def test_cli_on_ranks_json(ranks_base, tmp_path, sandbox):
    data = yaml.safe_load(sandbox.config.read_text())
    data["images"] = {"base": ranks_base, "patches_dir": str(write_patches(tmp_path / "patches"))}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(main, ["build", "-c", str(path), "--on-ranks", "--json"])
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert set(ranks[0]) == {"rank", "host", "status", "stages", "error", "seconds"}
    assert [s["name"] for s in ranks[0]["stages"]] == FOUR
