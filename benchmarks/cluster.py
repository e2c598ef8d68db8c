"""Batch compaction of many ranks: local worker processes (`--jobs N`) against a Dask
LocalCluster of N single-threaded worker processes (`--scheduler`), on the same inputs.

    python benchmarks/cluster.py                       # 16 ranks, 1 GB in all, 2 workers
    python benchmarks/cluster.py --size 200MB --ranks 8
    python benchmarks/cluster.py --memory-tasks 3000   # worker RSS over 3,000 compact tasks, one command

`--memory-tasks N` runs N compactions of one small generated rank through the jobs' own task
loop (executors.run_tasks, as `compact DIR --scheduler` does) on a 2-worker LocalCluster; each
task returns its worker's RSS as it ends, and the report gives each worker's RSS after its
first 150 tasks (300 in all), at every tenth of the run and at its end.

Inputs are generated once by run.py's cache (benchmarks/out/inputs/, ignored by git); outputs
go to benchmarks/out/cluster/. Each run is the real command line in a subprocess (the driver),
timed from start to exit. Memory: every process's RSS is sampled once a second (a worker's
peak is the largest RSS one of its processes reached; local workers are forked per rank, so
each rank's worker counts as one); the Dask workers' baseline is their RSS before the run.
Overhead: a no-op task's round trip on each executor (mean over `--noop` tasks), and on the
cluster, workers x wall minus the tasks' compute time (Dask's task stream), per task.
The outputs of both runs are compared byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import psutil

from run import MB, REPO, InputCache, machine_info, parse_size  # benchmarks/run.py

OUT = REPO / "benchmarks" / "out"


class Sampler:
    """Peak RSS per process of the watched process trees, sampled once a second."""

    def __init__(self, roots: list[int]):
        self.roots = roots
        self.peaks: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            for root in self.roots:
                try:
                    tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
                except psutil.Error:
                    continue
                for process in tree:
                    try:
                        rss = process.memory_info().rss
                    except psutil.Error:
                        continue
                    self.peaks[process.pid] = max(self.peaks.get(process.pid, 0), rss)
                    self.names.setdefault(process.pid, str(root))
            if self._stop.wait(1.0):
                return


def cgtrace(*argv: str) -> list[str]:
    return [sys.executable, "-m", "converter.cli", *argv]


def timed(argv: list[str], watch: list[int]) -> tuple[float, dict, Sampler]:
    """Runs the command line, returns (wall s, its JSON summary, the memory sampler)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    with Sampler([process.pid, *watch]) as sampler:
        out, err = process.communicate()
    wall = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({process.returncode}): {err.decode()[-2000:]}")
    return wall, json.loads(out), sampler


def noop_round_trip(executor, tasks: int) -> float:
    """Mean seconds per no-op task, submitted all at once and collected in order."""
    start = time.perf_counter()
    futures = [executor.submit(os.getpid) for _ in range(tasks)]
    for future in futures:
        future.result()
    return (time.perf_counter() - start) / tasks


def _compact_and_rss(input_path: Path, output_path: Path, options) -> tuple[int, int]:
    """One compaction in a worker: the worker's pid and resident bytes as it ends."""
    from converter.jobs.runner import run_job

    run_job(input_path, output_path, options)
    return os.getpid(), psutil.Process().memory_info().rss


def worker_memory_over_tasks(tasks: int, workers: int) -> dict:
    """Worker RSS over `tasks` compactions of one small rank in one command's task loop."""
    from distributed import LocalCluster

    from converter.generator import write_pp_run
    from converter.jobs.executors import open_workers, run_tasks
    from converter.jobs.runner import JobOptions

    work = OUT / f"cluster-memory-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    write_pp_run(work / "in", pp_size=2, microbatches=2, steps=1, seed=1)
    rank = sorted((work / "in").glob("rank*_trace.json"))[0]
    rank_bytes = rank.stat().st_size
    options = JobOptions(compact=True, overwrite=True)
    outputs = [work / f"out{k % 8}.perfetto-trace" for k in range(tasks)]  # 8 at a time at most
    started = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as cluster, \
            open_workers(1, cluster.scheduler_address) as remote:
        outcomes = run_tasks(remote, _compact_and_rss, [(rank, out, options) for out in outputs],
                             [str(rank)] * tasks, "compacting")
    wall = time.perf_counter() - started
    by_worker: dict[int, list[int]] = {}
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
        by_worker.setdefault(outcome.value[0], []).append(outcome.value[1])
    shutil.rmtree(work, ignore_errors=True)
    settled = 300 // workers
    return {"tasks": tasks, "workers": workers, "rank_json_bytes": rank_bytes, "wall_s": round(wall, 1),
            "worker_rss_mb": [{"tasks_run": len(rss), "after_first": round(rss[settled - 1] / MB, 1),
                               "tenths": [round(rss[min(len(rss), len(rss) * k // 10) - 1] / MB, 1)
                                          for k in range(1, 11)],
                               "end_vs_settled": round(rss[-1] / rss[settled - 1] - 1, 3)}
                              for rss in by_worker.values()]}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("1GB"), help="all ranks together (default 1GB)")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--noop", type=int, default=100, help="no-op tasks for the overhead figure")
    parser.add_argument("--keep", action="store_true", help="keep the outputs")
    parser.add_argument("--memory-tasks", type=int, default=0,
                        help="instead: worker RSS over this many compact tasks in one command")
    args = parser.parse_args(argv)
    if args.memory_tasks:
        results = {"machine": machine_info(), **worker_memory_over_tasks(args.memory_tasks, args.workers),
                   "loadavg_end": list(os.getloadavg())}
        (OUT / "results").mkdir(parents=True, exist_ok=True)
        (OUT / "results" / f"cluster-memory-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results))
        print(json.dumps(results, indent=1))
        return 0

    from distributed import Client, LocalCluster

    from converter.jobs.workers import LocalProcessExecutor

    machine = machine_info()
    OUT.mkdir(parents=True, exist_ok=True)
    inputs = InputCache(OUT, seed=0).get(args.size, args.ranks)
    directory = Path(inputs["paths"][0]).parent
    print(f"{args.ranks} ranks, {inputs['bytes'] / MB:.0f} MB, {inputs['events']} events in {directory}",
          file=sys.stderr)
    work = OUT / "cluster"
    shutil.rmtree(work, ignore_errors=True)
    results: dict = {"machine": machine, "ranks": args.ranks, "input_bytes": inputs["bytes"],
                     "events": inputs["events"], "workers": args.workers}

    local_out = work / "local"
    local_out.mkdir(parents=True)
    wall, summary, sampler = timed(cgtrace("compact", str(directory), "-o", str(local_out), "--jobs",
                                           str(args.workers), "-q"), [])
    assert summary["written"] == args.ranks, summary
    workers = sorted(pid for pid in sampler.peaks if pid != min(sampler.peaks))  # the driver starts first
    results["local"] = {"wall_s": round(wall, 2), "driver_peak_mb": round(sampler.peaks[min(sampler.peaks)] / MB),
                        "worker_peak_mb": round(max(sampler.peaks[p] for p in workers) / MB) if workers else None}
    with LocalProcessExecutor(args.workers) as executor:
        results["local"]["noop_task_ms"] = round(noop_round_trip(executor, args.noop) * 1e3, 2)

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as cluster, \
            Client(cluster) as client:
        pids = list(client.run(os.getpid).values())
        baseline = {pid: psutil.Process(pid).memory_info().rss for pid in pids}
        client.get_task_stream(start=time.time())  # installs the scheduler's task stream
        remote_out = work / "remote"
        remote_out.mkdir()
        started = time.time()
        wall, summary, sampler = timed(cgtrace("compact", str(directory), "-o", str(remote_out), "--scheduler",
                                               cluster.scheduler_address, "-q"), pids)
        assert summary["written"] == args.ranks, summary
        stream = [task for task in client.get_task_stream(start=started) if "without_gc" in task["key"]]
        compute = sum(part["stop"] - part["start"] for task in stream for part in task["startstops"]
                      if part["action"] == "compute")
        results["cluster"] = {
            "wall_s": round(wall, 2),
            "worker_baseline_mb": round(max(baseline.values()) / MB),
            "worker_peak_mb": round(max(sampler.peaks.get(pid, 0) for pid in pids) / MB),
            "task_compute_s": round(compute, 2),
            "overhead_per_task_s": round((args.workers * wall - compute) / args.ranks, 3),
            "noop_task_ms": round(noop_round_trip(client.get_executor(pure=False), args.noop) * 1e3, 2)}
    same = all((remote_out / p.name).read_bytes() == p.read_bytes() for p in local_out.iterdir())
    results["outputs_identical"] = same and len(list(local_out.iterdir())) == args.ranks
    results["output_bytes"] = sum(p.stat().st_size for p in local_out.iterdir())
    results["loadavg_end"] = list(os.getloadavg())
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    (OUT / "results").mkdir(parents=True, exist_ok=True)
    (OUT / "results" / f"cluster-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
