"""Where the kit's resources are: `images/` (the chain's stages), `templates/` (the Dockerfile,
engine and systemd templates) and `env/` (the serving profiles, the example cluster.yaml).

They live at the repository's top level. A built wheel carries a copy of them as
`launcher/_resources/` (setup.py's build_py puts it there), so an installed `sparkstack`
(`pip install .`, pipx, `uv tool install`) finds its own profiles from any directory. This is the
one place that decides which: the package's copy when there is one, else the checkout's folders.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLED = PACKAGE / "_resources"
ROOT = BUNDLED if BUNDLED.is_dir() else PACKAGE.parent

IMAGES_DIR = ROOT / "images"
TEMPLATES_DIR = ROOT / "templates"
ENV_DIR = ROOT / "env"
ANSIBLE_DIR = ROOT / "ansible"  # the playbooks and role (init addresses the fabric through it)
PROFILES_DIR = ENV_DIR / "profiles"
