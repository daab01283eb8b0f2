#!/usr/bin/env python3
"""`sparkstack bench` against the sandbox's stand-in vLLM on 127.0.0.1: no cluster, no GPU.

    python scripts/bench_demo.py [--rate 40] [--ttft 0.3] [--accepted 1.5] [--malformed]
                                 [-- BENCH ARGS...]

Starts the stand-in (MTP k=3, an API key, a served name) at the given per-stream decode rate,
time to first token and spec-decode acceptance, runs `sparkstack bench --url ... --api-key ...`
with the remaining arguments (default: every task at C1/C2/C4/C8, 128 tokens, needles at 8k and
32k, output in ./bench-demo), and stops it. The stand-in gives every stream its full rate, so
its aggregate grows linearly with concurrency, which a real server's does not.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "launcher" / "sandbox" / "standins" / "standin_vllm.py"
FLAGS = ROOT / "launcher" / "inputs" / "data" / "vllm-serve-flags-0.33.json"
KEY = "sk-bench-demo"
DEFAULT_BENCH = ["--max-tokens", "128", "--needle", "8k,32k", "--out", "bench-demo"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "SANDBOX_VLLM_FLAGS": str(FLAGS),
           "SANDBOX_VLLM_RECORD": str(log.parent / "record.json"),
           "SANDBOX_VLLM_TOKENS_PER_S": str(args.rate), "SANDBOX_VLLM_TTFT_S": str(args.ttft),
           "SANDBOX_VLLM_PREFILL_TOKENS_PER_S": str(args.prefill),
           "SANDBOX_VLLM_ACCEPTED_PER_DRAFT": str(args.accepted)}
    if args.malformed:
        env["SANDBOX_VLLM_FAIL"] = "malformed"
    argv = [sys.executable, str(STANDIN), "serve", "demo/GLM-5.3", "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "GLM-5.3-EXL3", "--api-key", KEY,
            "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}']
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"the stand-in did not start:\n{log.read_text()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=40.0, help="per-stream decode tok/s")
    parser.add_argument("--ttft", type=float, default=0.3, help="fixed time to first token, s")
    parser.add_argument("--prefill", type=float, default=5000.0, help="prefill tok/s")
    parser.add_argument("--accepted", type=float, default=1.5, help="accepted tokens per draft")
    parser.add_argument("--malformed", action="store_true", help="send broken stream chunks")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="arguments for sparkstack bench")
    args = parser.parse_args()
    bench_args = [a for a in args.bench if a != "--"] or DEFAULT_BENCH
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        proc = start(args, port, Path(tmp) / "standin.log")
        try:
            cmd = [sys.executable, "-c", "from launcher.cli.commands import main; main()", "bench",
                   "--url", f"http://127.0.0.1:{port}", "--api-key", KEY, *bench_args]
            return subprocess.call(cmd, cwd=os.getcwd())
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
