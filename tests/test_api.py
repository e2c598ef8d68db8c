"""The Python API: its docstring examples run (they are the API's documentation), it raises
the command line's errors, its signatures are typed without Any, and `import converter`
stays cheap."""

from __future__ import annotations

import doctest
import subprocess
import sys
import shutil
import typing

import pytest

import converter
from converter import api
from converter.errors import CgtraceError


def test_the_docstring_examples_run():
    """The module docstring's set-up first, then every function's examples with its names."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    found = [test for test in doctest.DocTestFinder().find(api) if test.examples]
    [set_up, *examples] = sorted(found, key=lambda test: test.name != api.__name__)
    runner.run(set_up, clear_globs=False)
    try:
        for test in examples:
            test.globs.update(set_up.globs)
            runner.run(test)
    finally:
        shutil.rmtree(set_up.globs["folder"], ignore_errors=True)  # the set-up's folder, with what the examples wrote
    assert tuple(runner.summarize(verbose=False)) == (0, runner.tries) and len(examples) == 7


def _mentions_any(hint: object) -> bool:
    return hint is typing.Any or any(_mentions_any(arg) for arg in typing.get_args(hint))


@pytest.mark.parametrize("name", sorted(set(converter.__all__) - {"CgtraceError", "__version__"}))
def test_public_signatures_are_typed_without_any(name):
    function = getattr(converter, name)
    from perfetto.trace_processor.api import TraceProcessor

    hints = typing.get_type_hints(function, vars(api) | {"TraceProcessor": TraceProcessor})
    assert "return" in hints and not [k for k, hint in hints.items() if _mentions_any(hint)], hints


def test_errors_are_the_command_lines(tmp_path):
    with pytest.raises(CgtraceError, match=r"no such file|cannot|not"):
        converter.convert(tmp_path / "missing.json")
    with pytest.raises(CgtraceError, match="is a directory; pass one trace file"):
        converter.compact(tmp_path)
    with pytest.raises(CgtraceError, match="--steps"):
        converter.compact(tmp_path / "x.json", steps="5-2")
    with pytest.raises(CgtraceError, match="--ranks"):
        converter.merge(tmp_path, ranks="a-b")
    with pytest.raises(CgtraceError, match="lanes"):
        converter.trace_handler(tmp_path, lanes=tmp_path / "no-such-rules.toml")


def test_import_converter_is_cheap():
    """Neither trace_processor nor the reader loads until a function is called."""
    probe = ("import sys, converter; print(sorted(m for m in ('wasmtime', 'perfetto', 'numpy', 'converter.api') "
             "if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert found.strip() == "[]"
