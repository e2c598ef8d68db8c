"""Every command the README shows runs as written.

The README's fenced `sh` blocks are read in order. The set-up lines (a virtual environment,
pip) are not run here: they must be the steps `.ci/run` runs, so the test command a newcomer
types is the one CI runs. Every `cgtrace` line runs through bash, exactly as written, in one
temporary folder holding the small generated traces the README names; each must exit 0.
`cgtrace view` serves until stopped, so for it only the options shown are checked against
`cgtrace view --help` and the parser. The README's Python block runs there too. Relative
links in the README and docs/ must point at files (and headings) that exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from converter.generator import GeneratorConfig, write_pp_run, write_trace

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
# A few CUDA-graph replays per step: every command sees lanes, annotations, flows and steps.
SMALL = dict(graphs_per_step=4, kernels_per_replay=8)
TIMEOUT_S = 120


def fenced_blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, flags=re.S | re.M)


def readme_lines() -> list[str]:
    """The README's shell lines, in order, without blank lines."""
    return [line for block in fenced_blocks(README.read_text(), "sh") for line in block.splitlines() if line.strip()]


def steps(line: str) -> list[list[str]]:
    """A `a && b && c` line as its commands, each split as the shell would, `--quiet` left out
    (CI installs quietly; what it installs is the same)."""
    return [[word for word in shlex.split(part) if word != "--quiet"] for part in line.split("&&")]


def ci_steps() -> list[list[str]]:
    """The commands `.ci/run` runs in the repository, in order (its comments, shell options and
    the optional browser install left out)."""
    found = []
    for line in CI_RUN.read_text().splitlines():
        line = line.strip()
        if re.match(r"(python3|pip|mypy|pytest)\b|\. ", line):
            found.extend(steps(line))
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The files the README's commands name: a CUDA-graph trace (gzipped and plain), a query
    file, a two-rank pipeline as two named files, and a directory of rank traces."""
    work = tmp_path_factory.mktemp("readme")
    config = GeneratorConfig(seed=1, steps=3, **SMALL)
    write_trace(config, work / "trace.json.gz")
    write_trace(config, work / "trace.json")
    (work / "busy.sql").write_text("select rank, count(*) n, sum(dur) busy from cgtrace_slice group by 1\n")
    pair = write_pp_run(work / "pair", pp_size=2, seed=3, gzip=True, **SMALL)
    for rank in pair:
        rank.rename(work / rank.name.replace("_trace", ""))  # rank0_trace.json.gz -> rank0.json.gz
    (work / "pair").rmdir()
    write_pp_run(work / "traces", pp_size=2, seed=5, gzip=True, **SMALL)
    return work


def run_in(work: Path, line: str) -> subprocess.CompletedProcess:
    """`line` through bash in `work`, with this environment's `cgtrace` first on PATH."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def test_the_readme_shows_commands():
    lines = readme_lines()
    assert any(line.startswith("cgtrace convert ") for line in lines)
    assert sum("python3 -m venv" in line for line in lines) == 2   # the demo and the test command


def test_every_shell_line_is_a_set_up_line_or_a_cgtrace_command():
    """So that the test below runs or checks every one of them."""
    unknown = [line for line in readme_lines() if not line.startswith(("cgtrace ", "python3 -m venv "))]
    assert not unknown, f"README shell lines this test does not know how to run: {unknown}"


def test_the_test_command_is_the_one_ci_runs():
    [line] = [line for line in readme_lines() if line.startswith("python3 -m venv ") and "pytest" in line]
    ci = [step for step in ci_steps() if step != ["pip", "install", "--upgrade", "pip"]]
    assert steps(line) == ci, f".ci/run runs {ci}, the README says {steps(line)}"


def test_the_demo_set_up_is_the_ci_set_up_with_fewer_extras():
    [line] = [line for line in readme_lines() if line.startswith("python3 -m venv ") and "pytest" not in line]
    *set_up, run = steps(line)
    assert run == ["cgtrace", "demo"]
    ci = ci_steps()
    venv, install = set_up[:-1], set_up[-1]
    assert all(step in ci for step in venv)
    [ci_install] = [step for step in ci if step[:3] == ["pip", "install", "-e"]]
    assert install[:3] == ["pip", "install", "-e"] and install[3].split("[")[0] == ci_install[3].split("[")[0] == "."
    extras = set(re.findall(r"\[(.*)\]", install[3])[0].split(",")) if "[" in install[3] else set()
    assert extras <= set(re.findall(r"\[(.*)\]", ci_install[3])[0].split(","))


def test_every_readme_command_runs_as_written(workdir):
    """In README order, each exiting 0: the demo the first set-up line ends in, then every
    `cgtrace` line (`cgtrace view` only checked, see check_view_options)."""
    set_up = [line for line in readme_lines() if line.startswith("python3 -m venv ")]
    ends = [part.strip() for line in set_up for part in line.split("&&")[-1:] if part.strip().startswith("cgtrace ")]
    commands = [line for line in readme_lines() if line.startswith("cgtrace ")]
    assert ends == ["cgtrace demo"] and commands
    failed = []
    for line in [*ends, *commands]:
        words = shlex.split(line, comments=True)
        if words[1] == "view":
            check_view_options(workdir, words)
            continue
        done = run_in(workdir, line)
        if done.returncode != 0:
            failed.append(f"{line}\n  exit {done.returncode}: {done.stderr.strip()[-500:]}")
    assert not failed, "README commands that failed:\n" + "\n".join(failed)
    assert (workdir / "cgtrace-demo" / "pp_traces_merged.perfetto-trace").is_file()


def check_view_options(workdir: Path, words: list[str]) -> None:
    """`cgtrace view` serves until stopped: each option shown must be in its --help, and the
    whole line must parse."""
    from converter.cli import _parser

    shown = run_in(workdir, "cgtrace view --help")
    assert shown.returncode == 0, shown.stderr
    for word in words[2:]:
        if word.startswith("-"):
            assert re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", shown.stdout), f"view --help lacks {word}"
    assert _parser().parse_args(words[1:]).trace is not None


def test_the_readme_python_runs(workdir):
    """The Python example (the API, then open_trace), where the README's commands ran."""
    pytest.importorskip("pandas")
    [block] = fenced_blocks(README.read_text(), "python")
    if not (workdir / "trace.perfetto-trace").exists():
        assert run_in(workdir, "cgtrace convert trace.json.gz -q").returncode == 0
    done = subprocess.run([sys.executable, "-c", block + "\nassert len(df) > 0\n"], cwd=workdir,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name}: links to what does not exist: {broken}"


def test_no_machine_specific_paths_in_docs():
    home = str(Path.home())
    for page in [README, *(ROOT / "docs").glob("*.md")]:
        text = page.read_text()
        assert str(ROOT) not in text and (home == "/" or f"{home}/" not in text), page.name
