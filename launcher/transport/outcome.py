"""One rank's result of an action run on every rank at once (Group.gather): its value, or the
exception it raised, kept beside the other ranks' results instead of replacing them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import SparkstackError
from .target import Target

T = TypeVar("T")


@dataclass(frozen=True)
class RankOutcome(Generic[T]):
    target: Target
    value: T | None = None
    error: BaseException | None = None

    @property
    def rank(self) -> int:
        return self.target.rank

    @property
    def ok(self) -> bool:
        return self.error is None

    def get(self) -> T:
        """The value; the rank's exception raised again when it had one."""
        if self.error is not None:
            raise self.error
        return self.value

    def why(self) -> str:
        """The error as one line naming the rank: a SparkstackError's own message, else the
        exception's type and text (a fault of ours, not the rank's, but only this rank's)."""
        e = self.error
        text = e.message if isinstance(e, SparkstackError) else f"{type(e).__name__}: {e}"
        name = self.target.name
        return text if text.startswith(name) else f"{name}: {text}"


def values(outcomes: list[RankOutcome[T]]) -> list[T]:
    """Every rank's value, in order, or the first rank's exception (all or nothing)."""
    return [o.get() for o in outcomes]
