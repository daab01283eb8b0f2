"""The package's layers, read from its source: launcher/'s folders import one another one way only
(a folder never imports a folder that imports it, directly or round a longer loop), and what runs
on a rank (onrank/, the sandbox's stand-ins) imports nothing of the kit, only the standard library.

Every import counts, the ones inside functions too: a lazy import is still an arrow."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "launcher"

# Run on a rank (or in the sandbox's image) by a bare python3: what its standard library has.
# A rank promises Python 3.8+, so nothing the standard library gained after 3.8.
STDLIB = set(sys.stdlib_module_names) - {"graphlib", "zoneinfo", "tomllib"}
STANDALONE = {"launcher.onrank": {"nccl_allreduce": {"torch"}},  # runs in the serving image
              "launcher.sandbox.standins": {},
              "launcher.inputs.vllm_options": {}}  # copied beside the stand-ins, as is
# The stand-ins are installed side by side in the image's dist-packages and import one another,
# and the kit's vllm_options copied beside them; onrank's scripts are each sent alone.
SIDE_BY_SIDE = {"launcher.sandbox.standins": {"vllm_options"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(name: str) -> str:
    """The folder (package) a module lives in; a package is its own folder."""
    path = ROOT.joinpath(*name.split("."))
    return name if path.is_dir() else name.rsplit(".", 1)[0]


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """Every import in the file: (line, absolute module, name imported from it or None)."""
    name = module_name(path)
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


def folder_graph() -> dict[str, dict[str, list[str]]]:
    """folder -> folder it imports -> the import sites (file:line), self-imports left out."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        here = folder_of(module_name(path))
        graph.setdefault(here, {})
        for line, module, name in imports(path):
            target = kit_target(module, name)
            if target and folder_of(target) != here:
                where = f"{path.relative_to(ROOT)}:{line}"
                graph[here].setdefault(folder_of(target), []).append(where)
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one folder (Tarjan)."""
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


def test_folders_import_one_way():
    """A folder never imports one that imports it: the tree reads bottom-up (facts, inputs,
    transport, images, plan, check, apply, cli), each layer using only the ones beneath."""
    graph = folder_graph()
    assert {"launcher.facts", "launcher.plan", "launcher.cli"} <= set(graph)  # the walk saw them
    assert "launcher.inputs" in graph["launcher.plan"]  # and their imports
    problems = []
    for component in cycles(graph):
        arrows = [f"  {a} -> {b}: {', '.join(graph[a][b])}"
                  for a in component for b in component if b in graph[a]]
        problems.append(f"import cycle between {', '.join(component)}:\n" + "\n".join(arrows))
    assert not problems, "\n".join(problems)


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
# (launcher/check/plan_inputs.py) and passed in. Its own templates (engine, systemd) are code.
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
