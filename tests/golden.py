"""Golden files: output compared with a file kept under tests/golden/.

`pytest --update-golden` rewrites a golden file whose content differs, and that test then FAILS
("golden rewritten: PATH, review the diff and re-run"): an update never passes by comparing
output with itself. The run after it, without the option, is the one that can pass.
The option is declared in conftest.py; the fixture `golden` is the one way tests use it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


class Golden:
    def __init__(self, update: bool):
        self.update = update

    def check(self, path: Path, text: str) -> None:
        """`text` must equal the file at `path`."""
        self.check_dir(path.parent, {path.name: text}, pattern=None)

    def check_dir(self, directory: Path, files: dict[str, str], pattern: str | None = "*") -> None:
        """`directory` must hold exactly `files` (name → text) among the names matching `pattern`
        (None: other files there are not looked at)."""
        present = {p.name for p in directory.glob(pattern)} if pattern and directory.is_dir() else set()
        if self.update:
            rewritten = []
            directory.mkdir(parents=True, exist_ok=True)
            for name in sorted(present - set(files)):
                (directory / name).unlink()
                rewritten.append(directory / name)
            for name, text in sorted(files.items()):
                path = directory / name
                if not path.is_file() or path.read_text() != text:
                    path.write_text(text)
                    rewritten.append(path)
            if rewritten:
                pytest.fail(f"golden rewritten: {', '.join(map(str, rewritten))}, review the diff and re-run",
                            pytrace=False)
            return
        if pattern:
            assert sorted(present) == sorted(files), f"golden files in {directory} (--update-golden rewrites them)"
        for name, text in files.items():
            path = directory / name
            assert path.is_file(), f"no golden file {path}: run pytest --update-golden, review it, re-run"
            assert text == path.read_text(), f"{path} differs (--update-golden rewrites it)"


@pytest.fixture
def golden(request) -> Golden:
    return Golden(request.config.getoption("--update-golden"))
