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
_LEAVES = {"errors", "progress", "signals", "terminal", "tuning"}
ALLOWED = {
    "errors": set(),
    "progress": set(),
    "signals": set(),
    "terminal": set(),
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
    "tp": {"kineto", "fileio", "model"},  # the cgtrace_* SQL tables: which rows are derived, steps, roles
    "analysis": {"kineto", "lane_rules", "model", "fileio", "tp"},  # no engine internals
    "generator": set(),
    "jobs": {"heap", "kineto", "lane_rules", "model", "fileio", "inputs", "engine", "outputs", "tp", "analysis",
             "generator"},  # heap: a finished job's model kept to the end of a command
    # The Python API: the commands as functions, over the jobs and the analysis.
    "api": {"lane_rules", "fileio", "engine", "jobs", "analysis", "tp"},  # fileio: the handler writes atomically
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


# What converting or compacting one trace must not load (each costs start-up, which is most of
# a small trace's time): other commands' machinery (a merge with its clock estimate and
# cross-rank arrows, the analyses, trace_processor, the executors, the Python API, the
# generator), the args helper (a small input), the JSON writer (a Perfetto output), `regex` (the
# built-in lane rules run on `re`), `dataclasses` (which compiles each class from source as it
# loads: the model's records are msgspec Structs), `orjson` (the summary is printed by msgspec),
# and what only those bring in.
NOT_FOR_ONE_TRACE = ("converter.api", "converter.analysis", "converter.tp", "converter.generator", "converter.jobs.merge",
                     "converter.jobs.batch", "converter.jobs.executors", "converter.jobs.workers",
                     "converter.engine.clock", "converter.engine.pp_pairs", "converter.engine.transfers",
                     "converter.engine.work_graph", "converter.engine.critical_path",
                     "converter.outputs.json_writer", "converter.outputs.args_accelerator", "regex",
                     "multiprocessing", "wasmtime", "perfetto", "pandas", "dask", "distributed", "http", "zipfile",
                     "dataclasses", "orjson")
# The command in a fresh interpreter, then what it loaded, on stderr's last line.
_LOADED_BY = ("import json, sys; from converter.cli import main; status = main(sys.argv[1:]); "
              "print(json.dumps(sorted(sys.modules)), file=sys.stderr); sys.exit(status)")


def _loaded_by(*argv: str) -> set[str]:
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _LOADED_BY, *argv], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stderr.splitlines()[-1]))


def _under(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == name or m.startswith(name + ".") for name in names))


@pytest.mark.parametrize("command", ["convert", "compact"])
def test_one_trace_loads_only_what_its_command_runs(tmp_path, command):
    from converter.generator import GeneratorConfig, write_trace

    source = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "t.json")
    output = tmp_path / "t.perfetto-trace"
    loaded = _loaded_by(command, str(source), "-o", str(output), "-q")
    assert output.stat().st_size > 0
    assert {"converter.inputs.kineto_reader", "converter.outputs.perfetto_writer", "numpy"} <= loaded
    assert _under(loaded, NOT_FOR_ONE_TRACE) == []


def test_a_rules_file_runs_on_regex(tmp_path):
    """A user's regexes run on `regex`, which stops one that backtracks without end."""
    from converter.generator import GeneratorConfig, write_trace
    from converter.lane_rules import DEFAULT_LANES_TOML

    source = write_trace(GeneratorConfig(steps=1, graphs_per_step=2, kernels_per_replay=8), tmp_path / "t.json")
    (tmp_path / "lanes.toml").write_text(DEFAULT_LANES_TOML)
    loaded = _loaded_by("compact", str(source), "-o", str(tmp_path / "t.perfetto-trace"), "-q",
                        "--lanes", str(tmp_path / "lanes.toml"))
    assert "regex" in loaded
