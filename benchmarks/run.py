#!/usr/bin/env python3
"""Speed and memory benchmarks of cgtrace jobs (not tests: nothing here asserts a time).

    python benchmarks/run.py                                  # convert, 1M events, 3 runs
    python benchmarks/run.py --sizes 1M,100MB,1GB,2GB --jobs convert,compact,merge --keep

Each size is generated once with the seeded generator (streamed straight to disk, never held
in memory; `--generate-only` shows this process's peak RSS) and cached under
OUT/inputs/<config + generator-source hash>/ (kept with --keep, else deleted at the end).
Each job runs as its own `cgtrace` subprocess, started from a small fresh helper process that
reports the job's peak RSS through getrusage(RUSAGE_CHILDREN): a child forked straight from
this process would start with this process's high-water mark (Linux carries it over fork and
exec). Jobs with more processes (merge workers, the args helper of convert and compact) also
get their process tree's summed RSS, sampled every 0.1 s. A Markdown table goes to stdout; every run, the machine, the load average and
each job's JSON summary go to OUT/results/bench-<time>.json (and latest.json).

Sizes: `1M`, `250K` = events; `100MB`, `1GB`, `512MiB` = bytes of uncompressed JSON (MB =
10**6). For multi-rank jobs (merge) a size is the total over all ranks.

Adding a job is one entry in JOBS: the cgtrace command line, with {input} / {inputs} /
{output}. A job whose command does not exist yet (`cgtrace <cmd> --help` fails) is skipped
with a note.
"""

from __future__ import annotations

import argparse
import compileall
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "benchmarks" / "out"
CALIBRATION_EVENTS = 50_000
MB = 10 ** 6


@dataclass(frozen=True)
class Job:
    """A cgtrace command line. `argv` follows the executable; {input} is the one input file,
    {inputs} expands to all rank files (one argument each), {output} the output path.
    `ranks`: () = one single-rank input; otherwise one measurement per rank count, inputs
    from write_pp_run with the size split across ranks."""

    argv: tuple[str, ...]
    ranks: tuple[int, ...] = ()
    output_suffix: str = ".perfetto-trace"


JOBS: dict[str, Job] = {
    "convert": Job(("convert", "{input}", "-o", "{output}", "--overwrite", "-q")),
    "compact": Job(("compact", "{input}", "-o", "{output}", "--overwrite", "-q")),
    "merge": Job(("merge", "{inputs}", "-o", "{output}", "--overwrite", "-q"), ranks=(2, 8)),
}

# Runs in a fresh, small interpreter: starts the job, waits, reports the job's own rusage.
# ru_maxrss of RUSAGE_CHILDREN is the peak of the largest single descendant; jobs with worker
# processes (merge --jobs) hold several at once, so the whole process tree's RSS is also
# sampled from /proc every 0.1 s (a sum, and a lower bound on its true peak). The sum of RSS
# counts pages the forked workers share with their parent once per process; the sum of PSS
# (proportional set size) splits them, so it is the tree's real footprint. PSS is sampled every
# 1 s: reading it walks a process's page tables, which at 0.1 s took several percent of a core
# from the job it measured.
_HELPER = r"""
import json, os, resource, subprocess, sys, time

def tree_rss_kb(root, with_pss):
    pids, total, pss, todo = set(), 0, 0, [root]
    while todo:
        pid = todo.pop()
        if pid in pids:
            continue
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            if with_pss:  # walks the page tables: about 5 ms per GB of RSS, so only now and then
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    pss += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return total, pss, len(pids)

argv, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
t0 = time.perf_counter()
proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
import threading
chunks = {}
def drain(name, stream):
    chunks[name] = stream.read()
readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
for r in readers:
    r.start()
# The exit is timed by a thread waiting for it: a sampling loop that noticed it only after its
# 0.1 s sleep and a /proc walk added up to 0.2 s to every wall time (10% of a 2 s run).
ended = {}
exited = threading.Event()
def wait_for_exit():
    proc.wait()
    ended["at"] = time.perf_counter()
    exited.set()
waiter = threading.Thread(target=wait_for_exit)
waiter.start()
tree_peak = pss_peak = procs_peak = samples = 0
timed_out = False
while not exited.is_set():
    rss, pss, n = tree_rss_kb(proc.pid, with_pss=samples % 10 == 0)
    samples += 1
    tree_peak, pss_peak, procs_peak = max(tree_peak, rss), max(pss_peak, pss), max(procs_peak, n)
    if timeout and time.perf_counter() - t0 > timeout:
        proc.kill()
        timed_out = True
        break
    exited.wait(0.1)
waiter.join()
wall = ended["at"] - t0
for r in readers:
    r.join()
child = resource.getrusage(resource.RUSAGE_CHILDREN)
me = resource.getrusage(resource.RUSAGE_SELF)
sys.stdout.write(json.dumps({
    "rc": proc.returncode, "wall_s": wall, "timed_out": timed_out,
    "peak_rss_kb": child.ru_maxrss, "tree_rss_sampled_kb": tree_peak, "tree_pss_sampled_kb": pss_peak, "max_processes": procs_peak,
    "helper_rss_kb": me.ru_maxrss, "user_s": child.ru_utime, "sys_s": child.ru_stime,
    "stdout": chunks.get("out", b"").decode("utf-8", "replace")[-20000:],
    "stderr": chunks.get("err", b"").decode("utf-8", "replace")[-4000:],
}))
"""


# --------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class Size:
    label: str
    events: Optional[int] = None   # exactly one of events / nbytes
    nbytes: Optional[int] = None


_UNITS = {"": 1, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9,
          "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def parse_size(text: str) -> Size:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?(?:I?B)?)\s*", text, re.IGNORECASE)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 1M (events) or 100MB, 2GB (bytes)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be positive")
    label = text.strip()
    if m.group(2).upper().endswith("B"):
        return Size(label, nbytes=int(value))
    return Size(label, events=int(value))


# --------------------------------------------------------------------------- inputs
def _generator_hash() -> str:
    """Inputs are cached per generator source, so a changed generator regenerates."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "converter" / "generator").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _count_events(paths: list[Path]) -> tuple[int, int]:
    """(events, bytes) of generated files, streamed: the generator writes one event per line,
    and a raw newline cannot occur inside JSON text, so every event starts at '\\n{'."""
    events = nbytes = 0
    for path in paths:
        with open(path, "rb") as f:
            prev = b""
            while True:
                chunk = f.read(1 << 24)
                if not chunk:
                    break
                events += (prev + chunk[:1]).count(b"\n{") + chunk.count(b"\n{")
                prev = chunk[-1:]
        nbytes += path.stat().st_size
    return events, nbytes


class InputCache:
    def __init__(self, root: Path, seed: int):
        self.root = root / "inputs"
        self.seed = seed
        self.gen_hash = _generator_hash()
        self.created: list[Path] = []
        self._bytes_per_event: dict[int, float] = {}

    def _key(self, spec: dict) -> str:
        blob = json.dumps({**spec, "seed": self.seed, "generator": self.gen_hash}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def bytes_per_event(self, ranks: int) -> float:
        """Measured on a small generated sample (cached in OUT/inputs/calibration.json)."""
        if ranks in self._bytes_per_event:
            return self._bytes_per_event[ranks]
        cal_file = self.root / "calibration.json"
        cal = json.loads(cal_file.read_text()) if cal_file.exists() else {}
        key = self._key({"calibration": CALIBRATION_EVENTS, "ranks": ranks})
        if key not in cal:
            with tempfile.TemporaryDirectory(dir=self.root.parent) as tmp:
                paths = self._write(Path(tmp), CALIBRATION_EVENTS, ranks)
                events, nbytes = _count_events(paths)
            cal[key] = nbytes / events
            self.root.mkdir(parents=True, exist_ok=True)
            cal_file.write_text(json.dumps(cal, indent=1))
        self._bytes_per_event[ranks] = cal[key]
        return cal[key]

    def _write(self, directory: Path, events: int, ranks: int) -> list[Path]:
        from converter.generator import GeneratorConfig, write_pp_run, write_trace

        if ranks == 0:
            return [write_trace(GeneratorConfig(seed=self.seed, target_events=events), directory / "trace.json")]
        return write_pp_run(directory, pp_size=ranks, seed=self.seed, events_per_rank=max(1, events // ranks))

    def get(self, size: Size, ranks: int) -> dict:
        """Meta of the cached input for (size, ranks): paths, events, bytes, generation time."""
        if size.events is not None:
            events = size.events
        else:
            events = max(1, round(size.nbytes / self.bytes_per_event(ranks)))
        key = self._key({"events": events, "ranks": ranks})
        directory = self.root / key
        meta_file = directory / "meta.json"
        if meta_file.exists():
            meta = json.loads(meta_file.read_text())
            if all(Path(p).exists() for p in meta["paths"]):
                meta["cached"] = True
                return meta
        shutil.rmtree(directory, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        _log(f"generating {size.label} ({events} events target, {'1 rank' if not ranks else f'{ranks} ranks'}) ...")
        t0 = time.perf_counter()
        paths = self._write(tmp, events, ranks)
        gen_s = time.perf_counter() - t0
        tmp.rename(directory)
        paths = [directory / p.name for p in paths]
        n_events, nbytes = _count_events(paths)
        meta = {"key": key, "size": size.label, "ranks": ranks, "target_events": events,
                "events": n_events, "bytes": nbytes, "paths": [str(p) for p in paths],
                "generate_s": round(gen_s, 3), "seed": self.seed, "generator": self.gen_hash,
                # Evidence that generation streams: this process's peak RSS so far.
                "bench_peak_rss_mb_after": round(_self_peak_rss_kb() / 1024, 1)}
        meta_file.write_text(json.dumps(meta, indent=1))
        self.created.append(directory)
        _log(f"  {nbytes / MB:.0f} MB, {n_events} events in {gen_s:.1f} s")
        meta["cached"] = False
        return meta

    def cleanup(self) -> None:
        for directory in self.created:
            shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------- running
def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _self_peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def find_cgtrace(explicit: Optional[str]) -> list[str]:
    """The cgtrace to measure: `explicit`, else this checkout's, with its bytecode compiled as an
    installed package's is (pip compiles it at install). A checkout run with
    PYTHONDONTWRITEBYTECODE set compiles every module at every start: about 0.2 s here."""
    if explicit:
        return [explicit]
    compileall.compile_dir(str(REPO / "converter"), quiet=1)
    beside = Path(sys.executable).parent / "cgtrace"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("cgtrace")
    if found:
        return [found]
    return [sys.executable, "-m", "converter.cli"]


def job_available(cgtrace: list[str], job: Job) -> tuple[bool, str]:
    proc = subprocess.run(cgtrace + [job.argv[0], "--help"], capture_output=True, cwd=REPO)
    if proc.returncode == 0:
        return True, ""
    last = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip().splitlines()
    return False, f"`cgtrace {job.argv[0]} --help` failed (rc {proc.returncode}): {last[-1] if last else ''}"


def expand(job: Job, inputs: list[str], output: str) -> list[str]:
    argv: list[str] = []
    for part in job.argv:
        if part == "{inputs}":
            argv.extend(inputs)
        else:
            argv.append(part.format(input=inputs[0], output=output))
    return argv


def measure(argv: list[str], timeout: Optional[float]) -> dict:
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-c", _HELPER, json.dumps(argv), str(timeout or 0)],
                          capture_output=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring helper failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    result = json.loads(proc.stdout)
    result["load1_before"] = load[0]
    result["load1_after"] = os.getloadavg()[0]
    return result


@dataclass
class Row:
    job: str
    size: str
    ranks: int
    input_bytes: int
    events: int
    runs: list = field(default_factory=list)
    output_bytes: Optional[int] = None
    summary: Optional[dict] = None
    error: Optional[str] = None

    @property
    def best(self) -> Optional[dict]:
        ok = [r for r in self.runs if r["rc"] == 0]
        return min(ok, key=lambda r: r["wall_s"]) if ok else None

    def derived(self) -> dict:
        best = self.best
        if best is None:
            return {}
        ok = [r for r in self.runs if r["rc"] == 0]
        single_kb = max(r["peak_rss_kb"] for r in ok)
        tree_kb = max(r.get("tree_rss_sampled_kb", 0) for r in ok)
        tree_pss_kb = max(r.get("tree_pss_sampled_kb", 0) for r in ok)
        peak_kb = max(single_kb, tree_kb)
        return {
            "best_wall_s": best["wall_s"],
            "best_cpu_s": best["user_s"] + best["sys_s"],
            "mb_per_s": self.input_bytes / MB / best["wall_s"],
            "events_per_s": self.events / best["wall_s"],
            "peak_rss_mb": peak_kb * 1024 / MB,
            "peak_rss_source": "process tree, sampled" if tree_kb > single_kb * 1.02 else "getrusage",
            "tree_pss_mb": tree_pss_kb * 1024 / MB,
            "tree_pss_over_input": tree_pss_kb * 1024 / self.input_bytes,
            "max_processes": max(r.get("max_processes", 1) for r in ok),
            "peak_rss_over_input": peak_kb * 1024 / self.input_bytes,
            "output_over_input": (self.output_bytes / self.input_bytes) if self.output_bytes else None,
            "load1": [min(r["load1_before"] for r in self.runs), max(r["load1_after"] for r in self.runs)],
        }


def run_row(cgtrace: list[str], name: str, job: Job, meta: dict, work: Path, repeat: int,
            keep: bool, timeout: Optional[float]) -> Row:
    ranks = meta["ranks"]
    row = Row(name, meta["size"], ranks or 1, meta["bytes"], meta["events"])
    output = work / f"{name}-{meta['size']}-{ranks or 1}r{job.output_suffix}"
    argv = cgtrace + expand(job, meta["paths"], str(output))
    for i in range(repeat):
        _log(f"{name} {meta['size']}{f' x{ranks} ranks' if ranks else ''}: run {i + 1}/{repeat} ...")
        result = measure(argv, timeout)
        summary_text = result.pop("stdout")
        row.runs.append(result)
        if result["rc"] != 0:
            lines = result["stderr"].strip().splitlines()
            row.error = f"timed out after {timeout} s" if result["timed_out"] else \
                (lines[-1] if lines else f"exit code {result['rc']}")
            _log(f"  failed: {row.error}")
            break
        _log(f"  {result['wall_s']:.2f} s, peak RSS {result['peak_rss_kb'] / 1024:.0f} MiB, "
             f"load {result['load1_before']:.2f}")
        if row.summary is None:
            try:
                row.summary = json.loads(summary_text)
            except ValueError:
                row.summary = None
        if output.exists():
            row.output_bytes = output.stat().st_size
    if not keep and output.exists():
        output.unlink()
    return row


# --------------------------------------------------------------------------- report
def machine_info() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, cwd=REPO, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "converter"], capture_output=True,
                           cwd=REPO, text=True)
    return {"nproc": nproc, "cpu": cpu or platform.processor(), "ram_bytes": ram,
            "python": platform.python_version(), "platform": platform.platform(),
            "commit": (commit.stdout.strip() or "?") + ("+dirty" if dirty.stdout.strip() else ""),
            "loadavg_start": list(os.getloadavg())}


def markdown(rows: list[Row], machine: dict, notes: list[str], repeat: int) -> str:
    ram = f"{machine['ram_bytes'] / 2 ** 30:.0f} GiB" if machine["ram_bytes"] else "?"
    lines = [f"Machine: {machine['nproc']} CPUs ({machine['cpu']}), {ram} RAM, Python {machine['python']}, "
             f"cgtrace {machine['commit']}; best of {repeat} runs; MB = 10^6 bytes of uncompressed JSON.", "",
             "| job | size | ranks | input MB | events | wall s (best) | CPU s | MB/s | events/s "
             "| peak RSS MB | RSS / input | output MB | output / input | load1 |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    tree_note = False
    for row in rows:
        d = row.derived()
        head = f"| {row.job} | {row.size} | {row.ranks} | {row.input_bytes / MB:.0f} | {row.events:,} |"
        if not d:
            lines.append(head + f" failed: {row.error} |" + " |" * 8)
            continue
        out = f"{row.output_bytes / MB:.0f}" if row.output_bytes else "-"
        tree_mark = ""
        if d["peak_rss_source"] != "getrusage":
            tree_mark = f" (tree; PSS {d['tree_pss_mb']:.0f} = {d['tree_pss_over_input']:.2f}x)"
            tree_note = True
        ratio = f"{d['output_over_input']:.2f}" if d["output_over_input"] else "-"
        lines.append(
            head + f" {d['best_wall_s']:.2f} | {d['best_cpu_s']:.2f} | {d['mb_per_s']:.1f} | "
            f"{d['events_per_s'] / 1000:,.0f}k | {d['peak_rss_mb']:.0f}{tree_mark} | {d['peak_rss_over_input']:.2f} | "
            f"{out} | {ratio} | {d['load1'][0]:.1f}-{d['load1'][1]:.1f} |")
    if tree_note:
        lines.append("\n(tree): several processes at once; the sum of their RSS, sampled every 0.1 s, and the sum "
                     "of their PSS (every 1 s), which counts the pages forked workers share with their parent once.")
    for note in notes:
        lines.append(f"\nNote: {note}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark cgtrace jobs: wall time, MB/s, events/s, peak RSS, output size.",
        epilog="jobs: " + ", ".join(f"{n} (`cgtrace {' '.join(j.argv)}`"
                                    + (f", ranks {'/'.join(map(str, j.ranks))})" if j.ranks else ")")
                                    for n, j in JOBS.items()))
    parser.add_argument("--sizes", default="1M",
                        help="comma list: 1M, 250K (events) or 100MB, 1GB, 2GB (bytes of JSON); default 1M")
    parser.add_argument("--jobs", default="convert", help=f"comma list of {', '.join(JOBS)}; default convert")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work dir (default benchmarks/out/)")
    parser.add_argument("--keep", action="store_true",
                        help="keep inputs generated by this run (cached for the next run) and the outputs")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; best wall time is reported")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--cgtrace", help="cgtrace executable (default: the one beside this Python)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per run; the job is killed and reported failed (default: none)")
    parser.add_argument("--generate-only", action="store_true",
                        help="only generate (and cache, with --keep) the inputs; print their sizes and "
                             "this process's peak RSS, which shows generation streams")
    args = parser.parse_args(argv)

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    names = [n.strip() for n in args.jobs.split(",") if n.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        parser.error(f"unknown job(s) {', '.join(unknown)}; known: {', '.join(JOBS)}")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")

    out = args.out.resolve()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    cgtrace = find_cgtrace(args.cgtrace)
    machine = machine_info()
    notes: list[str] = []
    rows: list[Row] = []
    cache = InputCache(out, args.seed)
    inputs_used: list[dict] = []
    try:
        for name in names:
            job = JOBS[name]
            ok, why = job_available(cgtrace, job)
            if not ok:
                notes.append(f"job `{name}` skipped: {why}")
                _log(f"skipping {name}: {why}")
                continue
            for size in sizes:
                for ranks in (job.ranks or (0,)):
                    meta = cache.get(size, ranks)
                    inputs_used.append(meta)
                    if args.generate_only:
                        print(f"{name} {size.label} ranks={ranks or 1}: {meta['bytes'] / MB:.0f} MB, "
                              f"{meta['events']:,} events, generated in {meta['generate_s']} s"
                              f"{' (cached)' if meta['cached'] else ''}; benchmark peak RSS so far "
                              f"{_self_peak_rss_kb() / 1024:.0f} MiB")
                        continue
                    rows.append(run_row(cgtrace, name, job, meta, work, args.repeat, args.keep, args.timeout))
    finally:
        if not args.keep:
            cache.cleanup()

    if args.generate_only:
        return 0
    machine["loadavg_end"] = list(os.getloadavg())
    machine["bench_peak_rss_mb"] = round(_self_peak_rss_kb() / 1024, 1)
    table = markdown(rows, machine, notes, args.repeat)
    print(table)
    results = {
        "when": _dt.datetime.now().isoformat(timespec="seconds"), "machine": machine,
        "argv": sys.argv[1:], "cgtrace": cgtrace, "notes": notes,
        "inputs": inputs_used,
        "rows": [{**asdict(r), **r.derived()} for r in rows],
        "markdown": table,
    }
    results_dir = out / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    blob = json.dumps(results, indent=1)
    (results_dir / f"bench-{stamp}.json").write_text(blob)
    (results_dir / "latest.json").write_text(blob)
    _log(f"results: {results_dir / f'bench-{stamp}.json'}")
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
