"""`check`'s rows, one module per subject, each row DECLARED where it is written:

    @row("swap", order=120, reads=("memory",))
    def _check_swap(inp: Case, r: int, f: Facts, rr: RankReport) -> None: ...

`name` is the row's name (the table's first column, `check --json`'s "name"), `order` its place
among the rows (the table shows them by it), `reads` the facts it reads (the Facts fields, or a
part of the gathered value: extras, targets, staged, key). A row that applies only sometimes
(`sometimes=True`: staged, with model.local_path) adds nothing when it does not apply and is not
in ORDER, the rows every reached rank shows. The folder's modules are found by `declared()`
(pkgutil): adding a row over facts already gathered is ONE new module here.

A row judges only: the gathered value (launcher/gather/) and the plan's figures through `Case`
(launcher/check/report.py). May import what launcher/check/ may.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Declared:
    name: str
    order: int
    reads: tuple[str, ...]
    judge: Callable  # (inp: Case, r: int, f: Facts, rr: RankReport) -> None: adds its row to rr
    sometimes: bool = False


_DECLARED: dict[str, Declared] = {}


def row(name: str, *, order: int, reads: tuple[str, ...], sometimes: bool = False):
    """Declare the function below as the row `name`, shown at `order`, reading `reads`."""
    def declare(judge: Callable) -> Callable:
        same = _DECLARED.get(name)
        if same and same.judge.__qualname__ != judge.__qualname__:
            raise ValueError(f"check row {name!r} is declared twice")
        taken = [d.name for d in _DECLARED.values() if d.order == order and d.name != name]
        if taken:
            raise ValueError(f"check row {name!r}: order {order} is {taken[0]!r}'s")
        _DECLARED[name] = Declared(name, order, tuple(reads), judge, sometimes)
        return judge
    return declare


def declared() -> list[Declared]:
    """Every row of this folder, in order (each module imported once, by name)."""
    for found in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{found.name}")
    return sorted(_DECLARED.values(), key=lambda d: d.order)
