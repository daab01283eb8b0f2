"""The image chain as data: stages loaded and checked, Dockerfiles rendered, tags from content.

No Docker here (test_build.py builds). The patch files are small stand-ins written per test; the
golden Dockerfiles are rendered from them for the real profiles, on Mia's base image by name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT
from launcher.inputs import config as config_mod
from launcher.images import chain as images
from launcher.cli.commands import main
from launcher.errors import ConfigError
from launcher.sandbox.chain_fixture import PATCH_FILES, write_patches

GOLDEN = ROOT / "tests" / "golden" / "dockerfiles"
MIA = "ghcr.io/miaai-lab/glm-5.3-flash-2x-dgx-sparks:exl3"
FOUR = ["dcp", "mul1", "v145", "keys"]

@pytest.fixture
def patches(tmp_path):
    return write_patches(tmp_path / "patches")


@pytest.fixture
def stages_dir(tmp_path):
    """A copy of images/ to break."""
    return Path(shutil.copytree(images.IMAGES_DIR, tmp_path / "images"))


def load(write_config, patches, profile="keys-1m-dcp4", **images_cfg):
    path = write_config(lambda d: d.update(profile=profile, images={"patches_dir": str(patches), **images_cfg}))
    return config_mod.load(path)


def render(names, patches, images_dir=images.IMAGES_DIR, base=images.Base(MIA), profile="keys-1m-dcp4"):
    return images.render_chain(images.load_stages(names, images_dir), base, patches, profile)


def problems(fn) -> list[str]:
    with pytest.raises(ConfigError) as e:
        fn()
    return e.value.problems


# ---- golden Dockerfiles for the real profiles ---------------------------------------------------

VARIANTS = {"keys-1m-dcp4": ("keys-1m-dcp4", None), "keys-1m-dcp4+keys3": ("keys-1m-dcp4", FOUR + ["keys3"]),
            "sandbox": ("sandbox", None)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_dockerfiles_match_golden(write_config, patches, variant, golden):
    profile, chain = VARIANTS[variant]
    loaded = load(write_config, patches, profile)
    if chain:
        image = loaded.profile.image.model_copy(update={"chain": chain})
        loaded = loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"image": image})})
    rendered = images.chain_for(loaded)
    golden.check_dir(GOLDEN / variant, {f"{s.name}.Dockerfile": s.dockerfile for s in rendered.stages},
                     pattern="*.Dockerfile")


def test_keys_profile_builds_on_mias_base(write_config, patches):
    chain = images.chain_for(load(write_config, patches))
    assert [s.name for s in chain.stages] == FOUR
    assert chain.stages[0].dockerfile.startswith(f"FROM {MIA}\n")
    for parent, child in zip(chain.stages, chain.stages[1:]):
        assert child.dockerfile.startswith(f"FROM {parent.tag}\n")
    assert chain.top == chain.stages[-1].tag and chain.top.startswith("sparkstack/keys:")


def test_cluster_base_overrides_the_profiles(write_config, patches):
    chain = images.chain_for(load(write_config, patches, base="example.org/my-vllm:1"))
    assert chain.stages[0].dockerfile.startswith("FROM example.org/my-vllm:1\n")


# ---- tags from content ---------------------------------------------------------------------------

def tags(chain):
    return {s.name: s.tag for s in chain.stages}


def test_tags_are_stable(patches):
    assert tags(render(FOUR, patches)) == tags(render(FOUR, patches))


def test_one_file_changes_its_stage_and_descendants_only(patches):
    before = tags(render(FOUR, patches))
    (patches / "exl3.py").write_text("# changed\n")
    after = tags(render(FOUR, patches))
    assert before["dcp"] == after["dcp"]
    assert all(before[n] != after[n] for n in ["mul1", "v145", "keys"])


def test_top_stage_change_touches_only_it(patches):
    before = tags(render(FOUR, patches))
    (patches / "sparse_attn_indexer.py").write_text("# changed\n")
    after = tags(render(FOUR, patches))
    assert [n for n in FOUR if before[n] != after[n]] == ["keys"]


def test_base_id_profile_args_and_template_are_inputs(patches, stages_dir):
    plain = tags(render(FOUR, patches))
    assert tags(render(FOUR, patches, base=images.Base(MIA, "sha256:" + "1" * 64))) != plain
    assert tags(render(FOUR, patches, base=images.Base(MIA, "sha256:" + "1" * 64))) != \
        tags(render(FOUR, patches, base=images.Base(MIA, "sha256:" + "2" * 64)))
    assert render(FOUR, patches, profile="other").stages[0].tag != render(FOUR, patches).stages[0].tag
    same = tags(render(FOUR, patches, stages_dir))
    assert same == plain  # where the stages live is not an input
    meta = stages_dir / "v145" / "stage.yaml"
    meta.write_text(meta.read_text().replace("EXT_MODULE: exllamav3_ext", "EXT_MODULE: exllamav3_ext2"))
    changed = tags(render(FOUR, patches, stages_dir))
    assert [n for n in FOUR if changed[n] != plain[n]] == ["v145", "keys"]


def test_shared_template_change_changes_every_stage(patches, tmp_path):
    templates = Path(shutil.copytree(images.TEMPLATES_DIR, tmp_path / "templates"))
    plain = tags(render(FOUR, patches))
    macro = templates / "copy_into_site_packages.j2"
    macro.write_text(macro.read_text().replace('chmod 0644 "$2"', 'chmod 0444 "$2"'))
    other = images.render_chain(images.load_stages(FOUR), images.Base(MIA), patches, "keys-1m-dcp4", templates)
    assert all(tags(other)[n] != plain[n] for n in FOUR)


def test_labels(patches):
    chain = render(FOUR, patches)
    mul1 = chain.stage("mul1")
    assert mul1.labels == {"org.sparkstack.stage": "mul1", "org.sparkstack.profile": "keys-1m-dcp4",
                           "org.sparkstack.parent": chain.stage("dcp").tag, "org.sparkstack.base": MIA,
                           "org.sparkstack.chain": mul1.digest}
    assert mul1.tag == f"sparkstack/mul1:{mul1.digest[:16]}"


# ---- refused before any build, naming the stage and the file -------------------------------------

def test_unknown_stage(stages_dir):
    (msg,) = problems(lambda: images.load_stages(["dcp", "nope"], stages_dir, "profile x: image.chain"))
    assert msg.startswith("profile x: image.chain: stage 'nope': no ") and "nope/stage.yaml" in msg


def test_missing_parent(stages_dir, patches):
    (msg,) = problems(lambda: images.load_stages(["mul1", "v145"], stages_dir))
    assert "stage 'mul1': its parent 'dcp'" in msg and "mul1/stage.yaml" in msg and "missing from the chain" in msg


def test_parent_directory_missing(stages_dir):
    meta = stages_dir / "mul1" / "stage.yaml"
    meta.write_text(meta.read_text().replace("parent: dcp", "parent: dpc"))
    (msg,) = problems(lambda: images.load_stages(FOUR, stages_dir))
    assert "stage 'mul1': its parent 'dpc'" in msg and "is no stage: no " in msg and "dpc/stage.yaml" in msg


def test_wrong_order(stages_dir):
    msgs = problems(lambda: images.load_stages(["dcp", "v145", "mul1"], stages_dir))
    assert any("stage 'v145' must come right after its parent 'mul1'" in m for m in msgs)


def test_cycle(stages_dir):
    for name, parent in [("a", "b"), ("b", "a")]:
        (stages_dir / name).mkdir()
        (stages_dir / name / "stage.yaml").write_text(f"description: x\nparent: {parent}\n")
        (stages_dir / name / "Dockerfile.j2").write_text("FROM {{ parent }}\n")
    (msg,) = problems(lambda: images.load_stages(["a", "b"], stages_dir))
    assert "cycle a → b → a" in msg or "cycle b → a → b" in msg
    assert "a/stage.yaml" in msg and "b/stage.yaml" in msg


def test_bad_stage_yaml(stages_dir):
    (stages_dir / "keys" / "stage.yaml").write_text("description: x\nparent: v145\nfiles: [{src: ../x.py}]\n")
    (msg,) = problems(lambda: images.load_stages(FOUR, stages_dir))
    assert "keys/stage.yaml: files[0].src: must be a path inside the patch directory" in msg


def test_missing_patch_files_all_listed(patches):
    (patches / "exl3.py").unlink()
    (patches / "sparse_attn_indexer.py").unlink()
    msgs = problems(lambda: render(FOUR, patches))
    assert len(msgs) == 2
    assert msgs[0].startswith("stage 'mul1' (") and "mul1/stage.yaml): files[0].src: " in msgs[0]
    assert f"{patches / 'exl3.py'}: not found" in msgs[0]
    assert "stage 'keys'" in msgs[1]


def test_template_syntax_error_names_file_and_line(stages_dir, patches):
    (stages_dir / "v145" / "Dockerfile.j2").write_text("FROM {{ parent }}\nRUN echo\n{% if %}\n")
    (msg,) = problems(lambda: render(FOUR, patches, stages_dir))
    assert msg.startswith("stage 'v145': ") and "v145/Dockerfile.j2:3: template error" in msg


def test_template_undefined_names_file_and_line(stages_dir, patches):
    (stages_dir / "dcp" / "Dockerfile.j2").write_text("FROM {{ parent }}\n\nRUN echo {{ no_such_thing }}\n")
    (msg,) = problems(lambda: render(FOUR, patches, stages_dir))
    assert "stage 'dcp'" in msg and "dcp/Dockerfile.j2:3: template error: 'no_such_thing' is undefined" in msg


def test_template_must_start_from_parent(stages_dir, patches):
    (stages_dir / "keys" / "Dockerfile.j2").write_text("# a comment\nFROM ubuntu:24.04\n")
    (msg,) = problems(lambda: render(FOUR, patches, stages_dir))
    assert "stage 'keys'" in msg and "the first instruction must be `FROM {{ parent }}`" in msg


def test_missing_patches_dir(write_config):
    path = write_config(lambda d: d.update(images={}))
    (msg,) = problems(lambda: images.chain_for(config_mod.load(path)))
    assert "images.patches_dir: required" in msg


def test_cli_refuses_before_docker(write_config, patches, monkeypatch):
    (patches / "mla_attn_dcp.py").unlink()
    path = write_config(lambda d: d.update(images={"patches_dir": str(patches)}))
    from launcher.images import local_docker
    monkeypatch.setattr(local_docker, "connect", lambda *a, **k: pytest.fail("Docker was asked"))
    result = CliRunner().invoke(main, ["build", "-c", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith("error: stage 'dcp' (") and "mla_attn_dcp.py: not found" in result.output
    assert "Traceback" not in result.output


def test_prebuilt_profile_has_nothing_to_build(write_config, patches):
    path = write_config(lambda d: d.update(profile="keys35-200k", images={"patches_dir": str(patches)}))
    result = CliRunner().invoke(main, ["build", "-c", str(path), "--json"])
    assert result.exit_code == 0 and result.output.strip() == '{\n  "stages": []\n}'


def test_build_takes_the_profile_flag(write_config, patches, tmp_path):
    """`build --profile NAME` builds NAME's chain, not cluster.yaml's: a prebuilt profile over a
    chain one builds nothing; a chain profile over a prebuilt one renders the stages (and tags) a
    config naming it renders."""
    import json
    chain = write_config(lambda d: d.update(images={"patches_dir": str(patches)}))  # keys-1m-dcp4
    result = CliRunner().invoke(main, ["build", "-c", str(chain), "--json", "--profile", "keys35-200k"])
    assert result.exit_code == 0 and json.loads(result.output) == {"stages": []}, result.output

    prebuilt = write_config(lambda d: d.update(profile="keys35-200k", images={"patches_dir": str(patches)}),
                            name="prebuilt.yaml")
    tags = {}
    for name, args in (("flag", ["-c", str(prebuilt), "--profile", "keys-1m-dcp4"]), ("named", ["-c", str(chain)])):
        result = CliRunner().invoke(main, ["build", *args, "--render-only", str(tmp_path / name), "--json"])
        assert result.exit_code == 0, result.output
        tags[name] = [(s["name"], s["tag"]) for s in json.loads(result.output)["stages"]]
    assert [n for n, _ in tags["flag"]] == FOUR and tags["flag"] == tags["named"]
    for stage in FOUR:
        assert ((tmp_path / "flag" / stage / "Dockerfile").read_text()
                == (tmp_path / "named" / stage / "Dockerfile").read_text())


# ---- --render-only and plan -----------------------------------------------------------------------

def test_render_only_writes_contexts(write_config, patches, tmp_path):
    path = write_config(lambda d: d.update(images={"patches_dir": str(patches)}))
    out = tmp_path / "rendered"
    result = CliRunner().invoke(main, ["build", "-c", str(path), "--render-only", str(out), "--json"])
    assert result.exit_code == 0, result.output
    for name in FOUR:
        sent = (out / name / "Dockerfile").read_text()
        assert sent.startswith((GOLDEN / "keys-1m-dcp4" / f"{name}.Dockerfile").read_text().rstrip())
        assert sent.splitlines()[-1].startswith('LABEL org.sparkstack.base="ghcr.io/miaai-lab/')
    assert (out / "mul1" / "files" / "exl3.py").read_text() == PATCH_FILES["exl3.py"]
    assert sorted(p.name for p in (out / "dcp" / "files").iterdir()) == ["mla_attn_dcp.py", "sm120_dcp.py"]
    assert len((out / "TAGS").read_text().splitlines()) == 4


def test_plan_names_the_content_tag(write_config, patches):
    import json
    path = write_config(lambda d: d.update(images={"patches_dir": str(patches)}))
    data = json.loads(CliRunner().invoke(main, ["plan", "-c", str(path), "--json", "--offline"]).output)
    top = images.chain_for(config_mod.load(path)).top
    assert top in data["ranks"][0]["docker_run"]
    assert any("is not in the local Docker" in a for a in data["assumed"])


def test_plan_without_patches_keeps_the_placeholder(write_config, tmp_path):
    import json
    path = write_config(lambda d: d.update(images={"patches_dir": str(tmp_path / "absent")}))
    data = json.loads(CliRunner().invoke(main, ["plan", "-c", str(path), "--json", "--offline"]).output)
    assert "sparkstack/keys:unbuilt" in data["ranks"][0]["docker_run"]


def test_context_tar_is_deterministic(patches):
    stage = render(FOUR, patches).stage("dcp")
    assert images.context_tar(stage) == images.context_tar(stage)


@pytest.mark.parametrize("where", ["/proc", "a-file/sub"])
def test_render_only_into_a_directory_that_cannot_be_written(write_config, patches, tmp_path, where):
    (tmp_path / "a-file").write_text("not a directory\n")
    out = tmp_path / where  # /proc stays /proc
    path = write_config(lambda d: d.update(images={"patches_dir": str(patches)}))
    result = CliRunner().invoke(main, ["build", "-c", str(path), "--render-only", str(out)])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, result.exception
    assert f"--render-only {out}: cannot write" in result.output
