"""Packaging. pyproject.toml holds everything about the project; this file only makes the wheel
carry the repository's top-level images/, templates/, env/ and ansible/ inside the package, as
launcher/_resources/, where launcher/resources.py finds them once installed. An editable install
(`pip install -e`) reads the checkout's own folders instead, so it gets no copy."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
RESOURCES = ("images", "templates", "env", "ansible")


class BuildWithResources(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "launcher" / "_resources"
        shutil.rmtree(target, ignore_errors=True)  # a stale copy from an earlier build goes
        for name in RESOURCES:
            shutil.copytree(HERE / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildWithResources})
