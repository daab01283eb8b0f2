"""The GPU rows: the GPU itself, the NVIDIA driver (the same on every rank, module and library
agreeing), the container runtime's NVIDIA configuration (CDI specs for the running driver) and
the GPU clock lock.
"""

from __future__ import annotations

from ...facts.record import Facts
from ...inputs import node_settings
from ...status import Status
from . import row
from .case import Case, RankReport
from .drift import compare, drift_row, not_measured


@row("gpu", order=40, reads=("gpu", "problems"))
def _check_gpu(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    if not inp.loaded.cluster.container.gpus:
        shown = f"; nvidia-smi shows {f.gpu.name}" if f.gpu else ""
        rr.add("gpu", Status.PASS, f"not required by config (container.gpus: null){shown}")
    elif f.gpu is None:
        why = next((p for p in f.problems if p.startswith("nvidia-smi")), "nvidia-smi lists no GPU")
        rr.add("gpu", Status.FAIL, why, "install the NVIDIA driver and container toolkit (DGX OS ships "
               "them); `nvidia-smi` must list the GB10")
    else:
        rr.add("gpu", Status.PASS, f"{f.gpu.name}, driver {f.gpu.driver}")


@row("driver", order=50, reads=("driver", "problems"))
def _check_driver(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The NVIDIA driver and the CUDA driver API version it gives: the same on every rank (NCCL
    and the engine's kernels across ranks), and the loaded module the same as the library."""
    d = f.driver
    if d is None:
        rr.add("driver", Status.WARN, not_measured(f, "driver"),
               "install the NVIDIA driver (DGX OS ships it); `nvidia-smi` must answer on every rank")
        return
    if d.version and d.kernel_module and d.version != d.kernel_module:
        rr.add("driver", Status.FAIL, f"the loaded kernel module is {d.kernel_module}, its library "
               f"{d.version} (Driver/library version mismatch)",
               "reboot this rank: the driver was upgraded and the old module is still loaded")
        return
    fix = ("install the same NVIDIA driver on every rank (DGX OS: `sudo apt update && sudo apt "
           "full-upgrade` on each, then reboot): ranks on different drivers do not form one TP group")
    values = {p: _driver_text(x.driver) for p, x in inp.facts.items() if x.driver}
    drift_row(rr, "driver", values, r, _driver_text(d), fix)


def _driver_text(d) -> str:
    return f"{d.version or d.kernel_module} (CUDA {d.cuda or '?'})"


@row("nvidia runtime", order=60, reads=("driver", "cdi_specs", "nvidia_ctk", "problems"))
def _check_nvidia_runtime(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The container runtime's NVIDIA configuration on this rank: a CDI spec generated for
    another driver than the one running (the trap after a driver upgrade) hands the container
    libraries that are not there; nvidia-ctk's version is compared across ranks."""
    name, d = "nvidia runtime", f.driver
    running = (d.version or d.kernel_module) if d else None
    bad = [s.problem for s in f.cdi_specs if s.problem]
    stale = [s for s in f.cdi_specs if not s.problem and running and s.driver and s.driver != running]
    if bad or stale:
        why = bad + [f"stale CDI spec: {s.path} names driver {s.driver}, the rank runs {running}" for s in stale]
        path = (stale or f.cdi_specs)[0].path
        rr.add(name, Status.FAIL, "; ".join(why), f"sudo nvidia-ctk cdi generate --output={path}")
        return
    specs = ", ".join(f"{s.path} (driver {s.driver or '?'})" for s in f.cdi_specs) or "no CDI spec"
    shown = f"{specs}; nvidia-ctk {f.nvidia_ctk or 'not installed'}"
    if running is None:
        rr.add(name, Status.WARN, f"{shown}; {not_measured(f, 'driver')}",
               "install the NVIDIA driver and container toolkit (DGX OS ships them)")
        return
    versions = {p: x.nvidia_ctk or "no nvidia-ctk" for p, x in inp.facts.items() if x.driver}
    odd, said = compare(versions, r)
    if odd:
        rr.add(name, Status.WARN, f"{shown}: NVIDIA Container Toolkit {said}",
               "install the same nvidia-container-toolkit on every rank (`sudo apt install nvidia-container-toolkit`)")
    else:
        rr.add(name, Status.PASS, shown + (f", {said}" if said else ""))


@row("gpu clock", order=70, reads=("gpu_clocks", "driver", "problems"))
def _check_gpu_clock(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """The GPU clock: the lock cluster.yaml's gpu_clock asks for, as prep or the Ansible unit
    recorded it, and the clocks nvidia-smi reads now."""
    name, want = "gpu clock", node_settings.gpu_clock_range(inp.loaded.cluster)
    c = f.gpu_clocks
    locked = c.locked if c else None
    now = (f"now {c.graphics_mhz or '?'} of max {c.max_graphics_mhz or '?'} MHz"
           if c and (c.graphics_mhz or c.max_graphics_mhz) else None)
    if want is not None and locked != want:
        found = f"locked {locked[0]},{locked[1]} MHz" if locked else "no lock recorded"
        rr.add(name, Status.FAIL, f"gpu_clock asks {want[0]},{want[1]} MHz, the rank has {found}"
               + (f" ({now})" if now else ""),
               "sparkstack prep (nvidia-smi -lgc; the Ansible role's unit sets it at every boot)")
    elif locked is not None and want is None:
        rr.add(name, Status.WARN, f"locked {locked[0]},{locked[1]} MHz by an earlier prep, but gpu_clock is unset",
               "sparkstack prep resets it (nvidia-smi -rgc)")
    elif now is None and f.driver is None:
        rr.add(name, Status.WARN, not_measured(f, "clock"),
               "install the NVIDIA driver (DGX OS ships it); `nvidia-smi -q -d CLOCK` must answer")
    else:
        lock = f"locked {want[0]},{want[1]} MHz (gpu_clock)" if want else "the driver's (no lock)"
        rr.add(name, Status.PASS, lock + (f"; {now}" if now else ""))
