#!/usr/bin/env python3
"""Ask REAL vLLM 0.33's engine configuration and the sandbox stand-in the same questions: the
kit's planned rank-0 argv of every vLLM profile (native and `multinode: ray`) on its image, and
the argvs the kit used to plan (issue 32). Prints both verdicts per argv; exits 1 on a difference.

Not a test (it needs vLLM 0.33 and gcc; the tests use what it recorded):

    /work/vllm033/venv/bin/python scripts/check_engine_config_with_vllm.py \\
        [--sparkstack .venv/bin/sparkstack] [--record tests/fixtures/vllm033_engine_config]

Real side: launcher/onrank/engine_config.py's real_vllm (vLLM's `vllm serve` parser after
load_general_plugins, create_engine_config, the attention backend's choice), in one process per
set of image registrations, against tests/fixtures/vllm033_engine_config/checkpoint (config.json
only). This machine has no GPU; what is faked, and nothing else:
- the CUDA driver: a libcuda.so.1 built here whose every entry point returns
  CUDA_ERROR_NO_DEVICE (vLLM's kernel extensions link it; none runs);
- the device: vLLM's current_platform is its own NonNvmlCudaPlatform with a GB10's figures
  (compute capability 12.1, "NVIDIA GB10", 121.7 GiB), in place of asking the driver;
- VLLM_HAS_FLASHINFER_CUBIN=1 (vLLM's own switch: the serving images ship flashinfer-cubin;
  here FlashInfer would otherwise count as absent and the SM120 backend with it);
- the image's registrations: scripts/vllm033_image_plugin, a vLLM general plugin that registers
  through vLLM's own calls what the profile's image brings (exl3 as a configuration-only
  QuantizationConfig, DCP on the SM120 sparse-MLA backend, CUSTOM as that backend).
Stand-in side: standin_vllm.validate (check's engine row in the sandbox) with the same argv and
env, its image registering the same capabilities (SANDBOX_REGISTERS).

--record writes each case's real verdict, message and vLLM's warnings as JSON fixtures
(tests/test_engine_config_fixtures.py compares the stand-in with them, without vLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "launcher" / "sandbox" / "standins"
FLAGS = ROOT / "launcher" / "inputs" / "data" / "vllm-serve-flags-0.33.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_profiles_with_vllm import cluster_configs, planned, serve_argv  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "vllm033_engine_config"
CHECKPOINT = FIXTURES / "checkpoint"
PLUGIN = Path(__file__).resolve().parent / "vllm033_image_plugin"
ENGINE_CONFIG = ROOT / "launcher" / "onrank" / "engine_config.py"
GB10_MEMORY = int(121.7 * 2**30)
# the driver entry points vLLM 0.33's extensions import (nm -D --undefined-only), and cuInit
DRIVER = ("cuInit cuDeviceGet cuDeviceGetCount cuGetProcAddress cuGetProcAddress_v2 cuCtxGetCurrent "
          "cuCtxSetCurrent cuDeviceGetAttribute cuDevicePrimaryCtxRetain cuDriverGetVersion "
          "cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate "
          "cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap "
          "cuPointerGetAttribute cuTensorMapEncodeTiled").split()
WARNINGS = ("max_num_scheduled_tokens", "num_speculative_tokens > 1", "max_model_len",
            "fuse_allreduce_rms", "breakable")

PLAN_SNIPPET = r"""
import json, sys
from pathlib import Path
from launcher.inputs import config
from launcher.images import chain
loaded = config.load(Path(sys.argv[1]))
caps = chain.image_caps(loaded)
print(json.dumps({"brings": sorted({c for _, cs in caps.brings for c in cs})}))
"""


def plan_cases(sparkstack: str, python: str) -> list[dict]:
    """Rank 0's planned argv and VLLM_* env of every vLLM profile, native and Ray, with what
    its serving image brings."""
    cases = []
    for stem, multinode, text in cluster_configs():
        plan, caps = planned(sparkstack, text, lambda path: json.loads(subprocess.run(
            [python, "-c", PLAN_SNIPPET, path], check=True, capture_output=True, text=True, cwd=ROOT).stdout))
        argv = serve_argv(plan["ranks"][0]["engine"])
        if argv is None:
            continue  # not a vLLM profile
        env = {k: v for k, v in plan["ranks"][0]["env"].items()
               if k.startswith("VLLM_") and k not in ("VLLM_HOST_IP", "VLLM_CACHE_ROOT")}
        cases.append({"name": f"{stem}-{multinode or 'native'}", "kind": "plan",
                      "argv": argv[1:], "env": env, "registers": caps["brings"]})
    return cases


def old_cases(planned: list[dict]) -> list[dict]:
    """The argvs as the kit used to plan them, or on an image without what they need."""
    by = {c["name"]: c for c in planned}
    keys, pollard, k200 = by["keys-1m-dcp4-native"], by["pollard-180k-native"], by["keys35-200k-native"]
    everything = ["quantization:exl3", "attention:sparse-mla-dcp", "attention:CUSTOM"]
    return [
        dict(keys, name="old-1m-without-override", kind="old",
             env={k: v for k, v in keys["env"].items() if k != "VLLM_ALLOW_LONG_MAX_MODEL_LEN"},
             registers=everything),
        dict(k200, name="old-exl3-without-plugin", kind="old", registers=[]),
        dict(keys, name="old-dcp-without-backend", kind="old", registers=["quantization:exl3"]),
        dict(pollard, name="old-custom-unregistered", kind="old", registers=["quantization:exl3"]),
        dict(k200, name="old-ray-without-ray", kind="old", registers=everything,
             argv=strip_multinode(k200["argv"]) + ["--distributed-executor-backend", "ray"]),
        dict(k200, name="quant-only-in-sidecar", kind="old", registers=[],
             checkpoint="sidecar"),
        dict(keys, name="old-two-heads-at-tp4", kind="old", registers=everything,
             checkpoint="two-heads"),  # the sandbox checkpoint had 2 heads, its profile TP4
    ]


def strip_multinode(argv: list[str]) -> list[str]:
    out, skip = [], 0
    for token in argv:
        if skip:
            skip -= 1
        elif token in ("--nnodes", "--node-rank", "--master-addr", "--master-port"):
            skip = 1
        else:
            out.append(token)
    return out


def checkpoints(tmp: Path) -> dict[str, Path]:
    """The config-only checkpoint, the same with its quant method only in a
    quantization_config.json beside config.json (as seed 000's converter wrote it), and the same
    with 2 attention heads (as the sandbox checkpoint had)."""
    plain = tmp / "GLM-5.3"
    shutil.copytree(CHECKPOINT, plain)
    sidecar = tmp / "GLM-5.3-sidecar"
    shutil.copytree(CHECKPOINT, sidecar)
    cfg = json.loads((sidecar / "config.json").read_text())
    quant = cfg.pop("quantization_config")
    (sidecar / "config.json").write_text(json.dumps(cfg, indent=1))
    (sidecar / "quantization_config.json").write_text(json.dumps(quant))
    two_heads = tmp / "GLM-5.3-two-heads"
    shutil.copytree(CHECKPOINT, two_heads)
    cfg = json.loads((two_heads / "config.json").read_text())
    cfg.update(num_attention_heads=2, num_key_value_heads=2)
    (two_heads / "config.json").write_text(json.dumps(cfg, indent=1))
    return {"plain": plain, "sidecar": sidecar, "two-heads": two_heads}


def driver_stub(tmp: Path) -> Path:
    c = tmp / "libcuda_stub.c"
    c.write_text("/* no driver here: every entry point says CUDA_ERROR_NO_DEVICE */\n"
                 + "".join(f"int {name}(void) {{ return 100; }}\n" for name in DRIVER))
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    str(tmp / "libcuda.so.1"), str(c)], check=True)
    return tmp


# ---- the real side (a process per set of registrations) ------------------------------------

def worker(cases_file: str) -> int:
    """Runs under vLLM's python: each case through engine_config.py's real_vllm, with the
    warnings vLLM logged while it did."""
    import logging
    import runpy

    started = time.monotonic()
    import vllm.logger as vllm_logger
    import vllm.platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class GB10(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(major=12, minor=1)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "NVIDIA GB10"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return GB10_MEMORY

    vllm.platforms.current_platform = GB10()
    module = runpy.run_path(str(ENGINE_CONFIG))
    heard: list[str] = []
    make_record = logging.getLogRecordFactory()

    def hear(*args, **kwargs):
        # every record vLLM makes, whatever handlers its logging configuration (re)installs
        record = make_record(*args, **kwargs)
        if record.levelno >= logging.WARNING and record.name.startswith("vllm"):
            heard.append(record.getMessage())
        return record

    logging.setLogRecordFactory(hear)
    base = dict(os.environ)
    first = True
    for case in json.loads(Path(cases_file).read_text()):
        os.environ.clear()
        os.environ.update(base)
        os.environ.update(case["env"])
        heard.clear()
        for once in (vllm_logger._print_warning_once, vllm_logger._print_info_once):
            once.cache_clear()  # each case is a fresh `vllm serve`: its warning_once speaks again
        t = time.monotonic()
        code, lines = module["_asked"](module["real_vllm"], [case["model"], *case["argv"]])
        took = time.monotonic() - t + (t - started if first else 0)
        first = False
        print("RESULT " + json.dumps({"name": case["name"], "code": code, "message": "\n".join(lines),
                                      "warnings": [w for w in heard if any(k in w for k in WARNINGS)],
                                      "seconds": round(took, 2)}), flush=True)
    return 0


def real_verdicts(cases: list[dict], tmp: Path) -> dict[str, dict]:
    stub = driver_stub(tmp)
    out: dict[str, dict] = {}
    groups: dict[tuple, list[dict]] = {}
    for case in cases:
        groups.setdefault(tuple(case["registers"]), []).append(case)
    for registers, group in groups.items():
        path = tmp / f"cases-{len(out)}.json"
        path.write_text(json.dumps(group))
        env = {**os.environ, "LD_LIBRARY_PATH": str(stub), "PYTHONPATH": str(PLUGIN),
               "SPARKSTACK_IMAGE_REGISTERS": ",".join(registers), "VLLM_HAS_FLASHINFER_CUBIN": "1",
               "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "VLLM_LOGGING_LEVEL": "WARNING"}
        done = subprocess.run([sys.executable, __file__, "--worker", str(path)], env=env,
                              capture_output=True, text=True, timeout=1800)
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
                out[result["name"]] = result
        missing = [c["name"] for c in group if c["name"] not in out]
        if missing:
            sys.exit(f"vLLM gave no answer for {missing}:\n{done.stderr[-3000:]}")
    return out


# ---- the stand-in's side --------------------------------------------------------------------

STANDIN_SNIPPET = """
import json, sys
import standin_vllm
code, lines = standin_vllm.validate(json.loads(sys.argv[1]))
print("RESULT " + json.dumps({"code": code, "message": "\\n".join(lines)}))
"""


def standin_verdict(case: dict, tmp: Path) -> dict:
    """standin_vllm.validate as check's engine row runs it in a sandbox image that registers
    `registers` (python -S: no site-packages, so no real vLLM on its path)."""
    image = tmp / ("image-" + "-".join(sorted(r.replace(":", "_") for r in case["registers"])))
    (image / "vllm").mkdir(parents=True, exist_ok=True)
    (image / "vllm" / "registers.py").write_text(f"SANDBOX_REGISTERS = {sorted(case['registers'])!r}\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{STANDINS}:{image}",
           "SANDBOX_VLLM_FLAGS": str(FLAGS), **case["env"]}
    done = subprocess.run([shutil.which("python3") or sys.executable, "-S", "-c", STANDIN_SNIPPET,
                           json.dumps([case["model"], *case["argv"]])],
                          env=env, capture_output=True, text=True, timeout=60)
    found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not found:
        return {"code": -1, "message": f"the stand-in gave no answer: {done.stderr[-2000:]}"}
    return json.loads(found[-1][7:])


def same(real: dict, standin: dict) -> bool:
    """The same verdict; for a refusal, the same message (the stand-in's OK summary is its own)."""
    if (real["code"] == 0) != (standin["code"] == 0):
        return False
    return real["code"] == 0 or real["message"] == standin["message"]


def record(case: dict, real: dict, folder: Path, command: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"vllm": "0.33.0", "command": command,
            "faked": "no GPU: libcuda stub (CUDA_ERROR_NO_DEVICE), vLLM's NonNvmlCudaPlatform with a GB10's "
                     "figures (12.1, 121.7 GiB), VLLM_HAS_FLASHINFER_CUBIN=1, the image's registrations by "
                     "scripts/vllm033_image_plugin",
            "case": case["name"], "kind": case["kind"], "checkpoint": case.get("checkpoint", "plain"),
            "registers": case["registers"], "env": case["env"], "argv": case["argv"],
            "verdict": "OK" if real["code"] == 0 else "FAIL", "message": real["message"],
            "warnings": real["warnings"], "seconds": real["seconds"]}
    (folder / f"{case['name']}.json").write_text(json.dumps(data, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sparkstack", default=str(ROOT / ".venv" / "bin" / "sparkstack"),
                    help="the kit's command (default: the worktree's .venv)")
    ap.add_argument("--record", metavar="DIR", help="write the real verdicts as fixtures into DIR")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        return worker(opts.worker)
    kit_python = str(Path(opts.sparkstack).parent / "python")
    with tempfile.TemporaryDirectory(prefix="enginecheck-") as name:
        tmp = Path(name)
        models = checkpoints(tmp)
        planned = plan_cases(opts.sparkstack, kit_python)
        cases = planned + old_cases(planned)
        for case in cases:
            case["model"] = str(models[case.get("checkpoint", "plain")])
        real = real_verdicts(cases, tmp)
        bad = 0
        for case in cases:
            r, s = real[case["name"]], standin_verdict(case, tmp)
            ok = same(r, s)
            bad += not ok
            print(f"{'same' if ok else 'DIFF'} {case['name']}  (image registers: "
                  f"{', '.join(case['registers']) or 'nothing'}; {r['seconds']} s)")
            print(f"  vLLM:     {'OK' if r['code'] == 0 else 'FAIL'} {r['message']}")
            print(f"  stand-in: {'OK' if s['code'] == 0 else 'FAIL'} {s['message']}")
            for w in r["warnings"]:
                print(f"  vLLM warns: {w}")
            if opts.record:
                record(case, r, Path(opts.record), "/work/vllm033/venv/bin/python "
                       "scripts/check_engine_config_with_vllm.py --record " + opts.record)
        print(f"\n{len(cases)} argv, {len(cases) - bad} agree, {bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
