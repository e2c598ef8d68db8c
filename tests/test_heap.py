"""Which models the command line keeps to its end instead of freeing (heap.py): only that of
the job that ends the command, never a batch's ranks, and nothing in a running process."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterator
from pathlib import Path

import pytest

from converter import heap
from converter.cli import main
from converter.generator import write_pp_run
from converter.jobs.runner import JobOptions, run_job


@pytest.fixture
def keeping() -> Iterator[list[object]]:
    """As the `cgtrace` console script runs: models that end the command are kept."""
    with heap.models_kept_to_the_end() as kept:
        yield kept
    assert not heap.keeping()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ranks")
    write_pp_run(directory, pp_size=2, microbatches=2, steps=1, seed=3)
    return directory


def test_only_the_job_that_ends_the_command_keeps_its_model(keeping, ranks, tmp_path, capsys):
    first = sorted(ranks.glob("*.json*"))[0]
    assert main(["compact", str(first), "-o", str(tmp_path / "one.perfetto-trace"), "-q"]) == 0
    assert len(keeping) == 1 and keeping[0].slices
    keeping.clear()
    # As a batch's workers (rank after rank), report's conversion and the demo run jobs.
    for rank, path in enumerate(sorted(ranks.glob("*.json*"))):
        run_job(path, tmp_path / f"{rank}.perfetto-trace", JobOptions(compact=True))
    assert keeping == []
    capsys.readouterr()


def test_a_running_process_keeps_nothing(ranks, tmp_path, capsys):
    first = sorted(ranks.glob("*.json*"))[0]
    assert main(["convert", str(first), "-o", str(tmp_path / "one.perfetto-trace"), "-q"]) == 0
    assert not heap.keeping()  # so keep_to_the_end kept nothing of it
    capsys.readouterr()


def test_the_command_ends_with_its_output_and_summary_written(ranks, tmp_path):
    """end_process leaves by os._exit: what the command printed and wrote is complete."""
    first = sorted(ranks.glob("*.json*"))[0]
    output = tmp_path / "one.perfetto-trace"
    done = subprocess.run([sys.executable, "-m", "converter.cli", "compact", str(first), "-o", str(output)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.rstrip().endswith("}") and '"output_bytes"' in done.stdout
    assert output.stat().st_size > 0
