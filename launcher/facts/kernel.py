"""The kernel's own words: the host name, the release, the sysctls asked for and the page size."""

from __future__ import annotations

from .parts import Part, key, verbatim


def parse_sysctls(raw: dict) -> dict[str, str | None]:
    """Values as `sysctl -n` prints them (tabs of multi-value entries become single spaces);
    None for a sysctl this kernel does not have or would not let us read."""
    return {name: " ".join(v.split()) if isinstance(v, str) else None for name, v in sorted(raw.items())}


def parse_page_size(raw) -> int | None:
    return raw if type(raw) is int and raw > 0 else None


HOSTNAME = Part("hostname", "hostname", verbatim, (key("hostname", ""),))
KERNEL = Part("kernel", "kernel", verbatim, (key("kernel", ""),))
SYSCTLS = Part("sysctls", "sysctls", parse_sysctls, (key("sysctls", {}),))
PAGE_SIZE = Part("page_size", "page_size", parse_page_size, (key("page_size"),))


def parse_sysfs_root(args: dict) -> str:
    """Where the probe read the kernel's sysfs classes: "/" on a Spark; a sandbox rank's fixture
    root when the kit named one or the rank declared one (onrank/probe.py, STANDIN_HARDWARE)."""
    root = args.get("sysfs_root") or "/"
    if not isinstance(root, str):
        raise TypeError(f"sysfs_root {root!r:.40}")
    return "/" if root.rstrip("/") in ("", "/sys") else root


SYSFS_ROOT = Part("sysfs_root", "sysfs root", parse_sysfs_root, (key("args", {}),))
