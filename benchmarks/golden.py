"""Digests of every output the command line writes for the shared traces, to prove a refactor byte-identical.

Run it before and after a change and compare the two files:

    .venv/bin/python benchmarks/golden.py > before.txt
    ... change ...
    .venv/bin/python benchmarks/golden.py > after.txt && diff before.txt after.txt

Each line is `<sha256> <what>`: the written trace (convert, compact, a step cut, Chrome JSON, a
merge of every multi-rank set in ../shared/traces and of a generated pipeline) and the JSON
summary and report with their timings removed.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
# Summary keys that measure this run rather than describe the output.
_VOLATILE = {"seconds", "wall_s", "elapsed_s", "read_s", "write_s"}


def _cgtrace(*args: str) -> str | None:
    """The command's stdout, or None where it refused (exit 2: also an outcome to compare)."""
    quiet = () if args[0] == "report" else ("-q",)
    done = subprocess.run([sys.executable, "-m", "converter.cli", *args, *quiet],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode == 2:
        return None
    if done.returncode != 0:
        raise SystemExit(f"cgtrace {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _stable(text: str, scratch: Path) -> str:
    """The JSON text without the keys that time this run, and with the scratch folder's name left out."""
    text = text.replace(str(scratch), "OUT")
    def scrub(value: object) -> object:
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items() if k not in _VOLATILE}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return value
    return json.dumps(scrub(json.loads(text)), sort_keys=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    if not TRACES.is_dir():
        raise SystemExit(f"{TRACES} is absent: the shared traces are what this compares")
    out = Path(tempfile.mkdtemp(prefix="cgtrace-golden-"))
    lines: list[str] = []

    def record(what: str, path: Path | None = None, text: str | None = None) -> None:
        data = path.read_bytes() if path is not None else _stable(text or "null", out).encode()
        lines.append(f"{_digest(data)} {what}")
        print(lines[-1], flush=True)

    for trace in sorted(TRACES.glob("*.json.gz")):
        stem = trace.name.removesuffix(".json.gz")
        for job, extra in (("convert", ()), ("compact", ()), ("compact", ("--window", "0:20")),
                           ("compact", ("--format", "json"))):
            suffix = ".json" if "json" in extra else ".perfetto-trace"
            target = out / f"{stem}.{job}{'.'.join(extra)}{suffix}"
            summary = _cgtrace(job, str(trace), "-o", str(target), *extra)
            if summary is None:
                record(f"{job} {' '.join(extra)} {stem}: refused", text="null")
                continue
            record(f"{job} {' '.join(extra)} {stem}", target)
            record(f"{job} {' '.join(extra)} {stem} summary", text=summary)
        compacted = out / f"{stem}.compact.perfetto-trace"
        record(f"report {stem}", text=_cgtrace("report", str(compacted), "--format", "json"))
        record(f"report raw {stem}", text=_cgtrace("report", str(trace), "--format", "json"))

    sets = [TRACES / "dlrm_8ranks"] + sorted(p for p in (TRACES / "torch_pp_cpu").iterdir() if p.is_dir())
    generated = out / "generated"
    subprocess.run([sys.executable, "-c", "import sys; from converter.generator import write_pp_run; "
                    "write_pp_run(sys.argv[1], pp_size=4, microbatches=4, steps=2, seed=7, gzip=True)",
                    str(generated)], check=True, cwd=ROOT)
    for folder in sets + [generated]:
        extra = ("--pp-group", "0") if folder.name == "dp2_pp2" else ()
        target = out / f"{folder.name}.merged.perfetto-trace"
        summary = _cgtrace("merge", str(folder), "-o", str(target), *extra)
        record(f"merge {folder.name}", target)
        record(f"merge {folder.name} summary", text=summary)
        record(f"report merge {folder.name}", text=_cgtrace("report", str(target), "--format", "json"))


if __name__ == "__main__":
    main()
