"""The sandbox's one error type: what went wrong and how to fix it."""

from __future__ import annotations

from ..errors import SparkstackError


class SandboxError(SparkstackError):
    exit_code = 1

    def __init__(self, message: str, fix: str | None = None):
        full = message if not fix else f"{message}\nfix: {fix}"
        super().__init__(full)
        self.problem = message
        self.fix = fix
