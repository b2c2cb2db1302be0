"""The tinyloop package's modules import each other without cycles.

Each module under python/tinyloop is parsed with `ast` (never imported, so the engine is not
needed); every import counts, relative or absolute, at module level or inside a function,
since a function-level import that closes a cycle still ties the two modules together."""
import ast
import os

PACKAGE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python", "tinyloop"))
PACKAGE = "tinyloop"


def module_files(package_dir=PACKAGE_DIR, package=PACKAGE):
    """{dotted module name: path} of every .py file of the package (packages by __init__)."""
    out = {}
    for root, _, files in os.walk(package_dir):
        rel = os.path.relpath(root, package_dir)
        prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
        for f in files:
            if f.endswith(".py"):
                out[prefix if f == "__init__.py" else f"{prefix}.{f[:-3]}"] = os.path.join(root, f)
    return out


def _resolve(name, modules):
    """The longest prefix of dotted `name` that is one of `modules` (None if none is)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def imported_modules(module, path, modules):
    """Package modules that `module` (at `path`) imports anywhere in its body."""
    is_package = os.path.basename(path) == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from ..a import b: relative to this module's package
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                if not base:
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the package")
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            # `from pkg import name` names a submodule (pkg.name) or else an attribute of pkg.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.add(target)
    return found


def import_graph(modules):
    return {m: imported_modules(m, p, modules) for m, p in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules [a, b, ..., a], or None (iterative DFS)."""
    state = {}  # module -> "open" (on the current path) or "done"
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [], [(start, iter(sorted(graph[start])))]
        state[start] = "open"
        path.append(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = "done"
            elif state.get(child) == "open":
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = "open"
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_the_finder_sees_a_cycle_through_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    modules = module_files(str(pkg), "pkg")
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(modules)) is None


def test_the_package_has_modules_to_check():
    modules = module_files()
    assert {"tinyloop", "tinyloop.cli", "tinyloop.chat", "tinyloop.server"} <= set(modules)


def test_no_import_cycles_in_the_tinyloop_package():
    cycle = find_cycle(import_graph(module_files()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
