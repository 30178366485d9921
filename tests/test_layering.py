"""Import layering: dependencies point one way, and packages hold no import cycles.

    cli -> commands -> training -> inference / explanations -> checkpoints, data -> models -> ops

(`errors`, `paths`, `step_folders` and the CPU backend `cpu` are below everything; `images`
lists and opens image files, `preprocess` turns them into model inputs; `device_mesh` is the
one mesh helper of training and inference; `recipes` loads training configurations.) Every
module under `vit/` is parsed, not imported, and every import of `vit.*` counts, whether at
module level or inside a function: a local import is a dependency all the same. Datasets are
chosen by name in one table, `vit.data.sources.BUILT_IN`.
"""

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
VIT = ROOT / "vit"

_BASE = {"errors", "paths", "step_folders", "cpu"}
_MODEL = _BASE | {"ops", "models"}
_IMAGES = _BASE | {"images", "preprocess"}
_CHECKPOINTS = _MODEL | _IMAGES | {"checkpoints"}
_APPS = _CHECKPOINTS | {"data", "device_mesh"}  # what inference and explanations stand on
_ABOVE_APPS = _APPS | {"inference", "explanations", "recipes", "training"}
# The part of vit (`vit.<unit>...`) each part may import: itself and the layers below it.
ALLOWED = {
    "errors": {"errors"},
    "paths": {"paths"},
    "step_folders": {"step_folders"},
    "cpu": {"cpu"},
    "ops": _BASE | {"ops"},
    "models": _MODEL,
    "images": _BASE | {"images"},
    "preprocess": _IMAGES,
    "device_mesh": _BASE | {"device_mesh"},
    "data": _IMAGES | {"data"},
    "checkpoints": _CHECKPOINTS,
    "recipes": _MODEL | {"recipes"},
    "inference": _APPS | {"inference"},
    "explanations": _APPS | {"explanations"},
    "training": _ABOVE_APPS,
    "commands": _ABOVE_APPS | {"commands"},
    "cli": _ABOVE_APPS | {"commands", "cli"},
    # vit/__init__.py names its lazy attributes by string; it imports the modules that define
    # them only for type checkers (`if TYPE_CHECKING:`).
    "vit": _ABOVE_APPS,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(VIT.rglob("*.py"))}
PACKAGES = {module_name(p) for p in VIT.rglob("__init__.py")}


def unit(module: str) -> str:
    """`vit.checkpoints.npz` -> `checkpoints`; `vit` itself -> `vit`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vit"


def imports(module: str) -> list[tuple[int, str, str]]:
    """(line, statement, imported module) for every import of vit in `module`, module-level and
    local alike. `from pkg import name` imports the module `pkg.name` when that is a submodule,
    else `pkg` itself (`name` is taken from its `__init__`)."""
    path = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "vit":
                    found.append((node.lineno, f"import {alias.name}", alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module if module in PACKAGES else module.rpartition(".")[0]
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "vit":
                continue
            for alias in node.names:
                text = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, text, sub if sub in MODULES else base))
    return found


def where(module: str, line: int, text: str) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}: {text}"


def test_every_part_of_vit_has_a_rule():
    assert {unit(m) for m in MODULES} <= set(ALLOWED), (
        "a new part of vit: give it a place in ALLOWED")


def test_dependencies_point_down_the_layers():
    wrong = []
    for module in MODULES:
        for line, text, target in imports(module):
            if unit(target) not in ALLOWED[unit(module)]:
                wrong.append(f"{where(module, line, text)}  ({unit(module)} -> {unit(target)})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_only_the_cli_reaches_the_commands():
    wrong = [where(module, line, text)
             for module in MODULES if unit(module) not in ("cli", "commands")
             for line, text, target in imports(module) if unit(target) == "commands"]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_its_own_packages_init():
    # Inside a package, names come from the module that defines them (`vit.checkpoints.tree`),
    # never through the package's `__init__`, which only re-exports them for users.
    wrong = []
    for module in MODULES:
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        if module in PACKAGES:  # a package's __init__ may import its own submodules
            ancestors.discard(module)
        for line, text, target in imports(module):
            if target in ancestors:
                wrong.append(where(module, line, text))
    assert not wrong, "imports through the package's own __init__:\n" + "\n".join(wrong)


def _names_compared(tree) -> list[tuple[int, str]]:
    """(line, string) for each string constant an `==`, `!=` or `in` compares against."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [(node.lineno, c.value) for c in items
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return found


def test_datasets_are_chosen_by_name_only_in_the_registry():
    # `vit.data.sources.BUILT_IN` is the one table of datasets by name: a prompt dataset's module
    # (one built on `vit.data.prompted`) is imported there and nowhere else in vit, and no other
    # module compares a value with a dataset's name.
    from vit.data.sources import BUILT_IN

    registry = "vit.data.sources"
    prompted = {m for m in MODULES if any(t == "vit.data.prompted" for _, _, t in imports(m))}
    assert {"vit.data.promptshapes", "vit.data.fashion_scenes"} <= prompted
    wrong = [where(module, line, text) for module in MODULES if module != registry
             for line, text, target in imports(module) if target in prompted - {module}]
    for module, path in MODULES.items():
        if module != registry:
            wrong += [where(module, line, repr(name)) for line, name in
                      _names_compared(ast.parse(path.read_text(), str(path))) if name in BUILT_IN]
    assert not wrong, "datasets named outside vit.data.sources.BUILT_IN:\n" + "\n".join(wrong)


def test_no_import_cycles():
    # Local imports count too: a cycle held together by function-level imports is still one.
    graph = {m: {target for _, _, target in imports(m)} - {m} for m in MODULES}
    cycles, done = [], set()

    def visit(module, path):
        if module in path:
            cycles.append(" -> ".join(path[path.index(module):] + [module]))
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _imports_cleanly(module: str) -> tuple[str, int, str]:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return module, proc.returncode, proc.stderr[-2000:]


@pytest.mark.slow
def test_checkpoint_modules_import_first_in_a_fresh_interpreter():
    # Each submodule imported first, alone: a cycle shows up as an ImportError in one of them.
    first = ["vit.checkpoints"] + sorted(m for m in MODULES if m.startswith("vit.checkpoints."))
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_imports_cleanly, first))
    failed = [f"import {m} failed:\n{err}" for m, rc, err in results if rc]
    assert not failed, "\n".join(failed)
