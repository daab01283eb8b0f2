"""The GPU and its driver stack: `nvidia-smi`'s GPU and clocks, the driver's versions (user-space
library, CUDA, kernel module), the recorded clock lock, the NVIDIA CDI specs and the Container
Toolkit's version."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .parts import Part, command, key


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    memory_total: int | None  # None on GB10: unified memory reads "[N/A]"


@dataclass(frozen=True)
class Driver:
    """The NVIDIA driver as the rank runs it: nvidia-smi's (the user-space library's) version and
    the CUDA driver API version it reports, and the loaded kernel module's version."""

    version: str | None  # "580.95.05" (nvidia-smi -q: Driver Version)
    cuda: str | None  # "13.0" (nvidia-smi -q: CUDA Version)
    kernel_module: str | None = None  # /proc/driver/nvidia/version's (NVRM) version


@dataclass(frozen=True)
class GpuClocks:
    """Graphics clocks (MHz) from `nvidia-smi -q -d CLOCK`, and the lock prep or the Ansible unit
    applied since the boot (nvidia-smi has no query for an -lgc lock, so they record it)."""

    graphics_mhz: int | None  # now
    max_graphics_mhz: int | None  # the hardware's top
    locked: tuple[int, int] | None = None  # the -lgc MIN,MAX applied; None: none recorded


@dataclass(frozen=True)
class CdiSpec:
    """An NVIDIA CDI spec the container runtime reads (nvidia-ctk cdi generate)."""

    path: str
    driver: str | None  # the driver version it was generated for; None: none named in it
    problem: str | None = None  # unreadable or not a CDI spec


_MEMORY = re.compile(r"^(\d+)\s*MiB$")


def parse_gpu(nvidia_smi: dict | None) -> Gpu | None:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`, first
    GPU. Memory "[N/A]" (GB10's unified memory) or "Not Supported" reads as None."""
    if not nvidia_smi or nvidia_smi.get("rc") != 0:
        return None
    for line in nvidia_smi["stdout"].splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 3 and cols[0]:
            memory = _MEMORY.match(cols[2])
            return Gpu(cols[0], cols[1], int(memory.group(1)) << 20 if memory else None)
    return None


_HEADER_LINE = re.compile(r"^(Driver Version|CUDA Version)\s*:\s*(\S+)\s*$")
_NVRM = re.compile(r"^NVRM version:.*?Kernel Module\S*(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)*)")


def parse_driver(nvidia_smi_clocks: dict | None, proc_version: str | dict | None) -> Driver | None:
    """`nvidia-smi -q`'s header ("Driver Version : 580.95.05", "CUDA Version : 13.0") and
    /proc/driver/nvidia/version's first line ("NVRM version: NVIDIA UNIX Open Kernel Module for
    aarch64  580.95.05  Release Build ..."); None when neither names a version."""
    found: dict[str, str] = {}
    if nvidia_smi_clocks and nvidia_smi_clocks.get("rc") == 0:
        for line in nvidia_smi_clocks["stdout"].splitlines():
            m = _HEADER_LINE.match(line.strip())
            if m and m[2] != "N/A":
                found.setdefault(m[1], m[2])
    module = None
    if isinstance(proc_version, str):
        m = _NVRM.match(proc_version.strip())
        module = m[1] if m else None
    if not found and module is None:
        return None
    return Driver(found.get("Driver Version"), found.get("CUDA Version"), module)


_CLOCK_LINE = re.compile(r"^(\w[\w ]*?)\s*:\s*(\d+) MHz$")
_LOCK = re.compile(r"^(\d+),(\d+)$")


def parse_gpu_clocks(nvidia_smi_clocks: dict | None, lock_file: str | dict | None) -> GpuClocks | None:
    """The first GPU's "Clocks" and "Max Clocks" Graphics lines of `nvidia-smi -q -d CLOCK`
    ("N/A" reads None), and the lock recorded in /run/sparkstack/gpu-clock ("MIN,MAX")."""
    m = _LOCK.match(lock_file.strip()) if isinstance(lock_file, str) else None
    locked = (int(m[1]), int(m[2])) if m else None
    if not nvidia_smi_clocks or nvidia_smi_clocks.get("rc") != 0:
        return GpuClocks(None, None, locked) if locked else None
    section, values = None, {}
    for line in nvidia_smi_clocks["stdout"].splitlines():
        if line.startswith("GPU ") and values:
            break  # the first GPU only
        text = line.strip()
        if text and ":" not in text:
            section = text
            continue
        c = _CLOCK_LINE.match(text)
        if c and c[1] == "Graphics":
            values.setdefault(section, int(c[2]))
    return GpuClocks(values.get("Clocks"), values.get("Max Clocks"), locked)


_CDI_DRIVER = (re.compile(r"--host-driver-version=(\d+\.\d+(?:\.\d+)*)"),
               re.compile(r"/libcuda\.so\.(\d+\.\d+(?:\.\d+)*)\b"),
               re.compile(r"/libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)*)\b"))


def parse_cdi_specs(raw: dict | None) -> tuple[CdiSpec, ...]:
    """NVIDIA CDI specs (YAML from `nvidia-ctk cdi generate`, read as text: no YAML parser on
    the probe's side, nor needed here): the driver version they were generated for, from the
    enable-cuda-compat hook's --host-driver-version= or the versioned libcuda / libnvidia-ml
    they mount. Absent files are left out."""
    out = []
    for path, text in sorted((raw or {}).items()):
        if text is None:
            continue
        if not isinstance(text, str):
            why = text.get("error") if isinstance(text, dict) else None
            out.append(CdiSpec(path, None, f"{path}: unreadable ({why if isinstance(why, str) else repr(text)[:60]})"))
            continue
        if "nvidia.com/" not in text or "cdiVersion" not in text:
            out.append(CdiSpec(path, None, f"{path}: not an NVIDIA CDI spec (no cdiVersion / kind nvidia.com/...)"))
            continue
        version = next((m[1] for pattern in _CDI_DRIVER for m in [pattern.search(text)] if m), None)
        out.append(CdiSpec(path, version))
    return tuple(out)


_CTK_VERSION = re.compile(r"version\s+v?(\d+\.\d+\.\d+\S*)", re.I)


def parse_nvidia_ctk(result: dict | None) -> str | None:
    """`nvidia-ctk --version`: "NVIDIA Container Toolkit CLI version 1.17.8" -> "1.17.8"."""
    if not result or result.get("rc") != 0:
        return None
    m = _CTK_VERSION.search(result.get("stdout") or "")
    return m[1] if m else None


GPU = Part("gpu", "nvidia-smi", parse_gpu, (command("nvidia_smi"),), problem=True)
DRIVER = Part("driver", "nvidia driver", parse_driver, (command("nvidia_smi_clocks"), key("nvidia_driver_proc")))
GPU_CLOCKS = Part("gpu_clocks", "gpu clocks", parse_gpu_clocks, (command("nvidia_smi_clocks"), key("gpu_clock_file")))
CDI_SPECS = Part("cdi_specs", "cdi specs", parse_cdi_specs, (key("cdi_specs"),))
NVIDIA_CTK = Part("nvidia_ctk", "nvidia-ctk", parse_nvidia_ctk, (command("nvidia_ctk"),))
