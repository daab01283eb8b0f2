"""The image chain: stages under `images/<stage>/`, rendered into Dockerfiles and tagged by content.

A stage is a directory holding `Dockerfile.j2` (starting `FROM {{ parent }}`) and `stage.yaml`
(its parent stage or `base`, the files it takes from the serving-patch directory, build args).
The profile names the chain (`image.chain`); this module turns it into pure data, a `Chain`,
refusing a missing stage, a missing parent, a cycle, a missing patch file or a template error
before anything is built, every problem at once, each naming the stage and the file.

A stage's tag is a hash of everything that makes the image: the rendered Dockerfile (the shared
templates included), the bytes of every file it copies, its build args, its labels (stage and
profile) and its parent's hash. So an unchanged chain has the tags Docker already holds, and a
changed stage changes its own tag and, through the parent hash, its descendants' only.

The base image enters by name, or by name and image ID when the local Docker has it (the caller
passes the ID; this module never talks to Docker). The ID is what matters: a base re-pulled or
rebuilt under the same name must rebuild the chain over it, and an image ID is the hash of the
image's config, the same on every host that holds the same image.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from typing import Annotated

from pydantic import AfterValidator, field_validator

from .. import resources
from ..errors import ConfigError, load_yaml_model
from ..inputs import capabilities
from ..inputs.profile import Strict

IMAGES_DIR = resources.IMAGES_DIR
TEMPLATES_DIR = resources.TEMPLATES_DIR
REPOSITORY = "sparkstack"  # tags are <repository>/<stage>:<hash>
BASE = "base"              # a stage whose parent is the base image says `parent: base`
TAG_HEX = 16               # hex digits of the hash kept in the tag (64 bits: no collisions here)
FORMAT = b"sparkstack-stage-v1"  # bump when the hashed inputs change meaning
LABEL = "org.sparkstack"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")  # a Docker repository path component


class FileSpec(Strict):
    """One file the stage takes from the patch directory."""

    src: str                   # relative to the patch directory
    dest: str | None = None    # <package>/<path in it>; None: the stage's own RUN places it
    replaces: bool = False     # an overlay: the destination must already exist in the base

    @field_validator("src")
    @classmethod
    def _relative(cls, v: str) -> str:
        if v.startswith("/") or ".." in Path(v).parts or not v.strip():
            raise ValueError("must be a path inside the patch directory (relative, no ..)")
        return v

    @field_validator("dest")
    @classmethod
    def _in_package(cls, v: str | None) -> str | None:
        package, _, path = (v or "").partition("/")
        if v is not None and (not package.isidentifier() or not path or ".." in Path(path).parts):
            raise ValueError("must be <python package>/<path inside it>, e.g. "
                             "vllm/model_executor/layers/quantization/exl3.py")
        return v


class StageSpec(Strict):
    """`images/<stage>/stage.yaml`."""

    description: str
    parent: str                # `base` or another stage's name
    files: list[FileSpec] = []
    args: dict[str, str] = {}  # build args (ARG in the Dockerfile), part of the tag
    # what the stage's files register with vLLM (launcher/inputs/capabilities.py); not part of
    # the tag: it changes nothing that is built
    brings: list[Annotated[str, AfterValidator(capabilities.check_name)]] = []


@dataclass(frozen=True)
class Stage:
    """A stage as defined on disk."""

    name: str
    dir: Path
    spec: StageSpec

    @property
    def meta(self) -> Path:
        return self.dir / "stage.yaml"

    @property
    def template(self) -> Path:
        return self.dir / "Dockerfile.j2"


@dataclass(frozen=True)
class Base:
    """The base image: its name, and its image ID when the local Docker holds it."""

    name: str
    image_id: str | None = None

    @property
    def identity(self) -> str:
        return f"{self.name}@{self.image_id}" if self.image_id else self.name


@dataclass(frozen=True)
class ContextFile:
    """A file of a stage's build context, read once: what is hashed is what is sent."""

    path: str                  # inside the context: files/<src>
    source: Path
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class RenderedStage:
    name: str
    parent: str                # the FROM reference: the base's name or the parent stage's tag
    dockerfile: str
    files: tuple[ContextFile, ...]
    args: dict[str, str]
    labels: dict[str, str]
    digest: str                # sha256 hex of every input; the tag keeps its first TAG_HEX digits
    tag: str
    template: Path


@dataclass(frozen=True)
class Chain:
    profile: str
    base: Base
    stages: tuple[RenderedStage, ...]

    @property
    def top(self) -> str:
        return self.stages[-1].tag if self.stages else self.base.name

    def stage(self, name: str) -> RenderedStage:
        return next(s for s in self.stages if s.name == name)


# ----------------------------------------------------------------------------------------------
# Loading: the stages named by a profile, in build order, with their parents checked

def load_stages(names: list[str], images_dir: Path = IMAGES_DIR, where: str = "image.chain") -> list[Stage]:
    """The stages `names` (a profile's chain, base first), each one's parent being the one before.

    `where` names the list in messages ("env/profiles/x.yaml: image.chain"). Raises ConfigError
    with every problem found."""
    if not names:
        return []
    problems: list[str] = []
    defined = _defined(images_dir)
    for i, name in enumerate(names):
        if name not in defined:
            known = ", ".join(sorted(defined)) or "none"
            problems.append(f"{where}: stage {name!r}: no {images_dir / name / 'stage.yaml'} (stages: {known})")
        elif not _NAME.match(name):
            problems.append(f"{where}: stage {name!r}: a stage name is lower-case letters, digits, "
                            f"'.', '_' or '-' (it becomes the image's name)")
        elif name in names[:i]:
            problems.append(f"{where}: stage {name!r} is listed twice")
    if problems:
        raise ConfigError(problems)
    specs = _read_specs(names, defined, problems)
    problems += _cycles(names, specs, defined)
    if not problems:
        problems += _order(names, specs, defined, where)
    if problems:
        raise ConfigError(problems)
    return [Stage(n, defined[n], specs[n]) for n in names]


def _defined(images_dir: Path) -> dict[str, Path]:
    return {p.parent.name: p.parent for p in sorted(images_dir.glob("*/stage.yaml"))}


def _read_specs(names: list[str], defined: dict[str, Path], problems: list[str]) -> dict[str, StageSpec]:
    """The listed stages' specs and, for the cycle check, the specs of the parents they reach."""
    specs: dict[str, StageSpec] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in specs or name not in defined:
            continue
        try:
            specs[name] = load_yaml_model(defined[name] / "stage.yaml", StageSpec, "stage")
        except ConfigError as e:
            problems.extend(e.problems)
            continue
        todo.append(specs[name].parent)
    return specs


def _cycles(names: list[str], specs: dict[str, StageSpec], defined: dict[str, Path]) -> list[str]:
    """Following parents from each listed stage must end at `base`; report each loop once."""
    found: list[str] = []
    seen_loops: set[frozenset[str]] = set()
    for start in names:
        path = [start]
        while path[-1] in specs:
            parent = specs[path[-1]].parent
            if parent in path:
                loop = path[path.index(parent):] + [parent]
                if frozenset(loop) not in seen_loops:
                    seen_loops.add(frozenset(loop))
                    files = ", ".join(str(defined[n] / "stage.yaml") for n in loop[:-1])
                    found.append(f"stage {parent!r}: its parents form a cycle {' → '.join(loop)} ({files})")
                break
            path.append(parent)
    return found


def _order(names: list[str], specs: dict[str, StageSpec], defined: dict[str, Path], where: str) -> list[str]:
    """The chain is linear: the first stage's parent is the base, each next one's the stage before."""
    problems = []
    for i, name in enumerate(names):
        expected = names[i - 1] if i else BASE
        parent = specs[name].parent
        if parent == expected:
            continue
        meta = defined[name] / "stage.yaml"
        if parent == BASE:
            problems.append(f"{where}: stage {name!r} builds on the base image ({meta}: parent: base), "
                            f"so it must come first")
        elif parent not in defined:
            problems.append(f"{where}: stage {name!r}: its parent {parent!r} ({meta}) is no stage: "
                            f"no {meta.parent.parent / parent / 'stage.yaml'}")
        elif parent not in names:
            problems.append(f"{where}: stage {name!r}: its parent {parent!r} ({meta}) is missing "
                            f"from the chain [{', '.join(names)}]")
        else:
            problems.append(f"{where}: stage {name!r} must come right after its parent {parent!r} "
                            f"({meta}), not after {expected!r}")
    return problems


# ----------------------------------------------------------------------------------------------
# Rendering and tagging: pure functions of the stages, the files and the base

def render_chain(stages: list[Stage], base: Base, patches_dir: Path, profile: str,
                 templates_dir: Path = TEMPLATES_DIR, repository: str = REPOSITORY) -> Chain:
    """Read every stage's files, render its Dockerfile and compute its tag, base first.

    Raises ConfigError listing every missing patch file and template error of the chain."""
    problems: list[str] = []
    files = {s.name: _read_files(s, patches_dir, problems) for s in stages}
    env = _jinja_env(stages[0].dir.parent if stages else IMAGES_DIR, templates_dir)
    rendered: list[RenderedStage] = []
    parent_ref, parent_identity = base.name, base.identity
    for stage in stages:
        text = _render(env, stage, parent_ref, problems)
        if text is None or problems:
            parent_ref = parent_identity = f"{repository}/{stage.name}:unrendered"
            continue
        out = _tagged(stage, text, files[stage.name], parent_ref, parent_identity, base, profile, repository)
        rendered.append(out)
        parent_ref, parent_identity = out.tag, out.digest
    if problems:
        raise ConfigError(problems)
    return Chain(profile, base, tuple(rendered))


def _read_files(stage: Stage, patches_dir: Path, problems: list[str]) -> tuple[ContextFile, ...]:
    out = []
    for i, f in enumerate(stage.spec.files):
        source = patches_dir / f.src
        try:
            out.append(ContextFile(f"files/{f.src}", source, source.read_bytes()))
        except OSError as e:
            why = "not found" if isinstance(e, FileNotFoundError) else (e.strerror or str(e))
            problems.append(f"stage {stage.name!r} ({stage.meta}): files[{i}].src: {source}: {why} "
                            f"(the patch directory is cluster.yaml images.patches_dir)")
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _jinja_env(images_dir: Path, templates_dir: Path) -> jinja2.Environment:
    # one per directory pair: compiled templates are kept, and re-read when their file changes.
    # StrictUndefined: a misspelt variable is an error, not an empty string in a Dockerfile
    return jinja2.Environment(loader=jinja2.FileSystemLoader([str(images_dir), str(templates_dir)]),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


def _render(env: jinja2.Environment, stage: Stage, parent: str, problems: list[str]) -> str | None:
    if not stage.template.is_file():
        problems.append(f"stage {stage.name!r}: no {stage.template}")
        return None
    files = [{"src": f.src, "dest": f.dest, "replaces": f.replaces, "context": f"files/{f.src}",
              "package": (f.dest or "").partition("/")[0], "path": (f.dest or "").partition("/")[2]}
             for f in stage.spec.files]
    try:
        text = env.get_template(f"{stage.name}/Dockerfile.j2").render(
            parent=parent, stage=stage.name, files=files, args=stage.spec.args)
    except jinja2.TemplateSyntaxError as e:
        problems.append(f"stage {stage.name!r}: {e.filename or stage.template}:{e.lineno}: "
                        f"template error: {e.message}")
        return None
    except jinja2.TemplateError as e:
        file, line = _template_frame(e, stage.template)
        problems.append(f"stage {stage.name!r}: {file}:{line}: template error: {e.message or e}")
        return None
    lines = instruction_lines(text)
    first = lines[0][1] if lines else ""
    if first.split() != ["FROM", parent]:
        problems.append(f"stage {stage.name!r}: {stage.template}: the first instruction must be "
                        f"`FROM {{{{ parent }}}}` (rendered: {first or 'nothing'!r})")
        return None
    return text


def _template_frame(e: Exception, default: Path) -> tuple[str, int | str]:
    """The innermost template file and line of a render-time error (jinja2 keeps them in the
    traceback it rewrites)."""
    found: tuple[str, int | str] = (str(default), "?")
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.endswith(".j2"):
            found = (name, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _tagged(stage: Stage, text: str, files: tuple[ContextFile, ...], parent_ref: str,
            parent_identity: str, base: Base, profile: str, repository: str) -> RenderedStage:
    labels = {f"{LABEL}.stage": stage.name, f"{LABEL}.profile": profile,
              f"{LABEL}.parent": parent_ref, f"{LABEL}.base": base.name}
    digest = content_digest(text, files, stage.spec.args, labels, parent_identity)
    labels[f"{LABEL}.chain"] = digest  # this stage and its ancestors; not hashed (it is the hash)
    return RenderedStage(stage.name, parent_ref, text, files, dict(stage.spec.args), labels, digest,
                         f"{repository}/{stage.name}:{digest[:TAG_HEX]}", stage.template)


def content_digest(dockerfile: str, files: tuple[ContextFile, ...], args: dict[str, str],
                   labels: dict[str, str], parent: str) -> str:
    """sha256 over a stage's inputs, each length-prefixed so no two input sets hash alike."""
    h = hashlib.sha256()

    def put(kind: bytes, data: bytes) -> None:
        h.update(kind + b"\0" + str(len(data)).encode() + b"\0" + data)

    put(b"format", FORMAT)
    put(b"parent", parent.encode())
    put(b"dockerfile", dockerfile.encode())
    for f in sorted(files, key=lambda f: f.path):
        put(b"file", f.path.encode())
        put(b"bytes", f.data)
    put(b"args", json.dumps(args, sort_keys=True).encode())
    put(b"labels", json.dumps(labels, sort_keys=True).encode())
    return h.hexdigest()


def instruction_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) per Dockerfile instruction, continuations joined: Docker's step
    N is instruction N (build errors name the line), and the first must be FROM the parent."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not current:
            start = number
        current.append(stripped.removesuffix("\\").strip())
        if not stripped.endswith("\\"):
            out.append((start, " ".join(current)))
            current = []
    if current:
        out.append((start, " ".join(current)))
    return out


# ----------------------------------------------------------------------------------------------
# From a loaded config

def base_name(loaded) -> str | None:
    """The base image: cluster.yaml images.base, else the profile's."""
    return loaded.cluster.images.base or loaded.profile.image.base


def patches_dir(loaded) -> Path:
    """cluster.yaml images.patches_dir, relative paths taken from the config file's directory."""
    given = loaded.cluster.images.patches_dir
    if given is None:
        raise ConfigError([f"{loaded.path}: images.patches_dir: required to build profile "
                           f"{loaded.profile.name}'s image chain (your checkout's serving/ patch files)"])
    path = given if given.is_absolute() else loaded.path.parent / given
    if not path.is_dir():
        raise ConfigError([f"{loaded.path}: images.patches_dir: {path} is not a directory"])
    return path


def chain_for(loaded, base_id: str | None = None, images_dir: Path = IMAGES_DIR,
              templates_dir: Path = TEMPLATES_DIR, repository: str = REPOSITORY) -> Chain:
    """The profile's chain, rendered and tagged, without Docker. `base_id`: the base's local
    image ID when known (see the module's docstring)."""
    profile = loaded.profile
    if profile.image.prebuilt:
        return Chain(profile.name, Base(loaded.cluster.images.base or profile.image.prebuilt), ())
    stages = load_stages(profile.image.chain, images_dir, f"profile {profile.name}: image.chain")
    base = Base(base_name(loaded), base_id)
    if not stages:
        return Chain(profile.name, base, ())
    return render_chain(stages, base, patches_dir(loaded), profile.name, templates_dir, repository)


# ----------------------------------------------------------------------------------------------
# Build contexts: only the stage's Dockerfile and its own files

def context_dockerfile(stage: RenderedStage) -> str:
    """The Dockerfile sent to Docker: the rendered one plus ONE LABEL instruction. Labels given
    through the build API instead cost the classic builder a committed step per label (~1 s each
    here); the labels are hashed into the tag all the same, the chain label being that hash."""
    pairs = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(stage.labels.items()))
    return f"{stage.dockerfile.rstrip()}\n# set by sparkstack build\nLABEL {pairs}\n"


def context_tar(stage: RenderedStage) -> bytes:
    """The stage's build context as an uncompressed tar: `Dockerfile` and `files/...`. Entries are
    normalised (mtime 0, root, 0644) so the same inputs give the same bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = [("Dockerfile", context_dockerfile(stage).encode())] + [(f.path, f.data) for f in stage.files]
        dirs = sorted({str(p) for path, _ in entries for p in Path(path).parents if str(p) != "."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in entries:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_contexts(chain: Chain, out_dir: Path) -> list[Path]:
    """`--render-only`: each stage's build context under out_dir/<stage>/ (build it by hand with
    `docker build out_dir/<stage>`), and TAGS listing stage and tag."""
    try:
        return _write_contexts(chain, out_dir)
    except OSError as e:  # e.g. /proc, a read-only mount, a file where a directory goes
        raise ConfigError([f"--render-only {out_dir}: cannot write {e.filename or out_dir} ({e.strerror}); "
                           "name a directory you can write"]) from None


def _write_contexts(chain: Chain, out_dir: Path) -> list[Path]:
    written = []
    for stage in chain.stages:
        d = out_dir / stage.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "Dockerfile").write_text(context_dockerfile(stage))
        for f in stage.files:
            (d / f.path).parent.mkdir(parents=True, exist_ok=True)
            (d / f.path).write_bytes(f.data)
        written.append(d / "Dockerfile")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "TAGS").write_text("".join(f"{s.name} {s.tag}\n" for s in chain.stages))
    return written


def image_caps(loaded) -> capabilities.ImageCaps:
    """What the profile's serving image brings (its `image.brings`, then each chain stage's
    `brings`) and what every stage under images/ would: read from the stages' metadata, for the
    plan to judge (ConfigError: a stage that does not load)."""
    spec = loaded.profile.image
    source = f"prebuilt image {spec.prebuilt}" if spec.prebuilt else f"base image {spec.base}"
    brings = [(source, tuple(spec.brings or ()))]
    brings += [(s.name, tuple(s.spec.brings)) for s in load_stages(list(spec.chain))]
    catalog = []
    for name, folder in _defined(IMAGES_DIR).items():
        try:
            stage_spec = load_yaml_model(folder / "stage.yaml", StageSpec, "stage")
        except ConfigError:
            continue
        catalog.append((name, tuple(stage_spec.brings)))
    return capabilities.ImageCaps(tuple(brings), tuple(catalog), spec.brings is not None)
