#!/usr/bin/env python3
"""`verify` on the sandbox (issue 30): the quick form's time (what `up` adds once the API
answers) and the full form's, with the figures they read. Prints, asserts nothing.

The stand-in engine paces generation at SANDBOX_VLLM_TOKENS_PER_S (40 a stream) and prefill at
5,000 tokens/s, one token a byte: the times are the kit's requests at those rates, not GLM-5.3's.
Usage: flock /tmp/sparkstack-sandbox.lock .venv/bin/python scripts/bench_verify.py
(brings the sandbox up if needed, starts the model, leaves it as it found it: down at the end).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SPARKSTACK = str(Path(sys.executable).parent / "sparkstack")


def run(*args: str, ok: bool = True) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([SPARKSTACK, *args], capture_output=True, text=True)
    if ok and proc.returncode != 0:
        sys.exit(f"sparkstack {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return time.monotonic() - started, proc.stdout


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help runs nothing
    _, out = run("sandbox", "status", "--json")
    os.environ["SPARKSTACK_CONFIG"] = json.loads(out)["config"]
    run("sandbox", "up")
    run("up", "--no-verify")
    try:
        for form, args, n in (("quick", (), 3), ("full", ("--full",), 2)):
            walls, result = [], {}
            for _ in range(n):
                wall, out = run("verify", "--json", *args)
                walls.append(wall)
                result = json.loads(out)
            ppl = ", ".join(f"{f['name']} {f['perplexity']:.3f} ({f['tokens']} tokens, {f['chunks']} chunks)"
                            for f in result["figures"])
            print(f"verify {form}: {statistics.median(walls):.2f} s median of {n} "
                  f"({', '.join(f'{w:.2f}' for w in walls)}); measured {result['seconds']:.2f} s of it; "
                  f"{len(result['probes'])} probes; perplexity {ppl}; ok={result['ok']}")
    finally:
        run("down", ok=False)
    print("the rest of each wall is the CLI's start and reading the config (no ssh: verify only "
          "talks to rank 0's API)")


if __name__ == "__main__":
    main()
