"""Shared test fixtures: the project's paths and a way to write cluster configs."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
EXAMPLE_CONFIG = ROOT / "env" / "cluster.example.yaml"


def example_config() -> dict:
    return yaml.safe_load(EXAMPLE_CONFIG.read_text())


@pytest.fixture
def write_config(tmp_path):
    """Write a cluster.yaml built from the example; `edit` changes the parsed dict in place."""

    def write(edit=None, text: str | None = None, name: str = "cluster.yaml") -> Path:
        path = tmp_path / name
        if text is None:
            data = copy.deepcopy(example_config())
            if edit:
                edit(data)
            text = yaml.safe_dump(data, sort_keys=False)
        path.write_text(text)
        return path

    return write


from sandbox_fixture import sandbox  # noqa: E402,F401  (session-scoped: four ranks, up once)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On CI (SPARKSTACK_NO_SKIPS=1) a skip is a failure: a missing tool must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SPARKSTACK_NO_SKIPS") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
