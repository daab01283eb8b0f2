"""The engines (launcher/engines/): one module each behind one interface. A new engine is one
module, its template and its stand-in (for the sandbox): here a toy engine (TOY_MODULE, put in
tmp_path on the package's path, with its template beside it) is found, checks its config and is
planned with, and nothing else in the kit learns its name. Also what each engine asks of the
image before `up` starts it, with the messages `up` gives, and the flags' sources."""

import json
import shlex
import sys
from dataclasses import dataclass

import pytest
import yaml
from click.testing import CliRunner

from launcher import engines
from launcher.apply import serve
from launcher.cli.commands import main
from launcher.engines import tensorfold, vllm_native, vllm_ray
from launcher.inputs import config, vllm_flags


# The whole of a new engine: this module (dropped beside launcher/engines/' own) and its template.
TOY_MODULE = '''"""A toy server: `toyserve MODEL --listen PORT --peers N --me R --join HOST:PORT` on every rank."""

from pathlib import Path

from launcher.engines.base import AS_WRITTEN, Engine


class Toy(Engine):
    profile_engine = "toy"
    template = "toy.j2"
    templates_dir = Path(__file__).parent / "templates"
    flags = AS_WRITTEN  # passed as written after the managed ones
    master_port = 31000

    def managed(self, start):
        return [("--listen", (str(start.port),)), ("--peers", (str(start.n_ranks),)),
                ("--me", (str(start.rank),)), ("--join", (f"{start.master}:{start.master_port}",))]

    def config_problems(self, path, cluster, profile):
        return [f"{path}: ranks: the toy serves 4 ranks"] if len(cluster.ranks) != 4 else []

    def notes(self, master, n_ranks):
        return [f"toy: rank 0 at {master}"]


ENGINE = Toy()
'''
TOY_TEMPLATE = "toyserve {{ model | q }}{% for a in args %} {{ a | q }}{% endfor %}\n"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy engine found as launcher/engines/' own are: a module in the package's path."""
    folder = tmp_path / "more_engines"
    (folder / "templates").mkdir(parents=True)
    (folder / "toy.py").write_text(TOY_MODULE)
    (folder / "templates" / "toy.j2").write_text(TOY_TEMPLATE)
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(folder)])
    monkeypatch.setattr(engines, "_found", [])
    yield engines.pick("toy")
    sys.modules.pop("launcher.engines.toy", None)


def toy_config(tmp_path, write_config, ranks=None):
    profiles = tmp_path / "profiles"
    profiles.mkdir(exist_ok=True)
    profile = yaml.safe_load((config.PROFILES_DIR / "tensorfold.yaml").read_text())
    profile.update(engine="toy", served_name="toy-model", api_port=9000, args=["--colour blue"])
    (profiles / "toy.yaml").write_text(yaml.safe_dump(profile))

    def edit(d):
        d.update(profile="toy", profiles_dir=str(profiles))
        d["model"].pop("served_name", None)
        if ranks is not None:
            d["ranks"] = d["ranks"][:ranks]
    return write_config(edit)


def test_a_new_engine_is_one_module_and_its_template(toy, tmp_path, write_config, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = toy_config(tmp_path, write_config)
    loaded = config.load(path)
    assert loaded.engine is toy and toy.name == "toy" and loaded.flags == []  # flags: as written
    assert config.master_port(loaded) == 31000
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--json", "--offline"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    master = config.rendezvous(loaded)
    for r, rank in enumerate(plan["ranks"]):
        assert rank["engine"] == ["toyserve", loaded.cluster.model.serving_path, "--listen", "9000",
                                  "--peers", "4", "--me", str(r), "--join", f"{master}:31000",
                                  "--colour", "blue", *vllm_flags.split_lines(loaded.cluster.overrides.engine_args)]
        assert "VLLM_HOST_IP" not in rank["env"]  # no host_ip_env
        assert "VLLM_API_KEY" not in rank["env"]  # its key is not generated yet: `plan` only reads it
    assert plan["api"]["source"] == "not generated"
    assert plan["vllm_guard"] is None  # no startup_guard
    assert plan["notes"] == [f"toy: rank 0 at {master}"]


def test_a_toy_engines_config_check_is_asked(toy, tmp_path, write_config):
    path = toy_config(tmp_path, write_config, ranks=2)
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert e.value.problems == [f"{path}: ranks: the toy serves 4 ranks"]


def test_an_unknown_engine_is_refused_with_the_known_ones(tmp_path, write_config):
    path = toy_config(tmp_path, write_config)  # no toy registered
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert "engine: Input should be 'vllm' or 'tensorfold' (got 'toy')" in str(e.value)


def test_the_engine_is_picked_by_profile_and_multinode():
    assert engines.pick("vllm", "native") is vllm_native.ENGINE
    assert engines.pick("vllm", "ray") is vllm_ray.ENGINE
    assert engines.pick("tensorfold", "ray") is engines.pick("tensorfold", "native") is tensorfold.ENGINE
    assert [e.name for e in engines.engines()] == ["vllm_native", "vllm_ray", "tensorfold"]
    assert engines.profile_engines() == ["vllm", "tensorfold"]
    assert engines.multinode_modes() == ["native", "ray"]  # cluster.yaml's multinode: takes these


@dataclass
class Ran:
    ok: bool
    stdout: str = ""

    def why(self):
        return "exited 127: not found"


class Conn:
    """rank 0's connection: answers `docker run ... IMAGE ARGV` with `answer`."""

    def __init__(self, answer):
        self.answer, self.commands = answer, []
        self.target = type("T", (), {"name": "rank 0 (spark1)"})()

    def run(self, command, timeout=None):
        self.commands.append(command)
        return self.answer


def require(engine, n_ranks, answer):
    conn = Conn(answer)
    for need in engine.image_needs(n_ranks):
        serve.require_image(conn, "img:1", need)
    return [shlex.split(c)[-2:] for c in conn.commands]


def test_what_each_engine_asks_of_the_image():
    ok = Ran(True, "vllm 0.28.0\n")
    assert require(vllm_native.ENGINE, 4, ok) == [["vllm", "--version"]]
    assert require(vllm_ray.ENGINE, 4, ok) == [["ray", "--version"]]
    assert require(vllm_native.ENGINE, 1, Ran(False)) == require(vllm_ray.ENGINE, 1, Ran(False)) == []
    assert require(tensorfold.ENGINE, 4, Ran(False)) == []


@pytest.mark.parametrize("engine, answer, message", [
    (vllm_native.ENGINE, Ran(True, "0.10.2"), "img:1 has vLLM 0.10.2: native multi-node "
     "(--nnodes/--node-rank/--master-addr) needs 0.11.1 or newer; use a newer image"),
    (vllm_native.ENGINE, Ran(False), "rank 0 (spark1): cannot read the vLLM version of img:1 "
     "(`vllm --version` in the image failed); is it a vLLM image?"),
    (vllm_ray.ENGINE, Ran(False), "rank 0 (spark1): img:1 has no Ray (`ray --version` in the image: "
     "exited 127: not found); multinode: ray needs an image with Ray installed, or use multinode: native"),
])
def test_an_image_without_what_the_engine_needs_is_refused(engine, answer, message):
    with pytest.raises(serve.StartFailed) as e:
        require(engine, 4, answer)
    assert str(e.value) == message


def test_flags_carry_their_source(write_config):
    def edit(d):
        d["overrides"]["engine_args"] = ["--max-num-seqs 2", "--gpu-memory-utilization 0.8"]
    loaded = config.load(write_config(edit))
    sources = {f.key: f.source for f in loaded.flags}
    assert sources["max_num_seqs"] == sources["gpu_memory_utilization"] == vllm_flags.CONFIG
    assert sources["tensor_parallel_size"] == vllm_flags.PROFILE
    # the source is not part of what a flag is: the same option from elsewhere is equal
    assert vllm_flags.Flag("--max-num-seqs", ("2",), source="plan") == vllm_flags.find(loaded.flags, "max_num_seqs")


def test_a_need_the_image_met_is_not_asked_again_by_image_id(tmp_path, monkeypatch):
    """An image by ID never changes: the `docker run` that found its vLLM new enough is not run
    again for that ID; another ID, or one that failed, is asked afresh."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    (need,) = vllm_native.ENGINE.image_needs(4)
    conn = Conn(Ran(True, "vllm 0.28.0\n"))
    serve.require_image(conn, "img:1", need, "sha256:aa")
    serve.require_image(conn, "img:1", need, "sha256:aa")
    assert len(conn.commands) == 1
    serve.require_image(conn, "img:1", need, "sha256:bb")
    assert len(conn.commands) == 2
    old = Conn(Ran(True, "0.10.2"))
    for _ in range(2):
        with pytest.raises(serve.StartFailed):
            serve.require_image(old, "img:2", need, "sha256:cc")
    assert len(old.commands) == 2  # a no is never kept
