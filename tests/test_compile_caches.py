"""The engine's compile caches kept on each rank (issue 15): where the plan mounts them, what
the engine is told, and the commands `status` and `down --purge-caches` run."""

import subprocess
from types import SimpleNamespace

from test_plan import plan_json
from launcher.plan import caches, cluster_plan as plan_mod

IN = caches.IN_CONTAINER


def test_every_rank_mounts_its_image_cache_and_every_cache_points_there(write_config):
    data = plan_json(write_config(lambda d: d.update(profile="keys35-200k")))
    image = data["ranks"][0]["docker_run"][-1]
    for rank in data["ranks"]:
        argv = rank["docker_run"]
        mount = argv[argv.index(f"/var/cache/sparkstack/{caches.key(image)}:{IN}") - 1]
        assert mount == "-v" and "/" not in caches.key(image) and ":" not in caches.key(image)
        # the names vLLM (envs.py), torch inductor, Triton, FlashInfer (jit/env.py) and CUDA read
        assert {k: rank["env"][k] for k in caches.ENV} == {
            "VLLM_CACHE_ROOT": f"{IN}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{IN}/inductor",
            "TRITON_CACHE_DIR": f"{IN}/triton", "FLASHINFER_WORKSPACE_BASE": f"{IN}/flashinfer",
            "CUDA_CACHE_PATH": f"{IN}/cuda"}


def test_config_moves_or_turns_off_the_caches_and_its_env_wins(write_config):
    def edit(d, cache_dir):
        d.setdefault("container", {})["cache_dir"] = cache_dir
        d.setdefault("overrides", {}).setdefault("env", {})["TRITON_CACHE_DIR"] = "/elsewhere"

    moved = plan_json(write_config(lambda d: edit(d, "/srv/engine-cache")))["ranks"][1]
    assert any(a.startswith("/srv/engine-cache/") and a.endswith(f":{IN}") for a in moved["docker_run"])
    assert moved["env"]["TRITON_CACHE_DIR"] == "/elsewhere" and moved["env"]["VLLM_CACHE_ROOT"] == f"{IN}/vllm"
    off = plan_json(write_config(lambda d: edit(d, None)))["ranks"][1]
    assert not any(IN in a for a in off["docker_run"]) and "VLLM_CACHE_ROOT" not in off["env"]


def test_a_new_image_gets_a_fresh_cache():
    """A built image's content tag changes with its content; a prebuilt tag can move, so the
    image ID the rank reported is part of its key."""
    assert caches.key("sparkstack/keys:3f9a") != caches.key("sparkstack/keys:77b0")
    assert caches.key("vllm/vllm-openai:v0.33.0", "sha256:0123456789abcdef99") == "vllm-vllm-openai-v0.33.0-0123456789ab"
    facts = SimpleNamespace(docker=SimpleNamespace(image=lambda ref: SimpleNamespace(id="sha256:feedbeef0000aa")))
    prebuilt = SimpleNamespace(profile=SimpleNamespace(image=SimpleNamespace(prebuilt="vllm/vllm-openai:v0.33.0")))
    built = SimpleNamespace(profile=SimpleNamespace(image=SimpleNamespace(prebuilt=None)))
    assert plan_mod._prebuilt_id(prebuilt, "vllm/vllm-openai:v0.33.0", facts) == "sha256:feedbeef0000aa"
    assert plan_mod._prebuilt_id(prebuilt, "vllm/vllm-openai:v0.33.0", None) is None
    assert plan_mod._prebuilt_id(built, "sparkstack/keys:3f9a", facts) is None


def cluster(root):
    return SimpleNamespace(container=SimpleNamespace(cache_dir=root))


def test_size_and_purge_commands_on_a_real_tree(tmp_path):
    root = tmp_path / "cache root"  # a space: every path is quoted
    (root / "img-a" / "vllm").mkdir(parents=True)
    (root / "img-a" / "vllm" / "graph").write_bytes(b"x" * 5000)
    (root / "img-a" / caches.MARKER).write_text("x")
    (root / "img-b").mkdir()  # not marked: not the kit's
    out = subprocess.run(["sh", "-c", caches.size_command(cluster(str(root)))], capture_output=True, text=True)
    sizes = caches.parse_sizes(out.stdout)
    assert set(sizes) == {"img-a"} and sizes["img-a"] >= 5000  # the kit's only
    subprocess.run(["sh", "-c", caches.purge_command(cluster(str(root)))], check=True)
    assert root.is_dir() and list(root.iterdir()) == [root / "img-b"]
    out = subprocess.run(["sh", "-c", caches.size_command(cluster(str(root / "never")))], capture_output=True, text=True)
    assert out.returncode == 0 and caches.parse_sizes(out.stdout) == {}
    assert caches.size_command(cluster(None)) is None and caches.purge_command(cluster(None)) is None


def test_purge_runs_as_root_and_names_a_rank_that_refused():
    from launcher.apply import engine_caches
    from launcher.transport.remote import Group, Result, Target

    class Rank:
        def __init__(self, r, status, stderr=""):
            self.target, self.status, self.stderr, self.asked = Target(r, f"spark{r + 1}", "10.0.0.1", user="spark"), status, stderr, []

        def run(self, command, timeout=60.0, sudo=False, **kw):
            self.asked.append((command, sudo))
            return Result(self.target, self.status, getattr(self, "stdout", ""), self.stderr)

    ranks = [Rank(0, 0), Rank(1, 1, "sudo: a password is required")]
    loaded = SimpleNamespace(cluster=cluster("/var/cache/sparkstack"))
    said = []
    ranks[0].stdout = "sparkstack-left old-cache\n"
    failed = engine_caches.purge(loaded, Group(ranks), said.append)
    assert ranks[0].asked == [(caches.purge_command(loaded.cluster), True)]
    assert failed == ["rank 1 (spark2): cannot remove the compile caches under /var/cache/sparkstack (exited 1: "
                      "sudo: a password is required); fix: give spark passwordless sudo, or remove that "
                      "directory's contents as root"]
    assert said == ["rank 0 (spark1): left under /var/cache/sparkstack: old-cache (not marked .sparkstack-cache by "
                    "the kit: made by another program, or by sparkstack before it marked its caches; remove "
                    "them by hand if they are its)"]
    assert engine_caches.purge(SimpleNamespace(cluster=cluster(None)), Group(ranks)) == []


# --- issue 33, item 3: a shallow cache root, and purges that touch only what the kit made --------

import pytest  # noqa: E402

from launcher.inputs import config  # noqa: E402


@pytest.mark.parametrize("root", ["/", "/var", "/home", "/srv", "/tmp", "/var/cache", "/var/lib", "/home/spark",
                                  "/usr/local", "/etc/sparkstack", "/proc/x/y", "/var/cache/sparkstack/../..",
                                  "/var/./cache", "//var"])
def test_a_shallow_or_shared_cache_root_is_refused(write_config, root):
    path = write_config(lambda d: d.setdefault("container", {}).update(cache_dir=root))
    with pytest.raises(config.ConfigError) as raised:
        config.load(path)
    assert any(p.startswith(f"{path}: container.cache_dir: ") and "a directory of the kit's own" in p
               for p in raised.value.problems), raised.value.problems


@pytest.mark.parametrize("root", ["/var/cache/sparkstack", "/srv/engine-cache", "/home/spark/cache", "/data/x/y/"])
def test_a_cache_root_of_its_own_is_taken(write_config, root):
    assert config.load(write_config(lambda d: d.setdefault("container", {}).update(cache_dir=root)))


def test_purge_removes_only_the_directories_the_kit_marked(tmp_path):
    """`cache_dir: /` ran `rm -rf -- ''/*` as root: now only a directory holding the kit's marker
    (written when the kit starts an engine on it) goes; the rest of the root stays, links too."""
    root = tmp_path / "shared root"
    made = root / "img-a"
    (made / "vllm").mkdir(parents=True)
    (made / caches.MARKER).write_text("x")
    (root / "theirs" / "sub").mkdir(parents=True)
    (root / "theirs" / "data").write_text("keep")
    (root / "a file").write_text("keep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / caches.MARKER).write_text("x")
    (root / "link").symlink_to(outside)
    done = subprocess.run(["sh", "-c", caches.purge_command(cluster(str(root)))], check=True,
                          capture_output=True, text=True)
    assert sorted(p.name for p in root.iterdir()) == ["a file", "link", "theirs"]
    assert sorted(caches.parse_left(done.stdout)) == ["a file", "link", "theirs"]  # named, for `down` to say
    assert (root / "theirs" / "data").read_text() == "keep" and (outside / caches.MARKER).exists()


def test_every_start_marks_its_cache_directory(tmp_path):
    """The rank's start command writes the marker into the engine's cache mount through Docker
    (`docker cp`, as the daemon made the directory), here a fake docker on a real tree."""
    from launcher.apply import serve
    from launcher.plan.cluster_plan import CONTAINER_NAME

    host = tmp_path / "cache" / "img-a"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'case "$1" in run) mkdir -p "{host}"; exit 0;; '
        f'cp) [ "${{3%%:*}}" = {CONTAINER_NAME} ] || exit 9; '
        f'dest="{host}${{3#*:{IN}}}"; cp "$2" "$dest";; *) exit 8;; esac\n')
    (bin_dir / "docker").chmod(0o755)
    rank = SimpleNamespace(rank=0, env={}, docker_run=["docker", "run", "-d", "--name", CONTAINER_NAME, "-v",
                                                       f"{host}:{IN}", "img"], engine=["serve"])
    command, _stdin = serve.run_command(rank)
    import os
    subprocess.run(["sh", "-c", command], check=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert (host / caches.MARKER).read_text().startswith("made by sparkstack")
    no_cache = SimpleNamespace(rank=0, env={}, docker_run=["docker", "run", "-d", "img"], engine=[])
    assert "docker cp" not in serve.run_command(no_cache)[0]
