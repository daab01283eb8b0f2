"""Structure-aware cluster.yaml documents for fuzzing the config loader and the offline planner
(issue #19), and the verdict on one run: every input ends in exit 0, 2 or 3 with a message,
never a traceback. Used by tests/test_config_fuzz.py (a few hundred, in the suite) and
scripts/fuzz_config.py (thousands, with figures).

A document starts from env/cluster.example.yaml or the sandbox's cluster.yaml and gets a few
mutations: a field set to a value of another type or a nasty one (unicode, newlines, `=`, `:`,
`{{`, huge, negative, infinite, null, lists for dicts), a key dropped or an unknown one added,
engine_args lines built from vLLM flags and the values that broke the planner, env entries,
profile names; then, sometimes, the text itself: non-UTF-8 bytes, YAML directives, deep nesting,
truncation.
"""

from __future__ import annotations

import copy
import json
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml
from click.testing import CliRunner
from hypothesis import strategies as st

from launcher.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]


def sandbox_document() -> dict:
    """The sandbox's cluster.yaml as `sandbox up` writes it (no sandbox needed)."""
    from launcher.sandbox import cluster, fabric_fixture as sfabric

    ranks = [{"name": f"spark{i + 1}", "address": f"172.31.240.{11 + i}", "user": "spark",
              "fabric_ips": [sfabric.fabric_truth(i)["fabric_ip"]], "sysfs_root": "/sandbox/sysfs"}
             for i in range(4)]
    return {"profile": "sandbox", "topology": "ring", "ranks": ranks, "model": {"path": cluster.MODEL_PATH},
            "container": {"gpus": None, "devices": []}}


BASES = {"example": yaml.safe_load((ROOT / "env" / "cluster.example.yaml").read_text()),
         "sandbox": sandbox_document()}

# Settings the bases leave out, so that mutations reach them too.
OPTIONAL_PATHS = [("rendezvous",), ("multinode",), ("profiles_dir",), ("fabric", "gid_index"),
                  ("nccl", "host_lib"), ("nccl", "env"), ("model", "nfs"), ("model", "served_name"),
                  ("images", "base"), ("images", "patches_dir"), ("overrides", "api_port"),
                  ("overrides", "api_key"), ("overrides", "sysctls"), ("overrides", "utilization_margin"),
                  ("overrides", "headroom_gib"), ("overrides", "runtime_overhead_gib"),
                  ("ssh", "dead_after_s"), ("ssh", "known_hosts"), ("ranks", 0, "jump"),
                  ("ranks", 1, "sysfs_root"), ("ranks", 0, "key"), ("container", "nofile")]

NASTY_STRINGS = ["", " ", "a\nb", "A=B", "=", "/a:b", ":", "{{ x }}", "{% if x %}", "~nosuchuser/x", "~",
                 "/proc", "/", ".", "..", "x" * 300, "\u202e", "caf\u00e9", "\x00", "a\x00b", "\t", "null",
                 "None", "auto", "-1", "0", "1e999", "nan", "inf", "\u0661\u0662", "'", '"', "\\", "$HOME",
                 "%h", "--flag", "a b", "192.168.1.300", "::1", "127.0.0.1", "user@host:notaport",
                 "/models/x", "keys-1m-dcp4", "ring", "switch", "\ud7ff", "\U0001f600"]
NASTY_NUMBERS = [float("inf"), float("-inf"), float("nan"), 1e308, -1e308, 0, -1, -5, 1, 4, 65536, 2**31,
                 2**63, 2**64 + 1, -2**70, 10**30, 0.5, 1.5, -0.0, True, False]

PROFILE_NAMES = ["keys-1m-dcp4", "keys35-1m-dcp4", "keys35-200k", "pollard-180k", "sandbox", "tensorfold",
                 "", "sandbox/../sandbox", "../../etc/passwd", "x" * 300, "caf\u00e9", "keys-1m-dcp4\n", ".",
                 "-", "sandbox.yaml", "\x00"]

FLAGS = ["-tp", "--tensor-parallel-size", "-pp", "--pipeline-parallel-size", "-dcp",
         "--decode-context-parallel-size", "--max-model-len", "--kv-cache-memory-bytes",
         "--gpu-memory-utilization", "--speculative-config", "--max-num-seqs", "--kv-cache-dtype",
         "--enable-prefix-caching", "--no-enable-prefix-caching", "--compilation-config.pass_config.x",
         "--port", "--served-model-name", "--max-model-lenn", "--api-key", "--nnodes", "-O",
         "--hf-overrides", "--additional-config", "--tokenizer-mode", "--seed", "--swap-space"]
FLAG_VALUES = ["0", "-1", "-5", "1", "2", "4", "abc", "1e999", "1k", "1K", "1.5", "1.5K", "1.5k", "null",
               "None", "auto", "AUTO", "{}", "[]", "''", "'\"'", "'{\"method\": \"mtp\"}'",
               "'{\"method\": [1]}'", "'{\"method\":\"mtp\",\"num_speculative_tokens\":-3}'", "nan", "inf",
               "-inf", "0.5", "1.01", "99999999999999999999999", "'{{ x }}'", "'a b'", "1_000", "0x10",
               "'[1]'", "true", "'\u0661\u0662'"]
# the options that size the plan, each with plausible values (the plan runs, or refuses with exit 3)
# and the ones that broke it (issue #19)
SIZE_VALUES = {"--max-model-len": ["auto", "-1", "65536", "1k", "10000000000", "-5", "0", "1.5", "{}", "1_000"],
               "-dcp": ["1", "2", "4", "0", "-1", "abc", "1e999", "1k", "null"],
               "-tp": ["4", "0", "-2", "2"], "-pp": ["1", "-2", "4"],
               "--kv-cache-memory-bytes": ["None", "1g", "100g", "14092861440", "0", "-5", "1.5K", "''"],
               "--gpu-memory-utilization": ["0.5", "0.9", "0", "nan", "inf", "1.5"]}
RAW_LINES = ["'unbalanced", "--max-model-len", "-tp", "--tensor-parallel-size=4=4", "--", "-", "4",
             "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'", "\\", "--=x"]

ENV_KEYS = ["NCCL_DEBUG", "A\nB", "A=B", "", " ", "1X", "NCCL_IB_GID_INDEX", "VLLM_API_KEY", "LD_PRELOAD",
            "caf\u00e9", "X Y"]


def scalars():
    return st.one_of(st.none(), st.sampled_from(NASTY_NUMBERS), st.integers(), st.floats(),
                     st.sampled_from(NASTY_STRINGS), st.text(max_size=12))


def values():
    """Any YAML value: scalars, and small lists and mappings of them (a list where a mapping goes)."""
    return st.recursive(scalars(), lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(NASTY_STRINGS) | st.text(max_size=6), inner, max_size=3),
                        max_leaves=6)


def like(current):
    """A value of the same kind as `current` (so that the document often stays valid and the
    planner runs): another number for a number, another string for a string."""
    if isinstance(current, bool) or current is None:
        return scalars()
    if isinstance(current, (int, float)):
        return st.one_of(st.sampled_from([n for n in NASTY_NUMBERS if not isinstance(n, bool)]),
                         st.integers(-10, 2**40), st.floats(-1e6, 1e6))
    if isinstance(current, str):
        return st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=20))
    if isinstance(current, list):
        return st.lists(st.sampled_from(NASTY_STRINGS) | st.text(max_size=10), max_size=3)
    return values()


def engine_line():
    flag = st.builds(lambda f, vs, eq: f"{f}={vs[0]}" if eq and vs else " ".join([f, *vs]),
                     st.sampled_from(FLAGS), st.lists(st.sampled_from(FLAG_VALUES), max_size=2), st.booleans())
    size = st.sampled_from(sorted(SIZE_VALUES)).flatmap(
        lambda f: st.sampled_from(SIZE_VALUES[f]).map(lambda v: f"{f} {v}"))
    return st.one_of(size, size, size, flag, st.sampled_from(RAW_LINES), st.text(max_size=15))


def _paths(node, prefix=()):
    """Every key or index path in a document (not the root)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from _paths(child, prefix + (key,))


def _parent(doc, path, create: bool):
    """The container holding path[-1], creating missing mappings on the way when `create`."""
    node = doc
    for key in path[:-1]:
        if isinstance(node, dict) and create and not isinstance(node.get(key), (dict, list)):
            node[key] = {}
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node if isinstance(node, (dict, list)) else None


def _set(doc, path, value) -> None:
    parent = _parent(doc, path, create=True)
    if isinstance(parent, dict) or (isinstance(parent, list) and isinstance(path[-1], int)
                                    and path[-1] < len(parent)):
        parent[path[-1]] = value


def _drop(doc, path) -> None:
    parent = _parent(doc, path, create=False)
    if isinstance(parent, dict):
        parent.pop(path[-1], None)
    elif isinstance(parent, list) and isinstance(path[-1], int) and path[-1] < len(parent):
        del parent[path[-1]]


@st.composite
def mutate(draw, doc: dict) -> None:
    """One change to `doc`, in place."""
    kind = draw(st.sampled_from(["like"] * 3 + ["engine_args"] * 4 + ["set", "optional", "drop", "unknown",
                                                                      "env", "profile", "ranks"]))
    existing = sorted(_paths(doc), key=repr)
    if kind == "like" and existing:
        path = draw(st.sampled_from(existing))
        _set(doc, path, draw(like(_parent(doc, path, create=False)[path[-1]])))
    elif kind == "set" and existing:
        _set(doc, draw(st.sampled_from(existing)), draw(values()))
    elif kind == "optional":
        _set(doc, draw(st.sampled_from(OPTIONAL_PATHS)), draw(values()))
    elif kind == "drop" and existing:
        _drop(doc, draw(st.sampled_from(existing)))
    elif kind == "unknown":
        dicts = [()] + [p for p in existing if isinstance(_parent(doc, p + ("x",), False), dict)]
        _set(doc, draw(st.sampled_from(dicts)) + (draw(st.sampled_from(NASTY_STRINGS)),), draw(values()))
    elif kind == "engine_args":
        _set(doc, ("overrides", "engine_args"), draw(st.lists(engine_line(), min_size=1, max_size=3)))
    elif kind == "env":
        env = draw(st.dictionaries(st.sampled_from(ENV_KEYS), st.sampled_from(NASTY_STRINGS), max_size=3))
        _set(doc, draw(st.sampled_from([("overrides", "env"), ("nccl", "env")])), env)
    elif kind == "profile":
        _set(doc, ("profile",), draw(st.sampled_from(PROFILE_NAMES)))
    elif kind == "ranks":  # fewer or more ranks than the profile's parallelism
        ranks = doc.get("ranks") if isinstance(doc.get("ranks"), list) else []
        doc["ranks"] = ranks[:draw(st.integers(0, len(ranks)))] * draw(st.integers(1, 3))


DEEP = "__fuzz_deep__"


@st.composite
def written(draw, doc: dict) -> bytes:
    """The document as YAML text, or damaged: bytes that are not UTF-8, YAML syntax, a value
    nested up to 1,500 deep, a cut, another encoding."""
    kind = draw(st.sampled_from(["none"] * 20 + ["bytes", "deep", "cut", "utf16", "binary"]))
    if kind == "deep":
        _set(doc, draw(st.sampled_from([("profile",), ("overrides", "env"), ("ranks",), ("model", "path")])), DEEP)
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    data = text.encode()
    if kind == "bytes":
        at = draw(st.integers(0, len(data)))
        junk = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\x80", b"\xc3", b"\x00", b"\t", b"{{", b": :",
                                     b"&a ", b"*a", b"!!python/object:os.system ", b"\n- ", b"\n---\n",
                                     b"%YAML 1.1\n", b"? ", b"\x1b[31m", b"\xef\xbb\xbf"]))
        data = data[:at] + junk + data[at:]
    elif kind == "deep":
        depth = draw(st.integers(1, 1500))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
        data = text.replace(DEEP, opener * depth + closer * depth).encode()
    elif kind == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif kind == "utf16":
        data = text.encode("utf-16")
    elif kind == "binary":
        data = draw(st.binary(max_size=64))
    return data


@st.composite
def documents(draw) -> bytes:
    doc = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3, 4]))):
        draw(mutate(doc))
    return draw(written(doc))


@dataclass
class Outcome:
    exit_code: int
    problem: str | None  # None: a clean end (exit 0 with the plan's JSON, or 2/3 with a message)


def run_plan(data: bytes) -> Outcome:
    """`sparkstack plan --offline --json` on the document, in-process, and the verdict."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "cluster.yaml"
        path.write_bytes(data)
        result = CliRunner().invoke(main, ["plan", "--offline", "--json", "-c", str(path)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(*result.exc_info))
        return Outcome(result.exit_code, f"traceback:\n{trace}")
    if result.exit_code == 0:
        try:
            json.loads(result.stdout)["ranks"]
        except (ValueError, KeyError, TypeError) as e:
            return Outcome(0, f"exit 0 without the plan's JSON ({e}): {result.stdout[:300]!r}")
        return Outcome(0, None)
    if result.exit_code not in (2, 3):
        return Outcome(result.exit_code, f"exit {result.exit_code}: {result.output[-500:]}")
    lines = result.stderr.strip().splitlines()
    if not lines or not all(line.startswith("error: ") and line[len("error: "):].strip() for line in lines):
        return Outcome(result.exit_code, f"exit {result.exit_code} without one `error:` line per problem: "
                                         f"{result.stderr[-500:]!r}")
    return Outcome(result.exit_code, None)
