"""The folder layout is the architecture: imports follow reader -> model -> engine -> writer.

Each top-level part of `converter` may import only the parts listed for it here (and itself);
the module map in docs/design.md names every module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "converter"
DESIGN = PACKAGE.parent / "docs" / "design.md"

# Leaf utilities every part may use.
_LEAVES = {"errors", "progress", "signals", "tuning"}
ALLOWED = {
    "errors": set(),
    "progress": set(),
    "signals": set(),
    "tuning": set(),
    "heap": set(),
    "kineto": set(),
    "__init__": {"api"},                      # the Python API, imported on first use
    "model": set(),                          # the model imports only itself (and errors)
    "lane_rules": {"kineto", "model", "fileio"},  # fileio: the rules file read with a size limit
    "fileio": {"model"},
    "inputs": {"kineto", "model", "fileio"},  # never the engine, a writer or trace_processor
    "engine": {"kineto", "lane_rules", "model"},
    "outputs": {"heap", "kineto", "model", "fileio"},  # heap: the args helper trims its heap before writing
    "tp": {"fileio"},
    "analysis": {"kineto", "lane_rules", "model", "fileio", "tp"},  # no engine internals
    "generator": set(),
    "jobs": {"heap", "kineto", "lane_rules", "model", "fileio", "inputs", "engine", "outputs", "tp", "analysis",
             "generator"},  # heap: a finished job's model kept to the end of a command
    # The Python API: the commands as functions, over the jobs and the analysis.
    "api": {"lane_rules", "engine", "jobs", "analysis", "tp"},
    "cli": {"__init__", "api", "heap", "kineto", "lane_rules", "model", "fileio", "inputs", "engine", "outputs", "tp",
            "analysis", "jobs"},
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _part(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def _imported_parts(path: Path) -> set[str]:
    """The top-level parts of `converter` that a module imports, relative imports resolved."""
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            names = [module + [alias.name] for alias in node.names] if node.module is None else [module]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        for name in names:
            if name[:1] == ["converter"] and len(name) > 1:
                part = name[1]
                is_module = (PACKAGE / part).is_dir() or (PACKAGE / f"{part}.py").is_file()
                found.add(part if is_module else "__init__")  # `from . import __version__`
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_pipeline(path):
    part = _part(path)
    assert part in ALLOWED, f"{path}: a new top-level part; add it to ALLOWED and docs/design.md"
    wrong = _imported_parts(path) - ALLOWED[part] - _LEAVES - {part}
    assert not wrong, f"{path.relative_to(PACKAGE)} ({part}) imports {sorted(wrong)}"


def test_the_check_sees_relative_and_absolute_imports(tmp_path):
    sample = PACKAGE / "inputs" / "kineto_reader.py"
    assert {"model", "errors"} <= _imported_parts(sample)
    assert "tp" in _imported_parts(PACKAGE / "tp" / "__init__.py")


def test_design_module_map_names_every_module():
    """Every module has a row in the `| module | job |` table of docs/design.md."""
    table = [line for line in DESIGN.read_text().splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([\w/]+\.py)`", line.split("|")[1])}
    missing = [str(p.relative_to(PACKAGE)) for p in _modules()
               if p.name != "__init__.py" and str(p.relative_to(PACKAGE)) not in named]
    assert not missing, f"the module map in docs/design.md does not name {missing}"


def test_the_command_line_starts_without_trace_processor():
    """Converting never needs trace_processor, whose import would slow every command's start."""
    import subprocess
    import sys

    probe = "import sys, converter.cli; print(sorted(m for m in ('wasmtime', 'perfetto') if m in sys.modules))"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert found.strip() == "[]"
