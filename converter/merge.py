"""Merge pipeline-parallel rank traces into one timeline, ranks stacked in pipeline order.

Ranks are read and compacted in worker processes, one rank in memory per worker, twice:
the first pass finds each rank's PP blocks, the main process pairs every SEND with its RECV
across ranks and agrees a flow id for each arrow, and the second pass writes each rank's part
with its arrow ends attached. Parts use their own packet sequence and disjoint pid, tid, uuid
and flow-id ranges, so they concatenate into one valid trace.
"""

from __future__ import annotations

import multiprocessing
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .compaction import compact
from .background_args import available_cores
from .errors import CgtraceError
from .lanes import load_lane_rules
from .layout import separate_overlaps
from .model import FlowEnd, Track, Trace
from .output import atomic_output
from .perfetto_writer import PerfettoWriter
from .pp import Block, BlockKey, find_blocks, link_rank_local, pp_group_of
from .reader import read_trace
from .source import json_size
from .window import Window, cut, window_bounds

PIPELINE_ROOT_NAME = "Pipeline (PP rank order)"
_ROOT_UUID = 1 << 62
_RANK_ID_STRIDE = 1 << 20          # pids and tids of merge position k: (k + 1) << 20 ...
_CROSS_RANK_FLOW_BASE = 1 << 61
# For choosing how many ranks to hold at once (measured: see the README's merge table):
# a rank's model per byte of its JSON, and a process's own interpreter and modules.
_RANK_BYTES_PER_JSON_BYTE = 1.5
_PROCESS_BYTES = 24 << 20
_ENCODED_ARGS_PER_JSON_BYTE = 0.25
_TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_TRACE_NAME = re.compile(r"^(rank.*_trace|.*\.pt\.trace)\.json(\.gz)?$")
# The compute a receive feeds, for an arrow that cannot end on the receive itself.
_CONSUMER = {"RECV_F": ("F",), "RECV_B": ("B", "I")}


@dataclass
class RankInfo:
    """What pass one learns of a rank: identity, clock and the PP blocks' time extents."""

    file: str
    global_rank: int
    world_size: Optional[int]
    pp_group: Optional[tuple[int, ...]]
    base_time_ns: Optional[int]
    absolute_clock: bool
    blocks: dict[BlockKey, tuple[int, int, int, int]] = field(default_factory=dict)
    # block -> (first fragment start, its end, last-ending fragment start, its end)


@dataclass
class RankPlan:
    """What pass two needs: where the rank goes and which arrow ends it carries."""

    file: str
    position: int
    pp_rank: int
    global_rank: int
    flow_ends: list[tuple[BlockKey, str, int, bool]] = field(default_factory=list)
    # (block, "first" | "last" fragment, flow id, outgoing)


def find_rank_files(inputs: list[Path]) -> list[Path]:
    """Explicit files, or the trace files of one directory: those named like rank traces
    (`rank*_trace.json`, `*.pt.trace.json`) when there are any, so a config or results JSON
    beside them is left alone; otherwise every JSON file there."""
    if len(inputs) == 1 and inputs[0].is_dir():
        directory = inputs[0]
        files = sorted(p for p in directory.iterdir()
                       if p.is_file() and p.name.endswith(_TRACE_SUFFIXES) and not p.name.startswith("."))
        if not files:
            raise CgtraceError(f"{directory}: no trace files (*.json, *.json.gz); pass a directory of rank traces")
        named = [p for p in files if _RANK_TRACE_NAME.match(p.name)]
        return named or files
    for path in inputs:
        if not path.is_file():
            raise CgtraceError(f"{path}: no such file; pass rank trace files or one directory")
    return list(inputs)


def merge_ranks(inputs: list[Path], output_for_group, overwrite: bool = False, strict: bool = False,
                lanes_file: Optional[Path] = None, jobs: Optional[int] = None, assume_aligned: bool = False,
                pp_group: Optional[int] = None, window: Optional[Window] = None,
                ranks: Optional[set[int]] = None) -> dict:
    """Merge rank traces; `output_for_group(k, groups)` names each pipeline's output file.
    `window` cuts every rank (steps are numbered alike on all ranks); `ranks` keeps only those
    global ranks."""
    files = find_rank_files(inputs)
    if len(files) < 2:
        raise CgtraceError(f"{files[0]}: a merge needs at least two rank traces; use `cgtrace compact` for one")
    load_lane_rules(lanes_file)  # fail on bad rules before any work
    sizes = sorted((json_size(path) for path in files), reverse=True)
    jobs = max(1, jobs or default_jobs(sizes))
    encode_args_ahead = helper_fits(sizes, jobs)
    reading = (strict, lanes_file, window)
    infos = _in_workers(_scan_rank, [(str(f), *reading) for f in files], jobs, fresh_workers=encode_args_ahead)
    if ranks is not None:
        infos = [info for info in infos if info.global_rank in ranks]
        if len(infos) < 2:
            raise CgtraceError(f"{files[0]}: --ranks leaves {len(infos)} of the given traces; a merge needs two or more")
    groups, order_source = _pipelines(infos, assume_aligned, partial=ranks is not None)
    if not groups:
        raise CgtraceError(f"{files[0]}: --ranks leaves no pipeline with two or more ranks; choose more ranks")
    chosen = range(len(groups)) if pp_group is None else [pp_group]
    if pp_group is not None and not 0 <= pp_group < len(groups):
        raise CgtraceError(f"--pp-group {pp_group}: the traces hold {len(groups)} pipeline(s), numbered from 0")
    results = []
    for index in chosen:
        results.append(_merge_pipeline(groups[index], index, output_for_group(index, len(groups)), overwrite,
                                       reading, jobs, order_source, encode_args_ahead))
    for result in results:
        result.update(ranks_at_once=jobs, args_helpers=encode_args_ahead)
    return results[0] if len(results) == 1 else {"pipelines": results, "pp_order_source": order_source}


def default_jobs(sizes: list[int]) -> int:
    """How many ranks to hold at once, given their JSON sizes (largest first): as many as there
    are cores, while the estimated peak stays below the inputs' total size. A rank in memory
    takes about 1.5x its JSON, so two equal ranks go one at a time (in this process), and
    eight go two at a time."""
    total, limit = sum(sizes), min(len(sizes), available_cores())
    jobs = 1
    while jobs < limit and _PROCESS_BYTES * (jobs + 2) + _RANK_BYTES_PER_JSON_BYTE * sum(sizes[:jobs + 1]) <= total:
        jobs += 1
    return jobs


def helper_fits(sizes: list[int], jobs: int) -> bool:
    """Whether pass two's workers should each have an args helper (background_args.py): only
    on idle cores, and while the peak, with the encoded args held for writing, stays below
    the inputs' total size (so not for two ranks of 75 MB, where interpreters dominate)."""
    if 2 * jobs > available_cores():
        return False
    processes = 2 * jobs + 1  # this one, the workers and their helpers
    rank_bytes = (_RANK_BYTES_PER_JSON_BYTE + _ENCODED_ARGS_PER_JSON_BYTE) * sum(sizes[:jobs])
    return _PROCESS_BYTES * processes + rank_bytes <= sum(sizes)


def _merge_pipeline(members: list[RankInfo], group_index: int, output: Path, overwrite: bool, reading: tuple,
                    jobs: int, order_source: str, encode_args_ahead: bool) -> dict:
    plans = [RankPlan(file=info.file, position=k, global_rank=info.global_rank,
                      pp_rank=info.pp_group.index(info.global_rank) if info.pp_group else k)
             for k, info in enumerate(members)]
    arrows = _pair_sends_and_receives(members, plans)
    base = min(info.base_time_ns or 0 for info in members)
    with tempfile.TemporaryDirectory(prefix=".cgtrace-merge-", dir=output.parent) as scratch:
        parts = _in_workers(_write_rank_part, [(plan, *reading, scratch, encode_args_ahead) for plan in plans],
                            jobs, fresh_workers=encode_args_ahead)
        with atomic_output(output, overwrite) as stream:
            _write_root(stream)
            for part_path, _ in parts:
                with open(part_path, "rb") as part:
                    shutil.copyfileobj(part, stream, 1 << 22)
    per_rank = [summary for _, summary in parts]
    return {
        "output": str(output),
        "pp_group": group_index,
        "pp_order_source": order_source,
        "pp_ranks": [{"pp_rank": plan.pp_rank, "global_rank": plan.global_rank, "file": plan.file} for plan in plans],
        "time_offsets_ns": [(info.base_time_ns or 0) - base for info in members],
        "pp_send_recv_pairs": arrows["pairs"],
        "pp_send_recv_unmatched": len(arrows["unmatched"]),
        "pp_send_recv_unmatched_examples": arrows["unmatched"][:20],
        "pp_send_recv_retargeted": arrows["retargeted"],
        "pp_send_recv_not_drawn": len(arrows["not_drawn"]),
        "pp_send_recv_not_drawn_examples": arrows["not_drawn"][:20],
        "pp_clock_skew_pairs": arrows["skew_pairs"],
        "pp_max_clock_skew_ns": arrows["max_skew"],
        "pp_compute_dependency_pairs": sum(r["pp_compute_dependency_pairs"] for r in per_rank),
        "pp_compute_dependency_unmatched": sum(r["pp_compute_dependency_unmatched"] for r in per_rank),
        "pp_unshard_compute_pairs": sum(r["pp_unshard_compute_pairs"] for r in per_rank),
        "pp_unshard_compute_unmatched": sum(r["pp_unshard_compute_unmatched"] for r in per_rank),
        "per_rank_compaction": per_rank,
        "output_bytes": output.stat().st_size,
    }


def _in_workers(function, tasks: list, jobs: int, fresh_workers: bool = False) -> list:
    """Run tasks in worker processes (one rank in memory each), results in task order. A single
    job runs in this process unless `fresh_workers`: a process forked from a heap that held
    earlier ranks (an args helper, a worker) keeps those pages while its parent reuses them."""
    if not fresh_workers and (jobs == 1 or len(tasks) == 1):
        return [function(*task) for task in tasks]
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(min(jobs, len(tasks)), maxtasksperchild=1) as pool:
        return pool.starmap(function, tasks, chunksize=1)


def _read_compacted(file: str, strict: bool, lanes_file: Optional[Path], window: Optional[Window],
                    encode_args_ahead: bool = False) -> tuple[Trace, dict, dict]:
    rules = load_lane_rules(lanes_file)
    trace = read_trace(Path(file), strict=strict, encode_args_ahead=encode_args_ahead)
    cut_summary = {}
    if window is not None:
        trace, cut_summary = cut(trace, *window_bounds(trace, window, file))
    summary = compact(trace, rules)
    summary.update(cut_summary)
    return trace, summary, find_blocks(trace, rules)


def _scan_rank(file: str, strict: bool, lanes_file: Optional[Path], window: Optional[Window]) -> RankInfo:
    trace, _, blocks = _read_compacted(file, strict, lanes_file, window)
    info = trace.metadata.get("distributedInfo")
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
        raise CgtraceError(f"{file}: no distributedInfo.rank; a merge needs traces from "
                           "torch.distributed runs (or pass only such files)")
    base = trace.metadata.get("baseTimeNanoseconds")
    group = pp_group_of(info)
    first_ts = min((s.ts for s in trace.slices), default=0)
    return RankInfo(
        file=file, global_rank=info["rank"], world_size=info.get("world_size"),
        pp_group=tuple(group) if group else None,
        base_time_ns=base if isinstance(base, int) else None,
        # Old Kineto traces carry epoch microseconds and no base: already one clock.
        absolute_clock=not isinstance(base, int) and first_ts > 10**15,
        blocks={key: _extent(block) for key, block in blocks.items()})


def _extent(block: Block) -> tuple[int, int, int, int]:
    first, last = _fragment(block, "first"), _fragment(block, "last")
    return first.ts, first.ts + first.dur, last.ts, last.ts + last.dur


def _fragment(block: Block, which: str):
    """The same fragment in both passes: the first to start, or the last to end."""
    if which == "first":
        return min(block.fragments, key=lambda f: (f.ts, -f.dur))
    return max(block.fragments, key=lambda f: (f.ts + f.dur, f.ts))


def _pipelines(infos: list[RankInfo], assume_aligned: bool, partial: bool = False) -> tuple[list[list[RankInfo]], str]:
    """Pipelines in PP order; with `partial` (--ranks), a pipeline may lack some of its ranks."""
    ranks = Counter(info.global_rank for info in infos)
    duplicate = next((rank for rank, n in ranks.items() if n > 1), None)
    if duplicate is not None:
        files = [info.file for info in infos if info.global_rank == duplicate]
        raise CgtraceError(f"{files[1]}: global rank {duplicate} appears twice ({files[0]} too); "
                           "pass each rank's trace once")
    sizes = {info.world_size for info in infos}
    if len(sizes) > 1:
        raise CgtraceError(f"{infos[0].file}: traces disagree on world_size ({sorted(map(str, sizes))}); "
                           "they come from different runs: merge one run's traces")
    for info in infos:
        if info.base_time_ns is None and not info.absolute_clock and not assume_aligned:
            raise CgtraceError(f"{info.file}: no baseTimeNanoseconds, so its clock cannot be aligned with the "
                               "other ranks; pass --assume-aligned if all ranks share one clock")
    by_rank = {info.global_rank: info for info in infos}
    groups: dict[tuple[int, ...], list[RankInfo]] = {}
    for info in infos:
        if info.pp_group:
            groups.setdefault(info.pp_group, [])
    if not groups:
        return [sorted(infos, key=lambda i: i.global_rank)], "global rank order (no PP group in distributedInfo.pg_config)"
    pipelines = []
    for group in sorted(groups, key=min):
        members = [by_rank[rank] for rank in group if rank in by_rank]
        if len(members) < len(group) and not partial:
            missing = ", ".join(map(str, sorted(set(group) - set(by_rank))[:8]))
            raise CgtraceError(f"{(members or infos)[0].file}: pipeline {list(group)} lacks the trace of global "
                               f"rank(s) {missing}; pass all ranks of the pipeline")
        if len(members) >= 2 or not partial:
            pipelines.append(members)
    return pipelines, "distributedInfo.pg_config"


def _pair_sends_and_receives(members: list[RankInfo], plans: list[RankPlan]) -> dict:
    """SEND_F of stage s -> RECV_F of stage s+1, SEND_B of s -> RECV_B of s-1, per step and
    microbatch; each arrow gets one agreed flow id.

    Perfetto points every arrow from the slice that starts first, so an arrow must end on a
    slice that starts after the send began. A receive is usually posted early and waits; then
    the arrow ends on its last fragment if that starts after the send, else on the first
    compute that consumes the data (`pp_send_recv_retargeted`). A receive that ended before its
    send began means the ranks' clocks disagree (`pp_clock_skew_pairs`, largest skew reported).
    """
    owner: dict[BlockKey, int] = {}
    for position, info in enumerate(members):
        for key in info.blocks:
            owner[key] = position
    next_id = _CROSS_RANK_FLOW_BASE
    pairs = retargeted = skew_pairs = max_skew = 0
    unmatched: list[str] = []
    not_drawn: list[str] = []
    for key in sorted(owner):
        if key.action not in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
            continue
        # Forward data flows to the next stage, gradients to the previous one.
        downstream = 1 if key.action.endswith("_F") else -1
        peer_stage = key.stage + (downstream if key.action.startswith("SEND") else -downstream)
        peer_action = ("RECV_" if key.action.startswith("SEND") else "SEND_") + key.action[-1]
        peer = BlockKey(key.step, peer_stage, peer_action, key.microbatch)
        if peer not in owner:
            unmatched.append(f"{key.describe()} on global rank {members[owner[key]].global_rank}: "
                             f"no {peer.describe()}")
            continue
        if key.action.startswith("RECV"):
            continue  # each pair is handled once, from its send
        send_info, recv_info = members[owner[key]], members[owner[peer]]
        send_start = send_info.blocks[key][0]
        _, _, recv_last_start, recv_last_end = recv_info.blocks[peer]
        if recv_last_end <= send_start:
            skew_pairs += 1
            max_skew = max(max_skew, send_start - recv_last_end)
        if recv_last_start > send_start:
            target = (peer, "last")
        else:
            consumer = next((k for k in (BlockKey(peer.step, peer.stage, action, peer.microbatch)
                                         for action in _CONSUMER[peer_action])
                             if k in recv_info.blocks and recv_info.blocks[k][0] > send_start), None)
            if consumer is None:
                pairs += 1
                not_drawn.append(f"{key.describe()} -> {peer.describe()}: neither the receive nor the compute "
                                 f"it feeds starts after the send begins (capture window cut?)")
                continue
            target = (consumer, "first")
            retargeted += 1
        next_id += 1
        pairs += 1
        plans[owner[key]].flow_ends.append((key, "first", next_id, True))
        plans[owner[peer]].flow_ends.append((*target, next_id, False))
    return {"pairs": pairs, "unmatched": unmatched, "retargeted": retargeted, "skew_pairs": skew_pairs,
            "max_skew": max_skew, "not_drawn": not_drawn}


def _write_rank_part(plan: RankPlan, strict: bool, lanes_file: Optional[Path], window: Optional[Window],
                     scratch: str, encode_args_ahead: bool):
    trace, summary, blocks = _read_compacted(plan.file, strict, lanes_file, window, encode_args_ahead)
    summary.update(link_rank_local(trace, blocks))
    for key, which, flow_id, outgoing in plan.flow_ends:
        trace.flow_ends.append(FlowEnd(_fragment(blocks[key], which), flow_id, outgoing))
    _place_rank(trace, plan)
    summary["overlaps_moved"] = separate_overlaps(trace)
    path = Path(scratch) / f"part{plan.position:05d}"
    stride = plan.position + 1
    with open(path, "wb") as stream:
        writer = PerfettoWriter(stream, sequence_id=stride + 1, uuid_base=stride << 32, flow_id_base=stride << 40)
        writer.write(trace)
        writer.close()
    summary.update(pp_rank=plan.pp_rank, global_rank=plan.global_rank, file=plan.file)
    return str(path), summary


def _place_rank(trace: Trace, plan: RankPlan) -> None:
    """Rename processes after the rank, give ids no other rank uses, hang the GPU lanes under
    the pipeline root in PP order (the one ordering Perfetto v52 honours above processes)."""
    prefix = f"PP rank {plan.pp_rank} (global rank {plan.global_rank})"
    base = (plan.position + 1) * _RANK_ID_STRIDE
    for index, process in enumerate(trace.processes):
        process.name = f"{prefix} | {process.short_name}"
        process.labels = []
        process.pid = base + index
    for index, thread in enumerate(trace.threads):
        # A process's main thread keeps tid == pid; the rest take ids no pid uses.
        is_main = thread.source_tid == thread.process.source_pid
        thread.tid = thread.process.pid if is_main else base + _RANK_ID_STRIDE // 2 + index
    containers = [t for t in trace.tracks if t.orders_children and t.process is not None]
    for rank_in_part, container in enumerate(containers):
        container.name = container.process.name
        container.parent = ROOT_TRACK
        container.process = None
        container.order = plan.position * 64 + rank_in_part + 1


ROOT_TRACK = Track(name=PIPELINE_ROOT_NAME, orders_children=True, uuid=_ROOT_UUID)


def _write_root(stream) -> None:
    root_only = Trace(tracks=[ROOT_TRACK])
    writer = PerfettoWriter(stream, sequence_id=1)
    writer.write(root_only)
    writer.close()
