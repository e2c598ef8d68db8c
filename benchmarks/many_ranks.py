"""Every directory command over one generated DP x PP CUDA-graph job of many ranks, locally
(`--jobs N`) and on a Dask LocalCluster of N single-threaded workers (`--scheduler`):
wall time, CPU time and peak memory per command, and per rank.

    python benchmarks/many_ranks.py --ranks 64 256 1024      # pp 4, dp ranks / 4
    python benchmarks/many_ranks.py --ranks 64 --commands report query

Each job is written once (benchmarks/out/many-ranks/<ranks>/in, ignored by git). Each run is
the real command line in a subprocess. CPU: the command's own user + system time and its
reaped children's (os.wait4: local workers are forked by the command and reaped by it), plus,
on the cluster, what the Dask workers spent during the run (psutil). Peak memory: the
largest RSS of the command's process tree (sampled once a second, cluster.py's Sampler) and,
on the cluster, of any worker. Growth per rank: the difference between two rank counts' CPU
per rank tells whether a command stays linear.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import psutil

from cluster import OUT, Sampler, cgtrace  # benchmarks/cluster.py
from run import MB, REPO, machine_info  # benchmarks/run.py

COMMANDS = ("compact", "merge", "report", "query")


def job(ranks: int) -> Path:
    """The generated job of `ranks` ranks (pipelines of 4), written once."""
    from converter.generator import write_pp_run

    folder = OUT / "many-ranks" / str(ranks) / "in"
    if not folder.is_dir() or len(list(folder.glob("rank*_trace.json"))) != ranks:
        shutil.rmtree(folder, ignore_errors=True)
        write_pp_run(folder, pp_size=4, dp_size=ranks // 4, seed=7)
    return folder


def argv_of(command: str, folder: Path, out: Path) -> list[str]:
    if command == "compact":
        return cgtrace("compact", str(folder), "-o", str(out), "-q")
    if command == "merge":  # a file per pipeline, beside the rank traces (removed after each run)
        return cgtrace("merge", str(folder), "-q")
    if command == "report":
        return cgtrace("report", str(folder), "--format", "json", "-o", str(out / "report.json"), "-q")
    return cgtrace("query", str(folder), "select count(*) as slices from slice", "--format", "csv", "-q")


def run_once(argv: list[str], workers: list[psutil.Process]) -> dict:
    """Wall, CPU (the command, its reaped children, and the given workers) and peak RSS."""
    before = sum(sum(p.cpu_times()[:2]) for p in workers)
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    with Sampler([process.pid, *(p.pid for p in workers)]) as sampler:
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({code}): {process.stderr.read().decode()[-2000:]}")
    worker_cpu = sum(sum(p.cpu_times()[:2]) for p in workers) - before
    watched = {p.pid for p in workers}
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime + worker_cpu, 2),
            "peak_mb": round(max((rss for pid, rss in sampler.peaks.items() if pid not in watched), default=0) / MB),
            "worker_peak_mb": round(max((sampler.peaks.get(pid, 0) for pid in watched), default=0) / MB)}


def measure(ranks: int, commands: list[str], jobs: int, dask: bool) -> dict:
    folder = job(ranks)
    out = folder.parent / "out"
    results: dict = {"ranks": ranks, "json_mb": round(sum(p.stat().st_size for p in folder.iterdir()) / MB, 1)}
    for where in ("local", "dask") if dask else ("local",):
        cluster = None
        if where == "dask":
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None)
        try:
            workers = [psutil.Process(pid) for pid in (
                [w.process.pid for w in cluster.workers.values()] if cluster else [])]  # type: ignore[union-attr]
            placement = ["--scheduler", cluster.scheduler_address] if cluster else ["--jobs", str(jobs)]
            for command in commands:
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                figures = run_once(argv_of(command, folder, out) + placement, workers)
                for merged in folder.glob("pp_group*_merged.perfetto-trace"):
                    merged.unlink()
                figures["cpu_ms_per_rank"] = round(figures["cpu_s"] * 1000 / ranks)
                results[f"{command} {where}"] = figures
                print(ranks, command, where, figures, flush=True)
        finally:
            if cluster is not None:
                cluster.close()
    shutil.rmtree(out, ignore_errors=True)
    return results


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument("--jobs", type=int, default=2, help="local processes, and Dask workers")
    parser.add_argument("--no-dask", action="store_true", help="local workers only")
    args = parser.parse_args(argv)
    report = {"machine": machine_info(), "runs": [measure(ranks, args.commands, args.jobs, not args.no_dask)
                                                  for ranks in args.ranks]}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
