"""Memory: /proc/meminfo, in bytes (vLLM's startup guard and `check`'s memory rows read it)."""

from __future__ import annotations

from dataclasses import dataclass

from .parts import FactError, Part, key


@dataclass(frozen=True)
class Memory:
    total: int
    available: int
    free: int
    cached: int
    buffers: int
    swap_total: int
    swap_free: int


def parse_meminfo(text: str) -> Memory:
    """/proc/meminfo, "Name:   123 kB" lines, into bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    missing = [k for k in ("MemTotal", "MemAvailable") if k not in values]
    if missing:
        raise FactError(f"/proc/meminfo: no {', '.join(missing)}")
    if values["MemTotal"] == 0:  # vLLM's guard divides by it
        raise FactError("/proc/meminfo: MemTotal is 0")
    return Memory(values["MemTotal"], values["MemAvailable"], values.get("MemFree", 0),
                  values.get("Cached", 0), values.get("Buffers", 0), values.get("SwapTotal", 0),
                  values.get("SwapFree", 0))


def parse_memory(meminfo) -> Memory | None:
    """The probe's copy of /proc/meminfo; None when it could not read the file (record.py's
    source problems say so)."""
    return parse_meminfo(meminfo) if isinstance(meminfo, str) else None


MEMORY = Part("memory", "/proc/meminfo", parse_memory, (key("meminfo"),), problem=True)
