"""The package's layers, read from its source, against the floor plan declared below (LAYERS):
a folder imports only folders of LOWER layers (never upward, never a folder of its own layer), no
two modules import each other round a loop, nothing outside launcher/sandbox/ imports the sandbox,
no module outside the sandbox is longer than MAX_LINES, and what runs on a rank (onrank/, the
sandbox's stand-ins and the kit module they carry) imports nothing of the kit, only the standard
library.

Every import counts: the ones inside functions (a lazy import is still an arrow) and the ones
under `if TYPE_CHECKING:` (a type's home is still a dependency)."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "launcher"

# The floor plan, bottom to top (docs/architecture.md): a folder may import only the folders of
# the layers beneath it. "launcher" is the package's own top-level modules (ROOT_MODULES). A
# declared folder must exist, and a folder that is not declared is a violation.
LAYERS = (
    ("launcher",),                            # 0  errors, redact, resources, status (Finding)
    ("launcher.onrank",),                     # 1  scripts sent to a rank (stdlib only)
    ("launcher.facts",),                      # 2  pure parsers, one module per subject
    ("launcher.engines",),                    # 3  the engine interface, one module per engine
    ("launcher.inputs",),                     # 4  config, profile, vLLM's options, guard, api key
    ("launcher.transport",),                  # 5  remote (ssh), outcome, api
    ("launcher.images",),                     # 6  the chain, local docker, build, registry, ship
    ("launcher.gather",),                     # 7  the one value the plan takes
    ("launcher.plan",),                       # 8  pure
    ("launcher.check",),                      # 9  pure judging, declared rows
    ("launcher.apply", "launcher.bench", "launcher.init"),  # 10
    ("launcher.cli",),                        # 11 one module per command
    ("launcher.sandbox",),                    # 12 imported by nothing outside it
)
ROOT_MODULES = {"__init__", "errors", "redact", "resources", "status"}
SANDBOX = "launcher.sandbox"
MAX_LINES = 650  # no module outside launcher/sandbox/ is longer
LAYER = {folder: n for n, folders in enumerate(LAYERS) for folder in folders}

# Run on a rank (or in the sandbox's image) by a bare python3: what its standard library has.
# A rank promises Python 3.8+, so nothing the standard library gained after 3.8.
STDLIB = set(sys.stdlib_module_names) - {"graphlib", "zoneinfo", "tomllib"}
STANDALONE = {"launcher.onrank": {"nccl_allreduce": {"torch"},  # these two run in the serving image
                                  "engine_config": {"vllm", "standin_vllm"}},
              "launcher.sandbox.standins": {},
              "launcher.inputs.vllm_options": {}}  # copied beside the stand-ins, as is
# The stand-ins are installed side by side in the image's dist-packages and import one another,
# and the kit's vllm_options copied beside them; onrank's scripts are each sent alone.
SIDE_BY_SIDE = {"launcher.sandbox.standins": {"vllm_options"}}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(name: str) -> str:
    """The layer folder a module lives in: launcher/<folder>/ (its subfolders included), or
    "launcher" for the package's own top-level modules."""
    parts = name.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "launcher"


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str, str | None]]:
    """Every import in the file: (line, absolute module, name imported from it or None)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found += [(node.lineno, module, a.name) for a in node.names]
    return found


def kit_target(module: str, name: str | None) -> str | None:
    """The kit module an import reaches (`from launcher.x import y`: y when y is a module)."""
    if module != "launcher" and not module.startswith("launcher."):
        return None
    if name and is_module(f"{module}.{name}"):
        return f"{module}.{name}"
    return module


def kit_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def arrows() -> list[tuple[str, str, str]]:
    """Every import of the kit by the kit: (importing module, imported module, file:line)."""
    found = []
    for path in kit_modules():
        here = module_name(path)
        for line, module, name in imports(path):
            target = kit_target(module, name)
            if target and target != here:
                found.append((here, target, f"{path.relative_to(ROOT)}:{line}"))
    return found


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_is_seen(tmp_path):
    """The walk sees the imports inside functions and under `if TYPE_CHECKING:`, relative ones
    resolved, as arrows like any other."""
    module = tmp_path / "launcher" / "plan" / "kv.py"
    module.parent.mkdir(parents=True)
    module.write_text("from typing import TYPE_CHECKING\n"
                      "from .. import errors\n"
                      "if TYPE_CHECKING:\n"
                      "    from ..check.rows import Row\n"
                      "def f():\n"
                      "    from launcher.cli import commands\n"
                      "    import launcher.sandbox.cluster\n")
    assert imports(module, tmp_path) == [(1, "typing", "TYPE_CHECKING"), (2, "launcher", "errors"),
                                         (4, "launcher.check.rows", "Row"), (6, "launcher.cli", "commands"),
                                         (7, "launcher.sandbox.cluster", None)]


def test_the_floor_plan_is_the_tree():
    """Every folder of launcher/ is declared in LAYERS (a declared one may be missing only if it
    is new), and the package's top-level modules are the declared ones."""
    folders = {f"launcher.{p.name}" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert {"launcher.facts", "launcher.plan", "launcher.cli", "launcher.sandbox"} <= folders  # the walk saw them
    undeclared = sorted(folders - set(LAYER))
    assert not undeclared, f"folders not in tests/test_layers.py's LAYERS: {', '.join(undeclared)}"
    missing = sorted(set(LAYER) - folders - {"launcher"})
    assert not missing, f"declared folders that are gone: {', '.join(missing)}"
    extra = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in ROOT_MODULES)
    assert not extra, (f"top-level modules not in layer 0's ROOT_MODULES: {', '.join(extra)} "
                       "(put each in the folder of its layer)")


def test_folders_import_only_lower_layers():
    """A folder imports only folders of lower layers: nothing upward, nothing across one layer
    (apply/, bench/ and init/ never import one another). The tree reads bottom-up."""
    found = arrows()
    assert any(folder_of(a) == "launcher.plan" and folder_of(b) == "launcher.inputs" for a, b, _ in found)
    problems = []
    for here, target, where in found:
        a, b = folder_of(here), folder_of(target)
        if a == b or a not in LAYER or b not in LAYER:
            continue  # an undeclared folder is test_the_floor_plan_is_the_tree's to report
        if LAYER[b] > LAYER[a]:
            problems.append(f"  {where}: {here} imports {target}: layer {LAYER[b]} ({b}) above layer {LAYER[a]} ({a})")
        elif LAYER[b] == LAYER[a]:
            problems.append(f"  {where}: {here} imports {target}: {b} is of its own layer {LAYER[a]} ({a})")
    assert not problems, f"{len(problems)} imports against the floor plan:\n" + "\n".join(problems)


def test_modules_import_one_way():
    """No two modules import each other, directly or round a longer loop (lazy and TYPE_CHECKING
    imports included): each module has one place in the order, within a folder too."""
    graph: dict[str, dict[str, list[str]]] = {}
    for here, target, where in arrows():
        graph.setdefault(here, {}).setdefault(target, []).append(where)
    problems = []
    for component in cycles(graph):
        lines = [f"  {a} -> {b}: {', '.join(graph[a][b])}"
                 for a in component for b in component if b in graph.get(a, {})]
        problems.append(f"import cycle between {', '.join(component)}:\n" + "\n".join(lines))
    assert not problems, "\n".join(problems)


def test_nothing_outside_the_sandbox_imports_it():
    """The sandbox is the kit's test double: the kit works without it (the CLI names its command
    group by an import string, not an import)."""
    problems = [f"  {where}: {here} imports {target}" for here, target, where in arrows()
                if folder_of(target) == SANDBOX and folder_of(here) != SANDBOX]
    assert not problems, "launcher/sandbox/ imported from outside it:\n" + "\n".join(problems)


def test_no_module_outside_the_sandbox_is_over_650_lines():
    """A module longer than MAX_LINES is a grab-bag: split it by subject."""
    problems = []
    for path in kit_modules():
        if folder_of(module_name(path)) == SANDBOX:
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"  {path.relative_to(ROOT)}:{MAX_LINES + 1}: {lines} lines")
    assert not problems, f"modules over {MAX_LINES} lines outside launcher/sandbox/:\n" + "\n".join(problems)


def test_what_runs_on_a_rank_is_standalone():
    """onrank/'s scripts and the sandbox's stand-ins are sent alone to hosts that have python3 and
    nothing else: no import from `launcher`, no relative import, only the standard library."""
    checked = []
    for folder, extra in STANDALONE.items():
        where = ROOT.joinpath(*folder.split("."))
        paths = sorted(where.glob("*.py")) if where.is_dir() else [where.with_suffix(".py")]
        siblings = {p.stem for p in paths} | SIDE_BY_SIDE[folder] if folder in SIDE_BY_SIDE else set()
        for path in paths:
            allowed = STDLIB | extra.get(path.stem, set()) | siblings
            for line, module, _name in imports(path):
                top = module.split(".")[0]
                assert top != "launcher", f"{path.relative_to(ROOT)}:{line} imports the kit ({module})"
                assert top in allowed, f"{path.relative_to(ROOT)}:{line} imports {module}: not the standard library"
            checked.append(path.stem)
    assert {"probe", "pinger", "relay_pull", "relay_gate", "nccl_allreduce", "standin_vllm",
            "vllm_options"} <= set(checked)


def test_every_folder_says_what_lives_there():
    """Each folder's __init__ has a docstring: what lives there and what it may import."""
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} has no docstring"


# launcher/plan/ derives only: what it needs from files, Docker or the ranks is read by its callers
# (launcher/gather/) and passed in. Its own templates (engine, systemd) are code.
IMPURE_IMPORTS = ("docker", "paramiko", "subprocess", "socket", "launcher.transport", "launcher.images",
                  "launcher.check", "launcher.apply", "launcher.cli", "launcher.sandbox")
IMPURE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes",  # files
                "read_shape", "split_weights", "shard_paths", "read_header",  # the checkpoint
                "local_base_id", "chain_for", "patches_dir"}  # local Docker, the patch files


def _called(call: ast.Call) -> str | None:
    """`f` of `f(...)` or `x.f(...)`; `apikey.resolve` whole (it reads the key file)."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        owner = f.value.id if isinstance(f.value, ast.Name) else ""
        return f"{owner}.{f.attr}" if (owner, f.attr) == ("apikey", "resolve") else f.attr
    return None


def test_the_plan_reads_nothing_itself():
    """No Docker, SSH or checkpoint reads inside launcher/plan/: the caller gathers them."""
    problems = []
    for path in sorted((PACKAGE / "plan").rglob("*.py")):
        where = path.relative_to(ROOT)
        for line, module, name in imports(path):
            target = kit_target(module, name) or module
            if any(target == m or target.startswith(m + ".") for m in IMPURE_IMPORTS):
                problems.append(f"{where}:{line} imports {target}")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = _called(node) if isinstance(node, ast.Call) else None
            if called in IMPURE_CALLS or called == "apikey.resolve":
                problems.append(f"{where}:{node.lineno} calls {called}()")
    assert not problems, "launcher/plan/ must stay pure:\n" + "\n".join(problems)
