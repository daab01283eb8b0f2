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
