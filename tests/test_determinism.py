"""Output bytes do not depend on the machine: a run allowed one core (no args helper, ranks one
at a time) writes the same file as a run allowed two (helper beside the reader)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from converter.generator import GeneratorConfig, write_pp_run, write_trace

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="needs two usable cores and sched_setaffinity")


def run_on_cores(cores: int, args: list[str], cwd: Path) -> None:
    """`cgtrace args` in a process allowed only the first `cores` of this one's cores."""
    allowed = sorted(os.sched_getaffinity(0))[:cores]
    code = f"import os, sys; os.sched_setaffinity(0, {allowed}); from converter.cli import main; sys.exit(main())"
    subprocess.run([sys.executable, "-c", code, *args, "-q", "--overwrite"], cwd=cwd, check=True,
                   env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("determinism")
    write_trace(GeneratorConfig(seed=9, steps=2, graphs_per_step=6, kernels_per_replay=12), folder / "trace.json")
    write_pp_run(folder / "ranks", 2, events_per_rank=4_000)
    return folder


@pytest.mark.parametrize("command", [["convert", "trace.json"], ["compact", "trace.json"],
                                     ["merge", "ranks", "--jobs", "2"], ["merge", "ranks"]])
def test_one_core_and_two_write_the_same_bytes(inputs, command):
    written = []
    for cores in (1, 2):
        output = inputs / f"{command[0]}_{cores}.perfetto-trace"
        run_on_cores(cores, [*command, "-o", str(output)], inputs)
        written.append(output.read_bytes())
    assert written[0] == written[1]
