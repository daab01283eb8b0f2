#!/usr/bin/env python3
"""Check the kit's vLLM argv and the sandbox stand-in against vLLM 0.33's own parser.

Needs vLLM installed (see scripts/extract_vllm_flags.py) and the kit's `sparkstack` (by default
the one beside this python; else name it); not a test:

    /work/vllm-venv/bin/python scripts/check_profiles_with_vllm.py [--sparkstack .venv/bin/sparkstack]

1. Profiles: for every vLLM profile in env/profiles/, native and `multinode: ray`, the engine
   argv `sparkstack plan --offline --json` gives each rank (from env/cluster.example.yaml) is
   parsed by vLLM's `vllm serve` parser and by the stand-in: both must accept it.
   with the same values (what the stand-in records against vLLM's namespace).
2. Refusals: argv that vLLM refuses (and a few it takes) go to both; the outcome and the message
   (from "error:" on, function addresses masked), or the values, must be the same.
Exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_vllm_flags import serve_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "launcher" / "sandbox" / "standins" / "standin_vllm.py"
FLAGS = ROOT / "launcher" / "inputs" / "data" / "vllm-serve-flags-0.33.json"

# The argv after `vllm serve MODEL`; the same cases as tests/test_standin_vllm.py, and more.
CASES = [
    ["--kv-cache-memory-bytes", "banana"], ["--kv-cache-memory-bytes", "none"],
    ["--kv-cache-memory-bytes", "None"], ["--kv-cache-memory-bytes", "13G"],
    ["--distributed-executor-backend", "rya"], ["--distributed-executor-backend", "None"],
    ["--max-num-seqs", "1.5"], ["--max-num-seqs", "eight"], ["--max-num-seqs", "None"],
    ["--max-model-len", "1.5K"], ["--max-model-len", "abc"], ["--max-model-len", "auto"],
    ["--gpu-memory-utilization", "abc"], ["--gpu-memory-utilization", "0.84"],
    ["--speculative-config", "{bad"], ["--speculative-config", '{"method": mtp}'],
    ["--speculative-config", "[1]"], ["--speculative-config", "None"],
    ["--compilation-config", "{bad"], ["--compilation-config", "[1]"],
    ["--compilation-config", '{"mode": 3} x'], ["--compilation-config", '{"bogus_key": 1}'],
    ["--compilation-config", '{"a": 1, "pass_config": {"b": "x"}}'],
    ["-cc.pass_config.fuse_allreduce_rmz=true"], ["-cc.max_cudagraph_capture_size", "8k"],
    ["--dcp-comm-backend", "bogus"], ["--dcp-comm-backend", "None"],
    ["--tool-strict-level", "none"], ["--collect-detailed-traces", "all", "bogus"],
    ["--all2all-backend", "bogus"], ["--log-level", "info"], ["--kv-cache-dtype", "fp9"],
    ["--moe-backend", "Marlin"], ["--moe-backend", "bogus"],
    ["--limit-mm-per-prompt", "{bad"], ["--hf-overrides", "{bad}"], ["--hf-overrides", "plain"],
    ["--numa-bind-nodes", "0", "x"], ["--kv-offloading-size", "abc"], ["--port", "abc"],
    ["--port.x", "1"], ["--foo"], ["--foo.bar=1"], ["--async-scheduling=yes"],
    ["--disable-prefix-caching"], ["--max-model-len"], ["--cudagraph-capture-sizes", "1", "x"],
    ["--lora-modules", "{bad"], ["--reasoning-parser", "none"], ["--attention-backend", "CUSTOM"],
    ["--max-model-len", "long"], ["--gpu-memory-utilization", "high"],
    ["--numa-bind-nodes", "0", "1.5"], ["--kv-offloading-size", "big"],
    # tests/test_standin_vllm.py's test_flexible_argv_forms and test_values_converted_like_vllm
    ["--max_num_batched_tokens=8k", "-tp", "2", "-cc.mode=3", "-cc.pass_config.fuse_allreduce_rms",
     "true", "-cc.custom_ops+", "+a,-b", "-cc.custom_ops+=+c", "--no-async-scheduling",
     "--max-model-len", "auto", "--hf-overrides", "plain-string", "-ac.backend=FLASHINFER",
     "--attention-config.use_trtllm_attention=false", "-O3"],
    ["--kv-cache-memory-bytes", "13G", "--max-num-seqs", "8", "--gpu-memory-utilization", "0.84",
     "--dcp-comm-backend", "None", "--moe-backend", "Marlin", "--served-model-name", "a", "None",
     "--disable-prefix-caching", "--hf-token", "--middleware", "x", "--middleware", "y",
     "--device-ids", "0, gpu-1", "--reasoning-parser", "NONE", "--numa-bind-nodes", "0", "1",
     "--kv-offloading-size", "1.5", "-cc.max_cudagraph_capture_size", "8k",
     "--speculative-config", "[1]", "--distributed-executor-backend", "rya",
     "--kv-transfer-config", '{"kv_port": 14k}', "--lora-modules", "a=/p"],
]


def vllm_verdict(top: argparse.ArgumentParser, argv: list[str]) -> tuple[int, str, dict]:
    """(exit code, message from "error:" on, the options it set) of vLLM's own parser."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = top.parse_args(["serve", *argv])
    except SystemExit as e:
        return int(e.code or 0), error_text(err.getvalue()), {}
    return 0, "", vars(ns)


def standin_verdict(argv: list[str]) -> tuple[int, str, dict]:
    """The same of the stand-in, run as a process; the options are those it recorded."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SANDBOX_VLLM_FLAGS": str(FLAGS), "SANDBOX_VLLM_FAIL": "exit:0",
               "SANDBOX_VLLM_RECORD": f"{tmp}/record.json"}
        done = subprocess.run([sys.executable, str(STANDIN), "serve", *argv],
                              env=env, capture_output=True, text=True, timeout=30)
        if done.returncode:
            return done.returncode, error_text(done.stderr), {}
        return 0, "", json.loads(Path(f"{tmp}/record.json").read_text())["options"]


def value_differences(real: dict, standin: dict) -> list[str]:
    """Options the stand-in recorded with another value than vLLM's parser gave (values vLLM
    turns into objects, such as config dataclasses, are left out)."""
    out = []
    for dest, value in standin.items():
        try:
            expected = json.loads(json.dumps(real.get(dest)))
        except TypeError:
            continue
        if expected != value:
            out.append(f"{dest}: vLLM {expected!r}, stand-in {value!r}")
    return out


def error_text(stderr: str) -> str:
    """From the `prog: error:` line to the end, with function addresses masked."""
    at = re.search(r"^\S.*?: error: ", stderr, re.M)
    text = stderr[at.start():] if at else stderr.strip().splitlines()[-1:][0] if stderr else ""
    return re.sub(r" at 0x[0-9a-f]+", " at 0x…", text.strip())


def cluster_configs():
    """(profile, multinode, cluster.yaml text) for every profile in env/profiles/, native and Ray,
    from env/cluster.example.yaml."""
    example = (ROOT / "env" / "cluster.example.yaml").read_text()
    for path in sorted((ROOT / "env" / "profiles").glob("*.yaml")):
        for multinode in ("", "ray"):
            yield path.stem, multinode, re.sub(r"(?m)^profile: .*$", f"profile: {path.stem}"
                                               + (f"\nmultinode: {multinode}" if multinode else ""), example)


def planned(sparkstack: str, text: str, more=None) -> tuple[dict, object]:
    """`sparkstack plan --offline --json` of a cluster.yaml text, and more(its path) asked while
    the file exists."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        done = subprocess.run([sparkstack, "plan", "--offline", "--json", "--show-secrets", "-c", f.name],
                              capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            sys.exit(f"sparkstack plan failed: {done.stderr or done.stdout}\n{text}")
        return json.loads(done.stdout), (more(f.name) if more else None)


def profile_argvs(sparkstack: str) -> list[tuple[str, list[str]]]:
    """(label, argv after `vllm serve`) of every rank of every vLLM profile, native and Ray."""
    out = []
    for stem, multinode, text in cluster_configs():
        for rank in planned(sparkstack, text)[0]["ranks"]:
            argv = serve_argv(rank["engine"])
            if argv is not None:
                out.append((f"{stem} {multinode or 'native'} rank {rank['rank']}", argv))
    return out


def serve_argv(engine: list[str]) -> list[str] | None:
    """The tokens after `vllm serve` (the model included), also inside `sh -c '... && exec vllm serve ...'`."""
    tokens = shlex.split(engine[2]) if engine[:2] == ["sh", "-c"] else engine
    for i in range(len(tokens) - 1):
        if tokens[i:i + 2] == ["vllm", "serve"]:
            rest = tokens[i + 2:]
            end = next((n for n, t in enumerate(rest) if t in ("&&", ";", "||")), len(rest))
            return rest[:end]
    return None


def verdict(top: argparse.ArgumentParser, argv: list[str]) -> tuple[bool, str]:
    """(same, report) of one argv through both parsers."""
    real, standin = vllm_verdict(top, argv), standin_verdict(argv)
    lines = [f"  vLLM:     exit {real[0]} {real[1]}".rstrip()]
    if real[:2] != standin[:2]:
        lines.append(f"  stand-in: exit {standin[0]} {standin[1]}".rstrip())
    differences = value_differences(real[2], standin[2]) if not real[0] else []
    lines += [f"  value {d}" for d in differences]
    return real[:2] == standin[:2] and not differences, "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sparkstack", default=str(Path(sys.executable).parent / "sparkstack"),
                    help="the kit's command (default: the one beside this python)")
    opts = ap.parse_args()
    top, _ = serve_parser()
    bad = 0
    print("== every profile's engine argv, per rank: vLLM and the stand-in accept it, same values")
    for label, argv in profile_argvs(opts.sparkstack):
        same, report = verdict(top, argv)
        ok = same and report.startswith("  vLLM:     exit 0")
        bad += not ok
        print(f"{'ok  ' if ok else 'BAD '}{label}\n{report}")
    print("\n== refusals and values: vLLM 0.33 vs the stand-in")
    for argv in CASES:
        same, report = verdict(top, ["test/model", *argv])
        bad += not same
        print(f"{'same' if same else 'DIFF'} {shlex.join(argv)}\n{report}")
    print(f"\n{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
