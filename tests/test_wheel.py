"""The kit as a user installs it (`pip install .`, pipx, `uv tool install`): a wheel built from the
checkout, installed into a fresh virtualenv outside it, run from another directory, finds its own
profiles, templates and image stages (setup.py puts images/, templates/ and env/ in the wheel;
launcher/resources.py finds them there) and says exactly what the checkout says."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from launcher.sandbox.chain_fixture import write_patches

ROOT = Path(__file__).resolve().parents[1]
# What a build needs, and nothing else: a build that reached for another file fails here.
SOURCES = ("launcher", "images", "templates", "env", "ansible", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
CHECKOUT_SPARKSTACK = Path(sys.executable).with_name("sparkstack")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtualenv outside the checkout holding the kit from the wheel alone. Its dependencies
    come from this virtualenv's site-packages, appended to sys.path without running that
    directory's .pth files, so the editable install of the checkout stays out."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "_resources"))
        else:
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(src)], check=True, cwd=tmp)
    [wheel] = (tmp / "dist").glob("sparkstack-*.whl")
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    [site] = env.glob("lib/python3*/site-packages")
    (site / "sparkstack-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True)
    return env


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def run(program, *args, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKSTACK_CONFIG", "PYTHONPATH")}
    done = subprocess.run([str(program), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def config(write_config, tmp_path) -> Path:
    """A copy of env/cluster.example.yaml whose images.patches_dir holds (stand-in) patch files."""
    patches = write_patches(tmp_path / "patches")
    return write_config(lambda d: d["images"].update(patches_dir=str(patches)))


def test_the_kit_comes_from_the_wheel(venv, elsewhere):
    """Nothing of the checkout is imported: the package and its resources are the installed copy."""
    out = run(venv / "bin" / "python", "-c", "import launcher, launcher.resources as r; "
              "print(launcher.__file__); print(r.PROFILES_DIR)", cwd=elsewhere)
    package, profiles = (Path(line) for line in out.splitlines())
    assert package.is_relative_to(venv) and not package.is_relative_to(ROOT)
    assert profiles == package.parent / "_resources" / "env" / "profiles"
    assert sorted(p.name for p in profiles.iterdir()) == sorted(p.name for p in (ROOT / "env" / "profiles").iterdir())


def test_profiles(venv, elsewhere):
    """`sparkstack profiles` lists every profile the repository ships, with its description."""
    out = run(venv / "bin" / "sparkstack", "profiles", cwd=elsewhere)
    names = sorted(p.stem for p in (ROOT / "env" / "profiles").glob("*.yaml"))
    assert names and all(f"\n{n} (" in f"\n{out}" for n in names), out
    assert out == run(CHECKOUT_SPARKSTACK, "profiles", cwd=elsewhere)


def test_plan_offline(venv, elsewhere, config):
    """`sparkstack plan --offline -c <example copy>`: the same plan as the checkout's, the chain's
    content tag included (it hashes the rendered templates and stages, so they are the same bytes)."""
    out = run(venv / "bin" / "sparkstack", "plan", "--offline", "-c", str(config), cwd=elsewhere)
    assert "profile keys-1m-dcp4" in out and "rank 3" in out, out
    plan = json.loads(run(venv / "bin" / "sparkstack", "plan", "--offline", "--json", "-c", str(config), cwd=elsewhere))
    assert plan == json.loads(run(CHECKOUT_SPARKSTACK, "plan", "--offline", "--json", "-c", str(config), cwd=elsewhere))
    argv = json.dumps([rank["docker_run"] for rank in plan["ranks"]])
    assert "sparkstack/keys:" in argv and "sparkstack/keys:unbuilt" not in argv, argv


def test_build_render_only(venv, elsewhere, config, tmp_path):
    """`sparkstack build --render-only DIR`: every stage's build context, byte for byte the checkout's."""
    installed, checkout = tmp_path / "installed", tmp_path / "checkout"
    out = run(venv / "bin" / "sparkstack", "build", "--render-only", str(installed), "-c", str(config), cwd=elsewhere)
    run(CHECKOUT_SPARKSTACK, "build", "--render-only", str(checkout), "-c", str(config), cwd=elsewhere)
    stages = sorted(p.name for p in installed.iterdir() if p.is_dir())
    assert stages == ["dcp", "keys", "mul1", "v145"], (stages, out)
    for stage in stages:
        assert (installed / stage / "Dockerfile").read_text().startswith("FROM ")
        assert stage in out
    files = sorted(p.relative_to(installed) for p in installed.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(checkout) for p in checkout.rglob("*") if p.is_file())
    assert all((installed / f).read_bytes() == (checkout / f).read_bytes() for f in files)


def test_verify_held_out_texts_come_with_the_wheel(venv, elsewhere):
    """`verify`'s held-out texts and their CC0 README are package data: the same bytes installed."""
    out = run(venv / "bin" / "python", "-c", "from launcher.apply import verify as v; "
              "print(v.HELDOUT_DIR); print(' '.join(t.sha256 for t in v.held_out()))", cwd=elsewhere)
    folder, hashes = out.splitlines()
    assert Path(folder).is_relative_to(venv) and (Path(folder) / "README.md").is_file()
    from launcher.apply import verify as here

    assert hashes.split() == [t.sha256 for t in here.held_out()]
