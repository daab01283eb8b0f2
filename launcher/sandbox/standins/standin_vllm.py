#!/usr/bin/env python3
"""SANDBOX STAND-IN for `vllm serve` (vLLM 0.33). This is NOT vLLM: it loads no model and needs
no GPU. It is installed as `/usr/local/bin/vllm` in the sandbox's `sandbox-vllm` image so the kit
can be exercised end to end on a laptop. Standard library only (Debian bookworm's python3).

What it mimics, for what the kit touches:
- argv: `vllm serve [MODEL] [flags]` is parsed against vLLM 0.33's own option table (a JSON file:
  option -> {dest, nargs, choices, type, value}) the way vLLM's FlexibleArgumentParser does:
  `--opt=v`, `--opt_name` == `--opt-name`, dotted sub-keys
  (`--compilation-config.pass_config.fuse_allreduce_rms=true`), and every value converted and
  checked by the option's own parser ("value": int, float, human-readable int, JSON, config
  dataclass keys, choices, `None` for Optional options, switches). Anything vLLM's parser would
  refuse exits 2 with its message ("argument --max-num-seqs: invalid int value: 'x'",
  "unrecognized arguments: --foo").
  `vllm --version` prints the version.
- it records its argv, parsed options and full environment as JSON (see write_record) so tests
  can assert on exactly what the launcher started;
- it starts like vLLM 0.33, refusing what vLLM refuses, with vLLM's message:
  * the model: `<model>/config.json` must be there and parse, with weights beside it
    (`*.safetensors` or their index) -- a checkpoint that is not mounted fails;
  * vLLM's engine configuration (standin_engine_config.py, beside this file; messages from vLLM
    0.33.0's source): a --max-model-len above config.json's max_position_embeddings without
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, a quant_method neither stock vLLM nor the image registers,
    the Ray executor without an importable `ray`; after the memory guard, the attention backend:
    sparse MLA with DCP on compute capability 12.x (SANDBOX_VLLM_COMPUTE_CAPABILITY, 12.1) or
    --attention-backend CUSTOM without a registered backend. What the image registers: its
    `vllm` package's files that say SANDBOX_REGISTERS (the chain stages' patches);
    `validate(argv)` runs the same checks alone (check's engine row: launcher/onrank/engine_config.py);
  * multi-node (`--nnodes N --node-rank R --master-addr A [--master-port P] [--headless]`): the
    ranks meet at A:P and open the connections torch.distributed, NCCL and Gloo open, over the
    interfaces the environment selects (standin_dist.py, beside this file);
  * then vLLM's startup guard (`request_memory`, run by every worker whether or not
    `--kv-cache-memory-bytes` is given): free memory = MemAvailable - what the worker holds
    (SANDBOX_VLLM_HELD_GIB) must be >= MemTotal x --gpu-memory-utilization (default 0.92);
- then it "loads" (see load_model): it reads every shard of the checkpoint (Reader: as vLLM's
  default loader, at the sandbox's NFS link speed, counted in /proc/<pid>/io read_bytes), and
  over SANDBOX_VLLM_LOAD_S it takes its weights, then its KV
  pool (--kv-cache-memory-bytes), then its CUDA graphs, each registered with the rank's memory
  model (standin_mem.py: /sandbox/mem, in the rank's meminfo while this process lives), and
  reports the checkpoint bytes it reads so the rank's page cache fills. Strict like a GB10: an
  allocation that does not fit in MemFree (the page cache is not reclaimed for the GPU on
  unified memory) dies with CUDA's out-of-memory error and NVRM's NV_ERR_NO_MEMORY, exit 1.
  Without /sandbox/mem (SPARKSTACK_SANDBOX_MEMINFO=host, or run outside the sandbox) it only
  waits SANDBOX_VLLM_LOAD_S;
- `--headless` serves nothing (a multi-node worker rank) until SIGTERM;
- otherwise the OpenAI API: GET /health, /v1/models, /metrics (vLLM 0.33's metric families,
  standin_metrics.py), /version, POST /v1/chat/completions (streaming SSE with usage, thinking
  as `reasoning` with --reasoning-parser, else inside <think> in the content, a needle-answering
  trick) and POST /v1/completions (prompt text or token ids, echo, logprobs, prompt_logprobs
  from standin_lm's small deterministic model), paced at a configurable token rate, with
  optional `--api-key`. What a request may ask, and the bodies, are vLLM 0.33's
  (standin_requests.py: a prompt + max_tokens beyond the context shortens max_tokens; a prompt
  that alone does not fit, max_tokens below 1 or above the context are refused with vLLM's
  messages). Requests go through a scheduler as vLLM's do (Engine): they wait until fewer
  than --max-num-seqs run and their prompt fits in the KV cache;
- SIGUSR1 wedges the scheduler for good (a test's fault, as a hung collective or a stuck step
  does on a real engine): /health still answers, nothing is scheduled and no token produced;
  `docker kill -s USR1 sparkstack-engine` on a rank switches it on while serving.

Environment knobs (all optional):
  SANDBOX_VLLM_VERSION              version string (0.33.0)
  SANDBOX_VLLM_FLAGS                option table (/usr/share/sandbox-vllm/serve-flags.json)
  SANDBOX_VLLM_RECORD               record file (/var/log/sandbox-vllm/record.json)
  SANDBOX_VLLM_TOKENS_PER_S         per-stream decode rate (40)
  SANDBOX_VLLM_TTFT_S               fixed time to first token (0.05), plus prefill:
  SANDBOX_VLLM_PREFILL_TOKENS_PER_S prompt tokens per second of prefill (5000)
  SANDBOX_VLLM_ACCEPTED_PER_DRAFT   spec-decode accepted tokens per draft (1.5)
  SANDBOX_VLLM_STARTUP_S            delay before the API port opens, like weight loading (0)
  SANDBOX_VLLM_FAIL                 exit:<code> (crash after the startup log) | malformed (broken
                                    SSE chunks / JSON bodies) | wedge (wedged from the start, as
                                    after SIGUSR1) | unset = normal
  SANDBOX_VLLM_KV_TOKENS            the KV cache's size in tokens (max(--max-model-len, 131072))
  SANDBOX_VLLM_FAIL_NODE_RANK       if set, the exit:<code> fault applies only to that --node-rank
  SANDBOX_VLLM_MEMINFO              the meminfo the startup guard reads (/proc/meminfo: in the
                                    sandbox, the rank's GB10 figures)
  SANDBOX_VLLM_HELD_GIB             what a worker holds (CUDA context, NCCL, cuBLAS) when vLLM's
                                    startup guard measures free memory (14, seed 000's figure)
  SANDBOX_VLLM_LOAD_S               how long loading takes, split 80/10/10 over weights, KV pool
                                    and graphs (0: all at once)
  SANDBOX_VLLM_WEIGHTS_GIB          weights this rank holds (default: the checkpoint's
                                    *.safetensors bytes / --tensor-parallel-size); it reads as
                                    many bytes (page cache), in up to 16 steps
  SANDBOX_VLLM_NFS_PATH             the sandbox's "NFS" mount (/models/glm53-sandbox): a checkpoint
                                    under it is read at the link's speed, elsewhere unthrottled
  SANDBOX_VLLM_NFS_IFACE            the interface whose sysfs `speed` (Mb/s, in SANDBOX_SYSFS_ROOT,
                                    /sandbox/sysfs) is that link's line rate (eth0)
  SANDBOX_VLLM_READ_MBPS            that line rate, instead of the sysfs file; it is shared by the
                                    --nnodes ranks reading the one server port at once
  SANDBOX_VLLM_GRAPHS_GIB           CUDA graphs and activations taken after the KV pool (0.5)
  SANDBOX_VLLM_COMPILE_S            torch.compile's time on an empty compile cache (0); with the
                                    cache warm (VLLM_CACHE_ROOT, default ~/.cache/vllm, holding
                                    this model's compiled graphs) it is skipped, as vLLM does
  SANDBOX_VLLM_MEM_DIR              the rank's memory state (/sandbox/mem); absent: no accounting
  SANDBOX_VLLM_PREFILL_KIB_PER_TOKEN memory a prompt's prefill takes per prompt token while
                                    serving (64: a 128K-token prompt takes 8 GiB); see PrefillMemory
  SANDBOX_VLLM_DIST_TIMEOUT_S       how long multi-node ranks wait for each other (120)
  SANDBOX_VLLM_MIN_NOFILE           if set, refuse (exit 1) a soft RLIMIT_NOFILE below it, like
                                    NCCL's "Too many open files" at 4 ranks
  SANDBOX_RAY_WAIT_S                with --distributed-executor-backend ray: how long to wait for
                                    TP x PP nodes at the (stand-in) Ray head (60), as vLLM waits
                                    for its placement group (RAY_ADDRESS, else 127.0.0.1:6379)
  VLLM_API_KEY                      API key when --api-key is not given (as vLLM does)
  SANDBOX_VLLM_COMPUTE_CAPABILITY   the GPU's compute capability the attention backend is chosen
                                    for (12.1, a GB10)

Chat prompt tokens are counted deterministically as round(1.3 x whitespace-separated words) over
all message texts (at least 1); each generated chat token is one word. Completions count
standin_lm's tokens: one per UTF-8 byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:  # vLLM's value parsers, the kit's own: installed beside the stand-ins in the image's dist-packages
    import vllm_options
except ImportError:  # run from the repository: the kit's file itself, launcher/inputs/vllm_options.py
    import importlib.util

    _spec = importlib.util.spec_from_file_location("vllm_options", os.path.join(
        os.path.dirname(os.path.realpath(__file__)), "..", "..", "inputs", "vllm_options.py"))
    vllm_options = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(vllm_options)

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))  # the sibling stand-ins, run from the repository
import standin_metrics  # noqa: E402  (installed beside this file in the image)

DEFAULT_FLAGS = "/usr/share/sandbox-vllm/serve-flags.json"
DEFAULT_RECORD = "/var/log/sandbox-vllm/record.json"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # what `vllm serve` uses when no model is named
DEFAULT_MAX_NUM_SEQS = 256  # vLLM 0.33's --max-num-seqs default for the API server on a GB10
KV_BLOCK = 16  # tokens per KV block (vLLM's default --block-size)
ANSWER = ("Four small machines share one model and each holds a slice of every layer while the "
          "fabric between them carries partial sums back and forth for every token that leaves "
          "the server so the answer arrives one word at a time at a steady pace").split()
REASONING = "Let me think about what is being asked and answer it plainly.".split()
ASKS_FOR_NEEDLE = re.compile(r"\b(secret|code|needle|password|passphrase)\b", re.I)
NEEDLE_FACT = re.compile(r"\b(secret|code|needle|password|passphrase)\b.*\bis\b.*\d", re.I)
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


def knob(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def log(msg: str, level: str = "INFO") -> None:
    """vLLM-style log line on stderr, marked as the stand-in so nobody mistakes it."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [sandbox-standin] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- argv, like FlexibleArgumentParser
# Each option's "value" entry in the table says how vLLM converts its values; the format and vLLM's
# value parsers are in vllm_options (launcher/inputs/vllm_options.py, shared with the kit's flag
# checks); below is vLLM's argparse around them.

TOP_USAGE = ("usage: vllm [-h] [-v]\n            {chat,complete,serve,launch,bench,collect-env,"
             "download-kernels,preload,run-batch,snapshot}\n            ...")


class Switch(argparse.Action):
    """store_true, BooleanOptionalAction and EnableDisableAction: each option string of the
    action sets its own value (`--enable-x` True, `--no-enable-x`/`--disable-x` False)."""

    def __init__(self, option_strings, dest, sets: dict, **kw):
        super().__init__(option_strings, dest, nargs=0, **kw)
        self.sets = sets

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.sets[option_string])


class LoRAModules(argparse.Action):
    """vLLM's LoRAParserAction: `name=path`, or a JSON object."""

    def __call__(self, parser, namespace, values, option_string=None):
        modules = []
        for item in values:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=", 1)
                modules.append({"name": name, "path": path})
                continue
            try:
                modules.append(json.loads(item))
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
        setattr(namespace, self.dest, modules)


def build_parser(table: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]",
                                     allow_abbrev=False)  # vLLM turns abbreviations off too
    parser.add_argument("model_tag", nargs="?", default=argparse.SUPPRESS)
    # One argparse action per vLLM action: its options share the name argparse reports
    # ("--speculative-config/-sc", "--enable-x/--disable-x").
    actions: dict[str, list[str]] = {}
    for opt, spec in table.items():
        if spec["value"]["kind"] != "help":  # argparse brings its own -h/--help
            actions.setdefault(spec["value"]["argument"], []).append(opt)
    for name, opts in actions.items():
        action = parser.add_argument(*opts, **argument_kwargs(table, opts))
        action.option_strings = name.split("/")  # what messages name, as in vLLM
    return parser


def argument_kwargs(table: dict, opts: list[str]) -> dict:
    spec = table[opts[0]]
    value = spec["value"]
    # SUPPRESS: the namespace then holds exactly what was given, which is what we record.
    kw: dict = {"dest": spec["dest"], "default": argparse.SUPPRESS}
    if value["kind"] == "switch":
        return {**kw, "action": Switch, "sets": {o: table[o]["value"]["sets"] for o in opts}}
    kw["type"] = vllm_options.converter(spec)
    if spec["nargs"] in ("+", "?"):
        kw["nargs"] = spec["nargs"]
    if "const" in value:
        kw["const"] = value["const"]
    if "choices" in value:
        kw["choices"] = value["choices"]
    if value.get("append"):
        kw["action"] = "append"
    if value.get("action") == "lora_modules":
        kw["action"] = LoRAModules
    return kw


def normalise_argv(args: list[str]) -> list[str]:
    """FlexibleArgumentParser's rewrite: `--a_b` -> `--a-b`, `-O3` -> `--optimization-level 3`,
    and the dotted sub-keys of one option string (`--x.a.b=1 --x.c 2`, `--x.l+ a,b`) merged into
    one JSON value appended as `--x '{"a":{"b":1},"c":2,"l":["a","b"]}'`. Like vLLM, `-cc.a` and
    `--compilation-config.b` are two values, the later one winning."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, rest = key.partition(".")
            out.append(head.replace("_", "-") + dot + rest + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        else:
            out.append(arg)
    merged: dict[str, dict] = {}
    kept: list[str] = []
    i = 0
    while i < len(out):
        arg, i = out[i], i + 1
        key, eq, value = arg.partition("=")
        if not (arg.startswith("-") and "." in key):  # as vLLM tests it (so `-0.5` is a key too)
            kept.append(arg)
            continue
        if not eq:
            if i >= len(out):  # vLLM indexes past the end here
                sys.exit("Traceback (most recent call last):\nIndexError: list index out of range")
            value, i = out[i], i + 1
        if key.endswith("+"):
            key, value = key[:-1], json.dumps(value.split(","))
        base, *path = key.split(".")
        nested = vllm_options.dotted_value(value)
        for part in reversed(path):
            nested = {part: nested}
        update_nested(merged.setdefault(base, {}), nested)
    for base, value in merged.items():
        kept += [base, json.dumps(value)]
    return kept


def update_nested(original: dict, update: dict) -> None:
    """vLLM's recursive_dict_update: dicts merge, lists concatenate, anything else replaces."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            update_nested(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] += v
        else:
            original[k] = v


def parse_serve(args: list[str], table: dict) -> tuple[str, dict]:
    """Returns (model, options given as dest -> value); exits 2 like vLLM on anything bad.
    Unknown arguments are reported by `vllm`'s own parser, as in vLLM."""
    parser = build_parser(table)
    ns, unknown = parser.parse_known_args(normalise_argv(args))
    if unknown:
        print(f"{TOP_USAGE}\nvllm: error: unrecognized arguments: {' '.join(unknown)}",
              file=sys.stderr)
        sys.exit(2)
    options = vars(ns)
    model = options.pop("model_tag", None) or options.get("model") or DEFAULT_MODEL
    return model, options


def write_record(path: str, argv: list[str], model: str, options: dict, mode: str) -> None:
    """The record: {"argv": [after `vllm`], "model", "mode": "api"|"headless", "options":
    {dest: value, only those given}, "env": {full environment}, "patches": [the sandbox patch
    files the image chain installed], "pid", "version", "started_at"}.
    Written atomically so a reader never sees half a file."""
    record = {"argv": argv, "model": model, "mode": mode, "options": options,
              "env": dict(os.environ), "patches": installed_patches(), "pid": os.getpid(),
              "version": os.environ.get("SANDBOX_VLLM_VERSION", "0.33.0"),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json_atomically(path, record)


def write_json_atomically(path: str, obj) -> None:
    """A record file a reader never sees half written (tests read it while the engine runs)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def installed_patches() -> list[str]:
    """Files of the stand-in vllm package that the sandbox's image chain replaced or added
    (each sandbox patch file says SANDBOX_PATCH): proof of which image a rank really runs."""
    found = []
    for site in sys.path:
        root = os.path.join(site, "vllm")
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    with open(path, "rb") as f:
                        if b"SANDBOX_PATCH" in f.read(4096):
                            found.append(os.path.relpath(path, site))
                except OSError:
                    continue
    return sorted(set(found))


FAULT = re.compile(rb"^SANDBOX_FAULT\s*=\s*[\"']([a-z]+)(?::(\d+))?[\"']", re.M)


def image_fault() -> tuple[str | None, int | None]:
    """A broken overlay the sandbox chain's variant installed (a patch file of the image's `vllm`
    package that says SANDBOX_FAULT = "noise", like a patch that narrows a shard: every answer
    is noise; or "crowded:N": noise only while N or more requests run at once): (kind, N)."""
    for site in sys.path:
        for folder, _, files in os.walk(os.path.join(site or ".", "vllm")):
            for name in sorted(files):
                try:
                    with open(os.path.join(folder, name), "rb") as f:
                        match = FAULT.search(f.read(4096))
                except OSError:
                    continue
                if match:
                    kind, n = match.group(1).decode(), match.group(2)
                    log(f"SANDBOX STAND-IN: {os.path.join(folder, name)} declares the fault "
                        f"{kind}{':' + n.decode() if n else ''}", "WARNING")
                    return kind, int(n) if n else None
    return None, None


GIB = 1024 ** 3
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM 0.33's CacheConfig default
DEFAULT_MASTER_PORT = 29501  # vLLM 0.33's --master-port default


def read_meminfo(path: str) -> dict[str, int]:
    """/proc/meminfo as {field: bytes}."""
    out = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def memory_guard(options: dict) -> str | None:
    """vLLM's `request_memory` (vllm/v1/worker/utils.py): on a GB10 the device's free memory is
    MemAvailable less what this worker already holds; total is MemTotal."""
    info = read_meminfo(os.environ.get("SANDBOX_VLLM_MEMINFO", "/proc/meminfo"))
    total = info["MemTotal"]
    free = info.get("MemAvailable", info.get("MemFree", 0)) - knob("SANDBOX_VLLM_HELD_GIB", 14) * GIB
    util = options.get("gpu_memory_utilization")
    util = DEFAULT_GPU_MEMORY_UTILIZATION if util is None else float(util)
    if free < total * util:
        return (f"ValueError: Free memory on device cuda:0 ({free / GIB:.2f}/{total / GIB:.2f} GiB) "
                f"on startup is less than desired GPU memory utilization ({util}, "
                f"{total * util / GIB:.2f} GiB). Decrease GPU memory utilization or reduce GPU "
                f"memory used by other processes.")
    return None


def nofile_guard() -> str | None:
    need = os.environ.get("SANDBOX_VLLM_MIN_NOFILE")
    have = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if need and have != resource.RLIM_INFINITY and have < int(need):
        return ("RuntimeError: NCCL error: unhandled system error "
                f"(Too many open files, nofile={have})")
    return None


def read_model(model: str) -> str | None:
    """What vLLM's config loading and weight loader refuse: no config.json, a broken one, or no
    weights beside it. Returns the error or None."""
    config = os.path.join(model, "config.json")
    if not os.path.isfile(config):
        return (f"ValueError: Invalid repository ID or local directory specified: '{model}'.\n"
                "Please verify the following requirements:\n1. Provide a valid Hugging Face "
                "repository ID.\n2. Specify a local directory that contains a recognized "
                "configuration file.")
    try:
        with open(config) as f:
            json.load(f)
    except (OSError, ValueError) as e:
        return f"OSError: It looks like the config file at '{config}' is not a valid JSON file. ({e})"
    names = os.listdir(model)
    if not any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names):
        return f"RuntimeError: Cannot find any model weights with `{model}`"
    return None


def join_cluster(options: dict) -> str | None:
    """Multi-node: meet the other ranks and connect as the real stack does
    (standin_dist.form_cluster); None when every connection was made. vLLM's own executor meets
    at --master-addr:--master-port; on Ray the driver (this process, on the head) asks every Ray
    worker to join it at this node's address."""
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import standin_dist

    ray = options.get("distributed_executor_backend") == "ray"
    nnodes = ray_world(options) if ray else int(options.get("nnodes") or 1)
    if nnodes <= 1:
        return None
    master = options.get("master_addr") or "127.0.0.1"
    port = int(options.get("master_port") or DEFAULT_MASTER_PORT)
    if ray:
        import standin_ray

        address = os.environ.get("RAY_ADDRESS", "127.0.0.1:6379")
        master = os.environ.get("VLLM_HOST_IP") or address.rpartition(":")[0]
        if not standin_ray.form(address, master, port):
            return f"the Ray head at {address} did not hand out the rendezvous"
    log(f"node rank {options.get('node_rank', 0)} of {nnodes}: rendezvous at {master}:{port}")
    return standin_dist.as_pynccl(standin_dist.form_cluster(
        node_rank=int(options.get("node_rank") or 0), nnodes=nnodes, master_addr=master,
        master_port=port, env=os.environ, timeout_s=knob("SANDBOX_VLLM_DIST_TIMEOUT_S", 120),
        stop=STOP, log=log))


# ---------------------------------------------------------------- loading, on a GB10's memory

def checkpoint_bytes(model: str) -> int:
    try:
        return sum(os.path.getsize(os.path.join(model, n)) for n in os.listdir(model)
                   if n.endswith(".safetensors"))
    except OSError:
        return 0


def load_steps(model: str, options: dict) -> list[tuple[str, int, int, float]]:
    """(what, bytes to allocate, bytes read first, seconds) of each loading step."""
    load_s = knob("SANDBOX_VLLM_LOAD_S", 0)
    tp = int(options.get("tensor_parallel_size") or 1)
    weights = (int(knob("SANDBOX_VLLM_WEIGHTS_GIB", 0) * GIB) if "SANDBOX_VLLM_WEIGHTS_GIB" in os.environ
               else checkpoint_bytes(model) // tp)
    n = max(1, min(16, -(-weights // GIB)))
    steps = [("weights", weights // n + (weights % n if i == n - 1 else 0), 0, 0.8 * load_s / n)
             for i in range(n)]
    steps = [(what, size, size, secs) for what, size, _, secs in steps]
    steps.append(("KV cache", int(options.get("kv_cache_memory_bytes") or 0), 0, 0.1 * load_s))
    steps.append(("CUDA graphs", int(knob("SANDBOX_VLLM_GRAPHS_GIB", 0.5) * GIB), 0, 0.1 * load_s))
    return steps


def oom_message(size: int, info: dict, held: int) -> str:
    """torch's CUDA OOM as a GB10 shows it (the driver's NVRM line is the field's clue)."""
    total, free = info["MemTotal"], info.get("MemFree", 0)
    return (f"NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] "
            f"(0x00000051) returned from _memdescAllocInternal(pMemDesc)\n"
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {size / GIB:.2f} GiB. "
            f"GPU 0 has a total capacity of {total / GIB:.2f} GiB of which {free / GIB:.2f} GiB is "
            f"free. Including non-PyTorch memory, this process has {held / GIB:.2f} GiB memory in "
            f"use. Of the allocated memory {held / GIB:.2f} GiB is allocated by PyTorch, and 0 "
            f"bytes is reserved by PyTorch but unallocated. (CUDA error: out of memory; "
            f"cudaMalloc failed: NV_ERR_NO_MEMORY)")


class Reader:
    """Reads the checkpoint as vLLM's default loader does: every tensor of every shard on every
    rank (safetensors_weights_iterator: safe_open + get_tensor for each name; each rank keeps its
    slice of what it read), so every shard file whole, in name order. Under the sandbox's NFS
    path (SANDBOX_VLLM_NFS_PATH) at the link's line rate (sysfs `speed` of
    SANDBOX_VLLM_NFS_IFACE, or SANDBOX_VLLM_READ_MBPS) shared by the --nnodes ranks, which read
    the one server port at once; elsewhere (a local copy) as fast as the disk gives.
    With O_DIRECT, so every byte is fetched from the block layer and counted in this process's
    /proc/<pid>/io read_bytes, the counter the real engine moves (its mmap faults fetch the pages
    over NFS or from the disk after `up` dropped the caches; the sandbox's four ranks share one
    host page cache, so buffered reads would count once, not once per rank)."""

    CHUNK = 1 << 20

    def __init__(self, model: str, options: dict):
        try:
            names = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))
        except OSError:
            names = []
        self.files = [os.path.join(model, n) for n in names]
        self.total = sum(os.path.getsize(f) for f in self.files)
        self.done = 0
        self.rate = self.link_rate(model, int(options.get("nnodes") or 1))
        self.started = None
        self.direct = hasattr(os, "O_DIRECT")

    @staticmethod
    def link_rate(model: str, sharing: int) -> float | None:
        """Bytes/s this rank gets, or None (unthrottled: not on the NFS path, or no speed)."""
        nfs = os.path.realpath(os.environ.get("SANDBOX_VLLM_NFS_PATH", "/models/glm53-sandbox"))
        if os.path.commonpath([os.path.realpath(model), nfs]) != nfs:
            return None
        mbps = os.environ.get("SANDBOX_VLLM_READ_MBPS")
        if mbps is None:
            root = os.environ.get("SANDBOX_SYSFS_ROOT", "/sandbox/sysfs")
            iface = os.environ.get("SANDBOX_VLLM_NFS_IFACE", "eth0")
            try:
                with open(os.path.join(root, "class", "net", iface, "speed")) as f:
                    mbps = f.read().strip()
            except OSError:
                return None
        return float(mbps) * 1e6 / 8 / max(1, sharing) if float(mbps) > 0 else None

    def read_to(self, target: int) -> bool:
        """Read on until `target` bytes of the checkpoint are read (paced); True when stopped."""
        import mmap

        if self.started is None:
            self.started = time.monotonic()
        buf = mmap.mmap(-1, self.CHUNK)  # page-aligned, as O_DIRECT wants
        offset_in = 0
        for path in self.files:
            size = os.path.getsize(path)
            if self.done >= offset_in + size:
                offset_in += size
                continue
            fd = self.open(path)
            try:
                pos = self.done - offset_in
                while pos < size and self.done < target:
                    got = os.preadv(fd, [buf], pos)
                    if got <= 0:
                        break
                    got = min(got, size - pos)
                    pos += got
                    self.done += got
                    if self.rate and wait_for_signal(self.started + self.done / self.rate - time.monotonic()):
                        return True
            finally:
                os.close(fd)
            offset_in += size
            if self.done >= target:
                break
        return STOP.is_set()

    def open(self, path: str) -> int:
        if self.direct:
            try:
                return os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError:  # a filesystem without O_DIRECT (tmpfs): buffered reads
                self.direct = False
                log(f"{path}: O_DIRECT refused; reading through the page cache", "WARNING")
        return os.open(path, os.O_RDONLY)


def load_model(model: str, options: dict) -> str | None:
    """Read the checkpoint and take the engine's memory step by step, as loading does; the error
    when a step does not fit in MemFree, None when loaded (or stopped)."""
    mem_dir = os.environ.get("SANDBOX_VLLM_MEM_DIR", "/sandbox/mem")
    steps = load_steps(model, options)
    reader = Reader(model, options)
    weights = [i for i, s in enumerate(steps) if s[0] == "weights"]
    started = time.monotonic()
    if not os.path.isdir(mem_dir):  # no memory model: the reads and the time it takes
        if reader.read_to(reader.total):
            return None
        log(f"Loading weights took {time.monotonic() - started:.2f} seconds")
        wait_for_signal(max(0.0, started + sum(s[3] for s in steps) - time.monotonic()))
        return None
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import standin_mem

    global HOLDER
    HOLDER = standin_mem.Holder(mem_dir, "vllm")
    held, due = 0, started
    for i, (what, size, read, seconds) in enumerate(steps):
        if STOP.is_set():
            return None
        due += seconds  # when this step ends: the load takes SANDBOX_VLLM_LOAD_S in all
        if what == "weights" and reader.read_to(reader.total * (weights.index(i) + 1) // len(weights)):
            return None
        if read:
            standin_mem.report_read(mem_dir, read)
        standin_mem.settle(mem_dir)
        info = read_meminfo(os.environ.get("SANDBOX_VLLM_MEMINFO", "/proc/meminfo"))
        if size > info.get("MemFree", 0):
            return oom_message(size, info, held)
        held += size
        HOLDER.hold(held)
        if wait_for_signal(max(0.0, due - time.monotonic())):
            return None
        if i == weights[-1]:
            log(f"Loading weights took {time.monotonic() - started:.2f} seconds")
    standin_mem.settle(mem_dir)
    global LOADED_BYTES
    LOADED_BYTES = held
    log(f"Model loading took {held / GIB:.2f} GiB of memory (weights, KV cache, CUDA graphs)")
    return None


def compile_dir(model: str, options: dict) -> str:
    """Where vLLM keeps this model's compiled graphs for this rank:
    VLLM_CACHE_ROOT/torch_compile_cache/HASH/rank_R_0 (HASH: the model and its config)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
    digest = hashlib.sha256(json.dumps([model, options.get("tensor_parallel_size")]).encode()).hexdigest()[:10]
    return os.path.join(root, "torch_compile_cache", digest, f"rank_{options.get('node_rank', 0)}_0")


def compile_graphs(model: str, options: dict) -> bool:
    """torch.compile after the weights: SANDBOX_VLLM_COMPILE_S on an empty cache, then the
    graphs (and a Triton kernel) are written to the cache; a warm cache is read instead.
    True when stopped meanwhile."""
    where = compile_dir(model, options)
    done = os.path.join(where, "backbone", "compiled.json")
    started = time.monotonic()
    if os.path.exists(done):
        log(f"Directly load the compiled graph(s) for dynamic shape from the cache, took "
            f"{time.monotonic() - started:.3f} s")
        return False
    if wait_for_signal(knob("SANDBOX_VLLM_COMPILE_S", 0)):
        return True
    os.makedirs(os.path.dirname(done), exist_ok=True)
    with open(done, "w") as f:
        json.dump({"model": model, "sandbox": "stand-in compile artefact"}, f)
    triton = os.environ.get("TRITON_CACHE_DIR")
    if triton:
        os.makedirs(triton, exist_ok=True)
        with open(os.path.join(triton, "sandbox_kernel.cubin"), "wb") as f:
            f.write(b"\0" * 4096)
    log(f"Compiling a graph for dynamic shape takes {time.monotonic() - started:.2f} s")
    return False


HOLDER = None  # this process's registered memory (standin_mem.Holder): freed when it dies


class PrefillMemory:
    """Serving takes memory beyond the KV pool: a prefill's activations and workspaces, which
    torch's caching allocator keeps reserved after the request (it returns nothing to the system
    until the process ends). On a GB10 that is unified memory, so the rank's MemFree shrinks with
    the longest prefill served so far -- the field's freezes during long prefills (issue 29:
    vLLM 46307/56824, dgx-spark-playbooks #97); an explicit --kv-cache-memory-bytes skips vLLM's
    own profiling, so nothing sizes for it. Modelled: the concurrent prefills' prompt tokens x
    SANDBOX_VLLM_PREFILL_KIB_PER_TOKEN (a model figure, not a measurement), taken in 16 chunks
    over the prefill's time (chunked prefill) and kept as a high-water mark. A chunk that does
    not fit in MemFree (the page cache is not reclaimed for the GPU) kills the engine with
    CUDA's out-of-memory error, exit 1. Only the rank serving the API: the stand-in's headless
    workers get no requests. Without the rank's memory model (no HOLDER): nothing."""

    CHUNKS = 16

    def __init__(self):
        self.lock = threading.Lock()
        self.per_token = int(knob("SANDBOX_VLLM_PREFILL_KIB_PER_TOKEN", 64) * 1024)
        self.in_flight = 0  # bytes the prefills running now need
        self.reserved = 0  # the high-water mark, held by the holder

    def prefill(self, prompt_tokens: int, seconds: float) -> None:
        """Take the prompt's memory chunk by chunk over `seconds`; the caller's tokens follow."""
        if HOLDER is None or self.per_token <= 0:
            time.sleep(max(0.0, seconds))
            return
        need = prompt_tokens * self.per_token
        step, taken, due = need // self.CHUNKS, 0, time.monotonic()
        try:
            for i in range(self.CHUNKS):
                size = need - taken if i == self.CHUNKS - 1 else step
                self.take(size)
                taken += size
                due += seconds / self.CHUNKS
                time.sleep(max(0.0, due - time.monotonic()))
        finally:
            with self.lock:
                self.in_flight -= taken

    def take(self, size: int) -> None:
        mem_dir = os.environ.get("SANDBOX_VLLM_MEM_DIR", "/sandbox/mem")
        with self.lock:
            self.in_flight += size
            grow = self.in_flight - self.reserved
            if grow <= 0:
                return
            info = read_meminfo(os.environ.get("SANDBOX_VLLM_MEMINFO", "/proc/meminfo"))
            if grow > info.get("MemFree", 0):
                log(oom_message(grow, info, self.reserved), "ERROR")
                log("EngineCore encountered a fatal error (prefill); the API server exits", "ERROR")
                os._exit(1)
            self.reserved = self.in_flight
            HOLDER.hold(LOADED_BYTES + self.reserved)
        sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
        import standin_mem

        standin_mem.settle(mem_dir)


LOADED_BYTES = 0  # what loading took (weights, KV pool, graphs): the holder holds it plus the prefills'


# ---------------------------------------------------------------- the fake engine

def message_text(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def count_prompt_tokens(messages: list) -> int:
    words = sum(len(message_text(m).split()) for m in messages if isinstance(m, dict))
    return max(1, round(words * 1.3))


def find_needle(messages: list) -> str | None:
    """If the last user message asks for a secret/code/needle, the prompt's sentence stating it
    (a keyword, then `is`, then something with a digit, not a question), so needle tests PASS."""
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not ASKS_FOR_NEEDLE.search(message_text(users[-1])):
        return None
    text = "\n".join(message_text(m) for m in messages if isinstance(m, dict))
    for sentence in SENTENCE_BREAK.split(text):
        sentence = sentence.strip()
        if NEEDLE_FACT.search(sentence) and not sentence.endswith("?"):
            return sentence
    return None


def spaced(words: list[str]) -> list[str]:
    """Token texts as a tokenizer streams them: a leading space on all but the first."""
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def plan_tokens(req: dict, max_tokens: int | None = None,
                reasoning_parser: bool = False) -> tuple[list[tuple[str, str]], str]:
    """The reply as [(delta field, text)], one word a token, and its finish_reason. Without
    max_tokens the canned answer ends naturally ("stop"); with it (what the request asked,
    shortened to what the context leaves, as vLLM does), exactly max_tokens are generated
    ("length") unless a needle answer is shorter, which is what benches expect. Thinking is the
    `reasoning` field with a reasoning parser; without one vLLM leaves it in the content, between
    the model's <think> tags."""
    kwargs = req.get("chat_template_kwargs") or {}
    thinking = kwargs.get("reasoning_effort") == "high" or req.get("reasoning_effort") == "high"
    needle = find_needle(req.get("messages") or [])
    budget = max_tokens or (len(REASONING) + len(ANSWER))
    n_reason = min(len(REASONING), budget // 2) if thinking else 0  # "the first few tokens"
    if needle:
        words = needle.split()
    elif max_tokens:
        words = [ANSWER[i % len(ANSWER)] for i in range(budget)]
    else:
        words = ANSWER
    body = words[:budget - n_reason]
    thought = spaced(REASONING[:n_reason])
    answer = spaced(body)
    if reasoning_parser:
        tokens = [("reasoning", w) for w in thought] + [("content", w) for w in answer]
    else:
        if thought and answer:
            thought[0] = "<think>" + thought[0]
            answer[0] = "</think>" + answer[0].lstrip()
        tokens = [("content", w) for w in thought + answer]
    natural_end = (needle or not max_tokens) and len(body) == len(words)
    return tokens, "stop" if natural_end else "length"


class Ticket:
    """One request in the engine's scheduler: waiting until admitted, then running."""

    def __init__(self, prompt_tokens: int, arrived: float):
        self.prompt = prompt_tokens
        self.arrived = arrived
        self.admitted = None  # monotonic time it was scheduled
        self.generated = 0
        self.last_token = None


class Engine:
    """Shared state of the server: configuration, the scheduler, pacing and vLLM's counters.

    The scheduler is vLLM's as far as a client can see it: a request waits until fewer than
    --max-num-seqs run and its prompt fits in the free KV cache, then runs (prefill, then one
    token at a time); `vllm:num_requests_running`/`_waiting` count those, not HTTP connections.
    Wedged (SIGUSR1, or SANDBOX_VLLM_FAIL=wedge): /health still answers, nothing is scheduled
    and no token is produced, so requests pile up as waiting and running, the counters flat."""

    def __init__(self, model: str, options: dict):
        self.names = options.get("served_model_name") or [model]
        self.keys = options.get("api_key") or (
            [os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else [])
        spec = options.get("speculative_config")
        self.spec_k = (spec or {}).get("num_speculative_tokens", 1) if spec is not None else None
        mml = options.get("max_model_len")
        self.max_model_len = mml if isinstance(mml, int) and mml > 0 else None
        self.max_num_seqs = int(options.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)
        self.kv_tokens = int(knob("SANDBOX_VLLM_KV_TOKENS", max(self.max_model_len or 0, 131072)))
        self.tps = knob("SANDBOX_VLLM_TOKENS_PER_S", 40)
        self.ttft = knob("SANDBOX_VLLM_TTFT_S", 0.05)
        self.prefill_tps = knob("SANDBOX_VLLM_PREFILL_TOKENS_PER_S", 5000)
        self.accepted = knob("SANDBOX_VLLM_ACCEPTED_PER_DRAFT", 1.5)
        self.malformed = os.environ.get("SANDBOX_VLLM_FAIL") == "malformed"
        # vLLM splits thinking into `reasoning` only with a reasoning parser; else it is content.
        self.reasoning_parser = bool(options.get("reasoning_parser"))
        lm, seed = api_modules()[1], checkpoint_seed(model)
        # An overlay of the image may be broken (image_fault): its logits are noise always, or
        # only once `crowded_at` requests run at once (a TP kernel wrong under batching).
        fault, self.crowded_at = image_fault()
        self.lm = lm.Model(seed, noise=fault == "noise")
        self.noisy = lm.Model(seed, noise=True)
        self.fingerprint = system_fingerprint(options)
        self.wedged_at = time.monotonic() if os.environ.get("SANDBOX_VLLM_FAIL") == "wedge" else None
        self.lock = threading.Condition()
        self.running: list[Ticket] = []
        self.queue: list[Ticket] = []  # waiting, in arrival order
        self.prompt_total = self.gen_total = 0
        self.created = time.time()
        self.success = dict.fromkeys(standin_metrics.FINISH_REASONS, 0)
        self.ttft_hist = standin_metrics.Histogram(standin_metrics.TTFT_BUCKETS)
        self.itl_hist = standin_metrics.Histogram(standin_metrics.ITL_BUCKETS)
        self.e2e_hist = standin_metrics.Histogram(standin_metrics.REQUEST_LATENCY_BUCKETS)
        self.queue_hist = standin_metrics.Histogram(standin_metrics.REQUEST_LATENCY_BUCKETS)
        self.prefill_memory = PrefillMemory()

    def wedge(self) -> None:
        """The scheduler stops for good (a hung collective, a stuck step): only a restart helps."""
        with self.lock:
            if self.wedged_at is None:
                self.wedged_at = time.monotonic()
                log("scheduler wedged (SIGUSR1, a test's fault): /health answers, no request is "
                    "scheduled and no token produced from now on", "WARNING")

    def held_tokens(self, ticket: Ticket, now: float) -> int:
        """KV tokens a running request holds: its prompt as far as prefilled, and its output."""
        if ticket.admitted is None:
            return 0
        now = min(now, self.wedged_at) if self.wedged_at is not None else now
        done = (now - ticket.admitted) * self.prefill_tps
        return int(min(ticket.prompt, max(0.0, done))) + ticket.generated

    def kv_usage(self, now: float) -> float:
        blocks = sum(-(-self.held_tokens(t, now) // KV_BLOCK) for t in self.running)
        return min(1.0, blocks * KV_BLOCK / self.kv_tokens) if self.kv_tokens > 0 else 0.0

    def admit(self, ticket: Ticket) -> bool:
        """Wait until the scheduler takes the request, first come first served as vLLM's default
        policy (a request that does not fit holds up those behind it); False when the server
        stops meanwhile."""
        with self.lock:
            self.queue.append(ticket)
            try:
                while (self.queue[0] is not ticket or self.wedged_at is not None
                       or len(self.running) >= self.max_num_seqs or self.running and
                       self.kv_usage(time.monotonic()) * self.kv_tokens + ticket.prompt > self.kv_tokens):
                    if STOP.is_set():
                        return False
                    self.lock.wait(0.2)
            finally:
                self.queue.remove(ticket)
                self.lock.notify_all()
            ticket.admitted = time.monotonic()
            self.running.append(ticket)
            return True

    def finish(self, ticket: Ticket, reason: str) -> None:
        with self.lock:
            if ticket in self.running:
                self.running.remove(ticket)
                self.success[reason] += 1
                self.e2e_hist.observe(time.monotonic() - ticket.arrived)
                self.queue_hist.observe(ticket.admitted - ticket.arrived)
            self.lock.notify_all()

    def crowded(self) -> bool:
        """Whether the image's concurrency fault applies now (image_fault): as many requests
        scheduled at once as the fault needs."""
        with self.lock:
            return self.crowded_at is not None and len(self.running) >= self.crowded_at

    def paced(self, tokens: list, prompt_tokens: int, t0: float, finish: str = "length"):
        """Yields tokens at their due time once the scheduler takes the request: the first after
        TTFT (+ prefill), then one every 1/tokens_per_s, on absolute deadlines so sleep jitter
        does not accumulate. Each stream is its own thread, so concurrent streams each get the
        full per-stream rate. Wedged: it stops before the next token, for good."""
        ticket = Ticket(prompt_tokens, t0)
        if not self.admit(ticket):
            return
        reason = "abort"  # unless every token went out
        try:
            first_at = ticket.admitted + self.ttft + prompt_tokens / self.prefill_tps
            self.prefill_memory.prefill(prompt_tokens, first_at - time.monotonic())
            for i, token in enumerate(tokens):
                time.sleep(max(0.0, first_at + i / self.tps - time.monotonic()))
                while self.wedged_at is not None:
                    if wait_for_signal(0.2):
                        return
                self._count_token(ticket, i == 0)
                yield i, token
            reason = finish
        finally:
            self.finish(ticket, reason)

    def _count_token(self, ticket: Ticket, first: bool) -> None:
        now = time.monotonic()
        with self.lock:
            if first:  # vLLM counts a prompt's tokens when its first token comes out
                self.prompt_total += ticket.prompt
                self.ttft_hist.observe(now - ticket.arrived)
            else:
                self.itl_hist.observe(now - ticket.last_token)
            ticket.generated += 1
            ticket.last_token = now
            self.gen_total += 1

    def metrics(self) -> str:
        m = standin_metrics
        with self.lock:
            values = {
                "vllm:num_requests_running": [({}, len(self.running))],
                "vllm:num_requests_waiting": [({}, len(self.queue))],
                "vllm:num_requests_waiting_by_reason": [({"reason": "capacity"}, len(self.queue)),
                                                        ({"reason": "deferred"}, 0)],
                "vllm:engine_sleep_state": [({"sleep_state": "awake"}, 1),
                                            ({"sleep_state": "weights_offloaded"}, 0),
                                            ({"sleep_state": "discard_all"}, 0)],
                "vllm:kv_cache_usage_perc": [({}, self.kv_usage(time.monotonic()))],
                "vllm:num_preemptions": [({}, 0)],  # the stand-in never preempts
                "vllm:prompt_tokens": [({}, self.prompt_total)],
                "vllm:generation_tokens": [({}, self.gen_total)],
                "vllm:request_success": [({"finished_reason": r}, n) for r, n in self.success.items()],
                "vllm:time_to_first_token_seconds": [({}, self.ttft_hist)],
                "vllm:inter_token_latency_seconds": [({}, self.itl_hist)],
                "vllm:e2e_request_latency_seconds": [({}, self.e2e_hist)],
                "vllm:request_queue_time_seconds": [({}, self.queue_hist)],
            }
            if self.spec_k is not None:
                values.update(self._spec_values())
        return m.exposition(self.names[0], self.created, values)

    def _spec_values(self) -> dict:
        """Every step emits 1 + accepted tokens, so drafts = generated / (1 + accepted); the
        accepted tokens are the per-position counts added up, as vLLM counts them."""
        drafts = int(self.gen_total / (1 + self.accepted))
        per_pos = standin_metrics.per_position(drafts, self.accepted, self.spec_k)
        return {"vllm:spec_decode_num_drafts": [({}, drafts)],
                "vllm:spec_decode_num_draft_tokens": [({}, drafts * self.spec_k)],
                "vllm:spec_decode_num_accepted_tokens": [({}, sum(per_pos))],
                "vllm:spec_decode_num_accepted_tokens_per_pos": [
                    ({"position": str(i)}, n) for i, n in enumerate(per_pos)]}

def api_modules():
    """standin_requests (vLLM's request rules, the completions body) and standin_lm (the small
    model behind completions), beside this file."""
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import standin_lm
    import standin_requests

    return standin_requests, standin_lm


def checkpoint_seed(model: str) -> int:
    """The checkpoint's identity for standin_lm: its config.json (none: the model's name)."""
    try:
        with open(os.path.join(model, "config.json"), "rb") as f:
            return api_modules()[1].checkpoint_seed(f.read())
    except OSError:
        return api_modules()[1].checkpoint_seed(model.encode())


def system_fingerprint(options: dict) -> str:
    """vLLM's default ("full") fingerprint: version, parallelism above 1, then 8 hex digits of
    its configuration's hash (here: of the options given)."""
    parts = [f"vllm-{os.environ.get('SANDBOX_VLLM_VERSION', '0.33.0')}"]
    for key, tag in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                     ("data_parallel_size", "dp")):
        if int(options.get(key) or 1) > 1:
            parts.append(f"{tag}{options[key]}")
    digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()
    return "-".join(parts + [digest[:8]])



# ---------------------------------------------------------------- HTTP

def api_error(message: str, code: int, kind: str = "BadRequestError") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked encoding like uvicorn
    server_version = "sandbox-vllm-standin"
    engine: Engine  # set by serve()

    def log_message(self, fmt, *args):  # uvicorn-style access line
        print(f"INFO:     {self.client_address[0]} - {fmt % args}", file=sys.stderr, flush=True)

    def send_body(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, obj) -> None:
        self.send_body(status, json.dumps(obj).encode())

    def authorized(self, path: str) -> bool:
        """vLLM checks the key on /v1/* only; /health and /metrics stay open."""
        keys = self.engine.keys
        if not keys or not path.startswith("/v1"):
            return True
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer ") and header[7:] in keys:
            return True
        self.send_json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/health":
            return self.send_body(200, b"", "text/plain")
        if path == "/metrics":
            return self.send_body(200, self.engine.metrics().encode(),
                                  "text/plain; version=0.0.4; charset=utf-8")
        if path == "/version":
            version = os.environ.get("SANDBOX_VLLM_VERSION", "0.33.0")
            return self.send_json(200, {"version": version})
        if not self.authorized(path):
            return
        if path == "/v1/models":
            now = int(time.time())
            return self.send_json(200, {"object": "list", "data": [
                {"id": n, "object": "model", "created": now, "owned_by": "vllm", "root": n,
                 "max_model_len": self.engine.max_model_len} for n in self.engine.names]})
        status = 405 if path == "/v1/chat/completions" else 404
        self.send_json(status, {"detail": "Method Not Allowed" if status == 405 else "Not Found"})

    def do_POST(self):
        t0 = time.monotonic()
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self.authorized(path):
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            return self.send_json(404, {"detail": "Not Found"})
        field = "messages" if path == "/v1/chat/completions" else "prompt"
        try:
            req = json.loads(raw or b"null")
            assert isinstance(req, dict) and field in req
            assert field == "prompt" or isinstance(req["messages"], list)
        except (ValueError, AssertionError):
            return self.send_json(400, api_error(f"body must be a JSON object with `{field}`", 400))
        requests = api_modules()[0]
        try:
            if field == "prompt":
                job = requests.Completion(req, self.engine.names, self.engine.max_model_len,
                                          self.engine.lm, " ".join(ANSWER))
                if req.get("stream") and (job.echo or req.get("prompt_logprobs") is not None):
                    raise requests.Refused("SANDBOX STAND-IN: streaming with echo or "
                                           "prompt_logprobs is not implemented", param="stream")
            else:
                req = requests.parsed(req)
                job = self.check(req, requests)
        except requests.Refused as e:
            return self.send_json(e.status, e.body)
        try:
            if field == "prompt":
                self.complete_text(job, t0)
            else:
                self.complete(req, job, t0)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-stream; nothing to tell it

    def check(self, req: dict, requests) -> tuple[int | None, int | None]:
        """vLLM's checks of a chat request, in its order (standin_requests). Returns max_tokens as
        asked, shortened to what the context leaves (None if not asked: the answer ends by
        itself), and that bound (None without a context limit)."""
        requests.check_model(req.get("model"), self.engine.names)
        asked = req.get("max_tokens")
        if asked is None:
            asked = req.get("max_completion_tokens")
        limit = self.engine.max_model_len
        requests.check_max_tokens_param(asked, limit)
        prompt = count_prompt_tokens(req["messages"])
        requests.check_prompt_len(prompt, limit, from_text=True)
        if asked is None and not limit:
            return None, None
        bound = requests.effective_max_tokens(asked, prompt, limit, None)
        return (None if asked is None else bound), bound

    def head(self, prefix: str, model) -> dict:
        return {"id": f"{prefix}-{uuid.uuid4().hex[:16]}", "created": int(time.time()),
                "model": model or self.engine.names[0]}

    def complete(self, req: dict, limits: tuple[int | None, int | None], t0: float) -> None:
        max_tokens, bound = limits
        tokens, finish = plan_tokens(req, max_tokens, self.engine.reasoning_parser)
        if bound is not None and len(tokens) > bound:  # an answer longer than the context left
            tokens, finish = tokens[:bound], "length"
        prompt = count_prompt_tokens(req["messages"])
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + len(tokens),
                 "completion_tokens": len(tokens)}
        reasoning = sum(1 for field, _ in tokens if field == "reasoning")
        base = self.head("chatcmpl", req.get("model"))
        paced = self.engine.paced(tokens, prompt, t0, finish)
        if req.get("stream"):
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            if reasoning:
                usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
            return self.stream(base, paced, len(tokens), finish, usage if include_usage else None)
        parts: dict[str, str] = {"content": "", "reasoning": ""}
        for _, (field, text) in paced:
            parts[field] += text
        # vLLM 0.33's ChatMessage, every field it serialises
        message = {"role": "assistant", "content": parts["content"], "refusal": None,
                   "annotations": None, "audio": None, "function_call": None,
                   "reasoning": parts["reasoning"] or None}
        usage.update(prompt_tokens_details=None, completion_tokens_details=(
            {"reasoning_tokens": reasoning} if reasoning else None))
        body = {**base, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
             "stop_reason": None, "token_ids": None, "routed_experts": None,
             "weight_versions": None}],
                "service_tier": None, "system_fingerprint": self.engine.fingerprint,
                "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
                "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        if self.engine.malformed:
            return self.send_body(200, json.dumps(body).encode()[:-7])
        self.send_json(200, body)

    def open_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def close_stream(self, usage_chunk: dict | None) -> None:
        if usage_chunk and not self.engine.malformed:
            self.sse(json.dumps(usage_chunk))
        self.sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")  # end of the chunked body

    def stream(self, base: dict, paced, n: int, finish: str, usage: dict | None) -> None:
        """vLLM 0.33's chunks: a role chunk, one chunk a token (the last with finish_reason),
        then the usage chunk when asked, then [DONE]; each with the fields vLLM sends."""
        self.open_stream()
        head = {**base, "object": "chat.completion.chunk"}
        for i, (field, text) in paced:
            if i == 0:  # vLLM's first chunk carries the role, with the first output
                self.sse(json.dumps({**head, "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None}))
                if self.engine.malformed:
                    self.sse('{"id": "chatcmpl-broken", "choices": [{"delta": {"content": "oo')
                    break
            choice = {"index": 0, "delta": {field: text}, "logprobs": None,
                      "finish_reason": finish if i == n - 1 else None, "token_ids": None}
            if i == n - 1:
                choice.update(stop_reason=None, weight_versions=None)
            self.sse(json.dumps({**head, "choices": [choice], "kv_transfer_params": None}))
        self.close_stream(usage and {**head, "choices": [], "usage": usage,
                                     "system_fingerprint": self.engine.fingerprint})

    def complete_text(self, job, t0: float) -> None:
        """/v1/completions: standin_lm's tokens and logprobs in vLLM 0.33's body."""
        requests = api_modules()[0]
        base = self.head("cmpl", job.req.get("model"))
        paced = self.engine.paced(job.tokens, len(job.prompt), t0, job.finish)
        k_prompt = job.req.get("prompt_logprobs")
        if k_prompt is None and job.echo and job.k is not None:
            k_prompt = job.k  # echo with logprobs asks the engine for the prompt's too
        if job.req.get("stream"):
            return self.stream_text(job, base, paced)
        crowded = False
        for _ in paced:
            crowded = crowded or self.engine.crowded()
        if crowded:
            job.corrupt(self.engine.noisy)
        prompt_text = "".join(api_modules()[1].piece(t) for t in job.prompt)
        text = bytes(job.text_tokens).decode("utf-8", errors="replace")
        logprobs = None
        if job.k is not None:
            logprobs = job.sample_logprobs(0, len(job.tokens), len(prompt_text) if job.echo else 0)
            if job.echo:
                echoed = job.echoed_logprobs()
                logprobs = {key: echoed[key] + logprobs[key] for key in logprobs}
        choice = {"index": 0, "text": prompt_text + text if job.echo else text,
                  "logprobs": logprobs, "finish_reason": job.finish, "stop_reason": None,
                  "token_ids": None, "prompt_logprobs": None if k_prompt is None else
                  job.prompt_logprobs(k_prompt), "prompt_token_ids": None,
                  "routed_experts": None, "weight_versions": None}
        self.send_json(200, {**base, "object": "text_completion", "choices": [choice],
                             "service_tier": None, "system_fingerprint": self.engine.fingerprint,
                             "usage": requests.usage(len(job.prompt), len(job.tokens)),
                             "kv_transfer_params": None, "ec_transfer_params": None,
                             "metrics": None})

    def stream_text(self, job, base: dict, paced) -> None:
        requests, lm = api_modules()
        self.open_stream()
        head = {**base, "object": "text_completion"}
        offset = 0
        for i, token in paced:
            text = lm.piece(token) if token != lm.EOS else ""
            last = i == len(job.tokens) - 1
            choice = {"index": 0, "text": text, "logprobs": None if job.k is None else
                      job.sample_logprobs(i, i + 1, offset), "finish_reason": job.finish if last
                      else None, "stop_reason": None, "token_ids": None, "prompt_token_ids": None,
                      "weight_versions": None}
            offset += len(text)
            self.sse(json.dumps({**head, "choices": [choice], "kv_transfer_params": None}))
        include_usage = bool((job.req.get("stream_options") or {}).get("include_usage"))
        self.close_stream(include_usage and {
            **head, "choices": [], "system_fingerprint": self.engine.fingerprint,
            "usage": requests.usage(len(job.prompt), len(job.tokens), details=False)})

    def sse(self, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()


# ---------------------------------------------------------------- process

STOP = threading.Event()  # set by SIGTERM/SIGINT; every wait below ends on it


def wait_for_signal(seconds: float = float("inf")) -> bool:
    """Sleeps until SIGTERM/SIGINT (True) or `seconds` pass (False). Short polls keep the main
    thread responsive to signals."""
    deadline = time.monotonic() + seconds
    while not STOP.wait(max(0.0, min(0.2, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return False
    return True


class Server(ThreadingHTTPServer):
    daemon_threads = True  # streams in flight must not hold up shutdown
    request_queue_size = 128  # a bench opens many connections at once


def serve(model: str, options: dict) -> int:
    engine = Engine(model, options)
    host, port = options.get("host") or "0.0.0.0", options.get("port") or 8000
    Handler.engine = engine
    signal.signal(signal.SIGUSR1, lambda *_: engine.wedge())  # a test's fault: the scheduler wedges
    try:
        server = Server((host, port), Handler)
    except OSError as e:
        log(f"failed to bind {host}:{port}: {e}", "ERROR")
        return 1
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"INFO:     Started server process [{os.getpid()}]\nINFO:     Application startup "
          f"complete.\nINFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)",
          file=sys.stderr, flush=True)
    wait_for_signal()
    log("shutting down")
    server.shutdown()
    server.server_close()
    return 0


def ray_nodes(address: str) -> int:
    """Nodes the (stand-in) Ray head counts, itself included; 0 when it does not answer."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port or 6379)), timeout=2) as c:
            c.sendall(b"NODES\n")
            return int(c.makefile("r").readline().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def ray_world(options: dict) -> int:
    return int(options.get("tensor_parallel_size") or 1) * int(options.get("pipeline_parallel_size") or 1)


def wait_for_ray(options: dict) -> bool:
    """The Ray executor's placement group: one GPU node per TP x PP rank must have joined."""
    world = ray_world(options)
    address = os.environ.get("RAY_ADDRESS", "127.0.0.1:6379")
    deadline = time.monotonic() + knob("SANDBOX_RAY_WAIT_S", 60)
    have = ray_nodes(address)
    while have < world:
        if time.monotonic() > deadline or STOP.is_set():
            log(f"Ray cluster at {address} has {have} of the {world} nodes the placement group "
                "needs; giving up", "ERROR")
            return False
        time.sleep(0.2)
        have = ray_nodes(address)
    log(f"Ray cluster at {address}: {have} nodes; placement group of {world} ready")
    return True


def engine_config():
    """The engine configuration's refusals (standin_engine_config.py, beside this file)."""
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import standin_engine_config

    return standin_engine_config


def validate(argv: list[str]) -> tuple[int, list[str]]:
    """What the kit's engine row asks the image (launcher/onrank/engine_config.py; on real vLLM:
    its parser, then create_engine_config, then the attention backend's choice) for the tokens
    after `vllm serve`: (0 and a summary | 1 and the error | 2 and the parser's error). The
    stand-in's same checks, in the same order as a start, without the cluster, memory or load."""
    import contextlib
    import io

    flags = os.environ.get("SANDBOX_VLLM_FLAGS", DEFAULT_FLAGS)
    try:
        table = vllm_options.read_table(flags)
    except (OSError, ValueError) as e:
        return 1, [f"vllm (sandbox stand-in): cannot read the option table {flags}: {e}"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            model, options = parse_serve(argv, table)
    except SystemExit as e:
        return int(e.code or 2), err.getvalue().strip().splitlines()[-1:] or ["argument error"]
    conf = engine_config()
    problem = read_model(model) or conf.engine_config(model, options) or conf.attention(model, options)
    if problem:
        return 1, [problem]
    cfg = conf.read_config(model)
    derived, key = conf.derived_max_len(cfg)
    quant = (cfg.get("quantization_config") or {}).get("quant_method") if isinstance(
        cfg.get("quantization_config"), dict) else None
    return 0, [f"max_model_len={options.get('max_model_len', derived)} ({key}={derived}) "
               f"quantization={options.get('quantization') or quant} (SANDBOX STAND-IN's checks)"]


def main(argv: list[str]) -> int:
    version = os.environ.get("SANDBOX_VLLM_VERSION", "0.33.0")
    if argv[:1] in (["--version"], ["-v"]):
        print(version)
        return 0
    if argv[:1] != ["serve"]:
        problem = (f"argument subcommand: invalid choice: {argv[0]!r} (choose from 'serve')"
                   if argv else "the following arguments are required: subcommand")
        print(f"usage: vllm [--version] serve ...  (sandbox stand-in: only `serve` and "
              f"`--version` exist)\nvllm: error: {problem}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):  # early, so a stop while starting is clean too
        signal.signal(sig, lambda *_: STOP.set())
    flags = os.environ.get("SANDBOX_VLLM_FLAGS", DEFAULT_FLAGS)
    try:
        table = vllm_options.read_table(flags)
    except (OSError, ValueError) as e:
        print(f"vllm (sandbox stand-in): cannot read the option table {flags}: {e}; "
              f"set SANDBOX_VLLM_FLAGS", file=sys.stderr)
        return 1
    model, options = parse_serve(argv[1:], table)
    headless = bool(options.get("headless"))
    write_record(os.environ.get("SANDBOX_VLLM_RECORD", DEFAULT_RECORD), argv, model, options,
                 "headless" if headless else "api")
    log(f"vLLM API server version {version} (SANDBOX STAND-IN, not vLLM)")
    log(f"non-default args: {options} model={model!r}")
    fail = os.environ.get("SANDBOX_VLLM_FAIL", "")
    only_rank = os.environ.get("SANDBOX_VLLM_FAIL_NODE_RANK")
    if only_rank is not None and str(options.get("node_rank", 0)) != only_rank:
        fail = ""  # the fault is meant for another node rank
    if fail.startswith("exit:"):
        log(f"EngineCore failed to start (simulated by SANDBOX_VLLM_FAIL={fail})", "ERROR")
        return int(fail[5:])
    problem = read_model(model) or engine_config().engine_config(model, options) or nofile_guard()
    if problem:
        log(problem, "ERROR")
        return 1
    long_len = engine_config().warn_max_len(engine_config().read_config(model), options)
    if long_len:
        log(long_len, "WARNING")
    if options.get("distributed_executor_backend") == "ray" and not wait_for_ray(options):
        return 1
    problem = join_cluster(options) or memory_guard(options) or engine_config().attention(model, options)
    if problem:
        log(problem, "ERROR")
        return 1
    problem = load_model(model, options)
    if problem:
        log(problem, "ERROR")
        return 1
    if compile_graphs(model, options):
        return 0
    if wait_for_signal(knob("SANDBOX_VLLM_STARTUP_S", 0)) or STOP.is_set():
        return 0
    if headless:
        master = f"{options.get('master_addr', '?')}:{options.get('master_port', '?')}"
        log(f"headless worker rank {options.get('node_rank', 0)} of {options.get('nnodes', 1)} "
            f"(master {master}); serving no API")
        wait_for_signal()
        return 0
    return serve(model, options)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
