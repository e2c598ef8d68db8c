"""Merge pipeline-parallel rank traces into one timeline, ranks stacked in pipeline order.

Ranks are read and compacted in worker processes, one rank in memory per worker, once:
the first pass finds each rank's PP blocks and keeps the prepared rank in a snapshot
(snapshot.py), the main process pairs every SEND with its RECV across ranks and agrees a flow
id for each arrow, and the second pass loads each snapshot and writes the rank's part with
its arrow ends attached, handing back when its GPUs start or stop computing for the root row's
share of computing GPUs. Parts use their own packet sequence and disjoint uuid and flow-id ranges,
so they concatenate into one valid trace.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Callable, Container, Iterable, Optional, cast

import msgspec

from .. import kineto
from ..analysis.collectives import KERNEL_ARGS_NAME, kernel_args
from ..analysis.stragglers import Arrival, model_arrivals
from ..engine.activity import busy_gpu_changes, running_totals
from ..engine.clock import Clocks, Collectives, estimate_clocks, find_collectives
from ..engine.critical_path import add_path_tracks, critical_paths
from ..engine.layout import separate_overlaps
from ..engine.placement import place_rank, root_name, root_trace
from ..engine.pp import CPU_PP, GPU_PP, STAGELESS, Anchor, BlockKey, Extent, link_rank_local
from ..engine.pp_pairs import CrossRankArrows, pair_sends_and_receives, pair_stages
from ..engine.transfers import RankOps, TransferEnd, Transfers, attach_transfer_ends, find_ops, pair_transfers
from ..engine.transfers import summary as transfers_summary
from ..engine.work_graph import RankWork, rank_work
from ..errors import CgtraceError
from ..fileio.atomic import NotWritten, atomic_output, check_output_path, scratch_folder
from ..inputs.source import json_size
from ..model import ClockPlacement, ExtraArgs, RankIdentity
from ..outputs.perfetto_writer import PerfettoWriter
from ..tuning import Tuning
from .executors import Outcome, Workers, for_cluster, open_workers, run_tasks
from .cycles import choose_cycle, in_cycle, profiling_cycles
from .options import ALIGN_MODES
from .rank_files import RankAccount, account_for_ranks, find_rank_files, named
from .runner import JobOptions, Prepared, prepare
from .snapshot import load_snapshot, save_snapshot
from .verify import Expected, verify_output


@dataclass
class RankInfo:
    """What pass one learns of a rank: identity, clock and the PP blocks' time extents."""

    file: str
    global_rank: int
    world_size: Optional[int]
    pp_group: Optional[tuple[int, ...]]
    base_time_ns: Optional[int]
    absolute_clock: bool
    blocks: dict[BlockKey, Extent] = field(default_factory=dict)
    pp_annotations: str = ""  # which annotations its blocks came from (engine.pp's schemes)
    p2p: RankOps = field(default_factory=RankOps)  # its c10d sends and receives (engine.transfers)
    collectives: Collectives = field(default_factory=Collectives)  # its clock's evidence (engine.clock)
    arrivals: list[Arrival] = field(default_factory=list)  # its collective kernels, for their args (pass two)
    snapshot: str = ""  # where pass one kept the prepared rank for pass two


@dataclass
class RankPlan:
    """What pass two needs: where the rank goes and which arrow ends it carries."""

    file: str
    snapshot: str
    position: int
    pp_rank: int   # its place in the PP group, or in global rank order without one
    global_rank: int
    in_pp_group: bool
    clock: Optional[ClockPlacement] = None  # how, where the merge moved its ranks' clocks (kept in the track roles)
    flow_ends: list[tuple[BlockKey, Anchor, int, bool]] = field(default_factory=list)
    # (block, which of its slices, flow id, outgoing)
    transfer_ends: list[TransferEnd] = field(default_factory=list)
    kernel_args: dict[int, dict[str, Any]] = field(default_factory=dict)  # per collective kernel's row, its figures

    @property
    def identity(self) -> RankIdentity:
        """The rank as the merged trace, the report and the summary name it."""
        return RankIdentity(self.pp_rank, self.global_rank, self.in_pp_group, self.clock)


def merge_ranks(inputs: list[Path], output_for_group: Callable[[int, int], Path], options: JobOptions,
                jobs: Optional[int] = None, assume_aligned: bool = False, pp_group: Optional[int] = None,
                ranks: Optional[Container[int]] = None, scheduler: Optional[str] = None,
                align: str = "auto", cycle: Optional[int] = None) -> dict[str, Any]:
    """Merge rank traces, a merge per profiling cycle (jobs.cycles) where a directory holds the
    same ranks several times, or the one `cycle` names; see `_merge_files` for the rest."""
    cycles = profiling_cycles(find_rank_files(inputs))
    merge = partial(_merge_files, options=options, jobs=jobs, assume_aligned=assume_aligned, pp_group=pp_group,
                    ranks=ranks, scheduler=scheduler, align=align)
    if len(cycles) == 1:
        choose_cycle(cycles, cycle)
        return merge(list(cycles[0].files), output_for_group)
    chosen = choose_cycle(cycles, cycle)
    # Every cycle's output checked before any is written: a rerun is refused whole, not half-way.
    for each in chosen:
        check_output_path(in_cycle(output_for_group(0, 1), each.number), options.overwrite, inputs=each.files)
    done = [(each, merge(list(each.files), partial(_in_cycle, output_for_group, each.number))) for each in chosen]
    pipelines = [dict(pipeline, cycle=each.number, cycle_steps=each.steps)
                 for each, summary in done for pipeline in summary.get("pipelines", [summary])]
    merged: dict[str, Any] = {
        "pipelines": pipelines, "cycles": [{"cycle": each.number, "steps": each.steps} for each, _ in done],
        "events_skipped": sum(pipeline["events_skipped"] for pipeline in pipelines),
        "skipped_by_reason": _summed(pipeline["skipped_by_reason"] for pipeline in pipelines)}
    troubled = [summary for _, summary in done if "rank_account" in summary]
    if troubled:
        merged.update(broken_pipelines=[entry for summary in troubled for entry in summary["broken_pipelines"]],
                      failed=[entry for summary in troubled for entry in summary["failed"]],
                      rank_account=troubled[0]["rank_account"])
    return merged


def _in_cycle(output_for_group: Callable[[int, int], Path], cycle: int, group: int, groups: int) -> Path:
    return in_cycle(output_for_group(group, groups), cycle)


def _merge_files(found: list[Path], output_for_group: Callable[[int, int], Path], options: JobOptions,
                 jobs: Optional[int], assume_aligned: bool, pp_group: Optional[int],
                 ranks: Optional[Container[int]], scheduler: Optional[str], align: str) -> dict[str, Any]:
    """Merge one cycle's rank traces; `output_for_group(k, groups)` names each pipeline's output file.
    `options.window` cuts every rank (steps are numbered alike on all ranks); `ranks` keeps
    only those global ranks. The args strategy "auto" gives pass one's ranks an args helper
    where cores and memory allow (Tuning.helper_fits). With a Dask `scheduler`, both passes run on
    its cluster: only block summaries and busy-GPU changes travel back; snapshots and part
    files stay on the output's file system. `align` (ALIGN_MODES) says whether ranks' clocks
    are estimated from their collectives and transfers, and moved where they disagree."""
    if align not in ALIGN_MODES:
        raise CgtraceError(f"align {align!r}: expected one of {', '.join(ALIGN_MODES)}")
    files = [for_cluster(path, scheduler is not None) for path in found]
    if not files:
        raise CgtraceError("no rank traces to merge; pass two or more rank trace files or a directory of them")
    if len(files) < 2:
        raise CgtraceError(f"{files[0]}: a merge needs at least two rank traces; use `cgtrace compact` for one")
    if options.output_format != "perfetto":
        raise CgtraceError(f"{files[0]}: --format json is not available for merged traces (one JSON document "
                           "cannot carry the arrows between ranks' parts); leave out --format")
    # Fail on an output that cannot be written: a single pipeline's (several pipelines' files
    # are named, and checked, once pass one has found them)
    check_output_path(output_for_group(0, 1), options.overwrite, inputs=files)
    sizes = sorted((json_size(path) for path in files), reverse=True)
    tuning = options.tuning
    jobs = max(1, jobs or tuning.default_jobs(sizes))
    # A Dask worker runs threads, so it never forks an args helper (cores_to_spare).
    helpers = scheduler is None and (options.args_strategy == "helper" or
                                     (options.args_strategy == "auto" and tuning.helper_fits(sizes, jobs)))
    scanning = msgspec.structs.replace(options, compact=True, args_strategy="helper" if helpers else "in-process",
                                       tuning=tuning.shared_by(jobs))
    # One rank at a time runs in this process, unless each needs a fresh one: a process forked
    # from a heap that held earlier ranks (an args helper, a worker) keeps those pages while its
    # parent reuses them.
    in_process = scheduler is None and jobs == 1 and not helpers
    # Snapshots live beside the output (absolute: workers may run in another directory).
    with scratch_folder(".cgtrace-merge-", output_for_group(0, 1).parent.absolute()) as scratch, \
            nullcontext(None) if in_process else open_workers(jobs, scheduler) as workers:
        tasks = [(str(file), scanning, str(scratch / f"rank{k:05d}")) for k, file in enumerate(files)]
        outcomes = _scanned(workers, tasks, list(map(str, files)))
        infos = [outcome.value for outcome in outcomes if outcome.error is None]
        failed = [{"input": outcome.name, "error": outcome.error} for outcome in outcomes if outcome.error is not None]
        account = account_for_ranks(files)
        if ranks is not None:
            infos = [info for info in infos if info.global_rank in ranks]
            if len(infos) < 2:
                raise CgtraceError(f"{files[0]}: --ranks leaves {len(infos)} of the given traces; pass --ranks that "
                                   "name two or more of their global ranks" + _unread(failed, account))
        groups, order_source = _pipelines(infos, assume_aligned, partial=ranks is not None)
        if not groups:
            raise CgtraceError(f"{files[0]}: --ranks leaves no pipeline with two or more ranks; choose more ranks")
        broken = [] if ranks is not None else _broken(groups, failed)
        lacking = {entry["pp_group"] for entry in broken}
        if pp_group is not None:  # the others are not asked for: only the chosen one must be whole
            broken = [entry for entry in broken if entry["pp_group"] == pp_group]
        chosen = [index for index in range(len(groups)) if index not in lacking] if pp_group is None else [pp_group]
        if pp_group is not None and not 0 <= pp_group < len(groups):
            raise CgtraceError(f"--pp-group {pp_group}: the traces hold {len(groups)} pipeline(s), numbered from 0")
        if not chosen or pp_group in lacking:
            raise CgtraceError(f"{files[0]}: " + "; ".join(entry["why"] for entry in broken)
                               + "; pass all ranks of a pipeline" + _unread(failed, account))
        outputs = {index: output_for_group(index, len(groups)) for index in chosen}
        for output in outputs.values():
            check_output_path(output, options.overwrite, inputs=files)
        results = [_merge_pipeline(groups[index], index, output, options, workers, order_source, align)
                   for index, output in outputs.items()]
    for result in results:
        result.update(ranks_at_once=None if scheduler else jobs, args_helpers=helpers,
                      workers=workers.where if workers else "this process")
    summary: dict[str, Any] = results[0] if len(results) == 1 and not broken else {
        "pipelines": results, "pp_order_source": order_source,
        "events_skipped": sum(result["events_skipped"] for result in results),
        "skipped_by_reason": _summed(result["skipped_by_reason"] for result in results)}
    if broken or failed or account.missing:  # every intact pipeline written; what was left out, and why
        summary.update(broken_pipelines=broken, failed=failed, rank_account=account.as_json())
    return summary


def _broken(groups: list[list[RankInfo]], failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pipelines that lack a rank, each with why: those with a PP group, the ranks of it not
    read (missing, or its file unreadable); where no PP group orders them (the ranks given are
    the pipeline), any trace that could not be read."""
    broken = []
    for index, members in enumerate(groups):
        group = members[0].pp_group
        read = {info.global_rank for info in members}
        lacking = [rank for rank in group if rank not in read] if group else []
        if group and lacking:
            why = f"pipeline {index} {list(group)} lacks the trace of global rank(s) {named(map(str, lacking))}"
        elif not group and failed:
            why = f"the ranks given lack {len(failed)} trace(s) that could not be read"
        else:
            continue
        broken.append({"pp_group": index, "ranks": list(group) if group else None, "lacking": lacking,
                       "why": f"{why}, so it is not merged"})
    return broken


def _unread(failed: list[dict[str, Any]], account: RankAccount) -> str:
    """What the merge could not read, as the tail of a line: the failed files, the ranks absent."""
    absent = account.note()
    return ((f"; {len(failed)} trace(s) could not be read, first {failed[0]['error']}" if failed else "")
            + (f"; {absent}" if absent else ""))


def _scanned(workers: Optional[Workers], tasks: list, files: list[str]) -> list[Outcome]:
    """Pass one's outcome per rank file, each rank read or the one-line reason its file could
    not be: a rank that fails breaks its own pipeline, not the others."""
    if workers is not None:
        outcomes = run_tasks(workers, _scan_rank, tasks, files, "reading ranks")
    else:
        outcomes = []
        for name, task in zip(files, tasks):
            try:
                outcomes.append(Outcome(name, value=_scan_rank(*task)))
            except CgtraceError as error:
                outcomes.append(Outcome(name, error=error.message, exception=error))
    # A bug, or a failure of this machine (a full disk: io_error) rather than of a rank's file, stops the merge.
    stop = next((o.exception for o in outcomes if o.exception is not None and
                 (not isinstance(o.exception, CgtraceError) or o.exception.io_error is not None)), None)
    if stop is None and all(o.exception is not None for o in outcomes):
        stop = outcomes[0].exception  # no rank read: nothing to merge, nothing to name beside it
    if stop is not None:
        raise stop
    return outcomes


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    return dict(sum(map(Counter, counts), Counter()))


def _merge_pipeline(members: list[RankInfo], group_index: int, output: Path, options: JobOptions,
                    workers: Optional[Workers], order_source: str, align: str) -> dict[str, Any]:
    transfers, arrows = _pair(members)
    clocks = None if align == "none" else estimate_clocks(
        [info.collectives for info in members], (transfers or arrows).bounds,
        [f"global rank {info.global_rank}" for info in members])
    offsets = [rank.offset_ns if align == "auto" and clocks.skewed() else 0 for rank in clocks.ranks] \
        if clocks is not None else [0] * len(members)
    if any(offsets):  # pair again on the one clock: which arrows can be drawn depends on it
        transfers, arrows = _pair([_shifted(info, offset) for info, offset in zip(members, offsets)])
    plans = [RankPlan(file=info.file, snapshot=info.snapshot, position=k, global_rank=info.global_rank,
                      in_pp_group=info.pp_group is not None,
                      clock=None if clocks is None or not any(offsets) else ClockPlacement(
                          offsets[k], clocks.ranks[k].uncertainty_ns, tuple(sorted(clocks.ranks[k].evidence.items()))),
                      pp_rank=info.pp_group.index(info.global_rank) if info.pp_group else k)
             for k, info in enumerate(members)]
    for end in arrows.ends:
        plans[end.position].flow_ends.append((end.block, end.anchor, end.flow_id, end.outgoing))
    for transfer_end in transfers.ends if transfers is not None else []:
        plans[transfer_end.position].transfer_ends.append(transfer_end)
    # Each collective's figures across the pipeline's ranks, on its one clock, for its kernels' args.
    arrivals = {k: [arrival.shifted(offsets[k]) for arrival in info.arrivals] for k, info in enumerate(members)}
    figures = kernel_args(arrivals, lambda k: plans[k].identity.title, lambda k: {"global_rank": plans[k].global_rank})
    for position, rows in figures.items():
        plans[position].kernel_args = rows
    cross_rank_arrows = len(arrows.ends) // 2 + (transfers.pairs if transfers is not None else 0)
    base = min(info.base_time_ns or 0 for info in members)
    parts: list[RankPart] = _in_workers(workers, _write_rank_part,
                                        [(plan, f"{plan.snapshot}.group{group_index}.part", options.tuning)
                                         for plan in plans],
                                        [plan.file for plan in plans], "writing ranks")
    busy_gpus = running_totals(change for part in parts for change in part.busy_gpu_changes)
    root = root_trace(root_name(any(plan.in_pp_group for plan in plans)), busy_gpus,
                      sum(part.gpus for part in parts))
    # Across ranks where arrows (a pipeline) or collectives (data-parallel ranks) join them.
    paths = critical_paths([part.work for part in parts])
    path_slices = add_path_tracks(root, root.tracks[0], paths, [plan.identity for plan in plans])
    expected = Expected(sum(part.expected.slices for part in parts) + path_slices,
                        sum(part.expected.flows for part in parts) + cross_rank_arrows,
                        sum(part.expected.counter_samples for part in parts) + len(root.counters))
    verified: dict[str, int] = {}

    def check(temporary: Path, target: Path) -> None:
        verified.update(verify_output(temporary, expected, options.tp_bin, shown_as=target))

    with atomic_output(output, options.overwrite, check if options.verify else None) as stream:
        writer = PerfettoWriter(cast(BinaryIO, stream), sequence_id=1)  # a DirectWriter: the writer only calls write()
        writer.write(root)
        writer.close()
        for part in parts:
            with open(part.path, "rb") as written:
                shutil.copyfileobj(written, stream, 1 << 22)
            os.unlink(part.path)  # as the output grows, so the scratch folder shrinks
    per_rank = [part.summary for part in parts]
    result = {
        "output": str(output),
        "pp_group": group_index,
        "pp_order_source": order_source,
        "pp_ranks": [{"pp_rank": plan.pp_rank, "global_rank": plan.global_rank, "file": plan.file} for plan in plans],
        "time_offsets_ns": [(info.base_time_ns or 0) - base for info in members],
        "pp_annotations": sorted({r["pp_annotations"] for r in per_rank}),
        "pp_send_recv_pairs": arrows.pairs if transfers is None else transfers.pairs,
        "pp_stage_dependency_pairs": arrows.stage_pairs,
        "pp_stage_dependency_unmatched": arrows.stage_unmatched,
        "pp_send_recv_unmatched": len(arrows.unmatched),
        "pp_send_recv_unmatched_examples": arrows.unmatched[:20],
        "pp_arrival_markers": arrows.pairs,
        "pp_receives_posted_early": arrows.early_receives,
        "pp_clock_skew_pairs": arrows.skew_pairs,
        "pp_max_clock_skew_ns": arrows.max_skew,
        "pp_compute_dependency_pairs": sum(r["pp_compute_dependency_pairs"] for r in per_rank),
        "pp_compute_dependency_unmatched": sum(r["pp_compute_dependency_unmatched"] for r in per_rank),
        "pp_unshard_compute_pairs": sum(r["pp_unshard_compute_pairs"] for r in per_rank),
        "pp_unshard_compute_unmatched": sum(r["pp_unshard_compute_unmatched"] for r in per_rank),
        "critical_path": {"steps": len(paths), "segments": path_slices},
        # Said at the top, as a compact says it: a rank whose events were skipped (a base time
        # that puts them past int64 ns) is no longer missed in a list of ranks.
        "events_skipped": sum(r["events_skipped"] for r in per_rank),
        "skipped_by_reason": _summed(r["skipped_by_reason"] for r in per_rank),
        "per_rank_compaction": per_rank,
        "output_bytes": output.stat().st_size,
    }
    if transfers is not None:
        result.update(transfers_summary(transfers))
    if clocks is not None:
        result["clock_alignment"] = _clock_summary(clocks, offsets, members)
    if verified:
        result["verified"] = verified
    return result


def _pair(members: list[RankInfo]) -> tuple[Optional[Transfers], CrossRankArrows]:
    """The pipeline's cross-rank pairs: from c10d ops where it has them (annotations then name
    the peers), else from its SEND/RECV annotations, else from its stage-less compute."""
    extents, global_ranks = [info.blocks for info in members], [info.global_rank for info in members]
    transfers = pair_transfers([info.p2p for info in members], global_ranks, *_pipeline_places(members)) \
        if any(info.p2p.ops for info in members) else None
    stageless = all(info.pp_annotations == STAGELESS for info in members)
    arrows = CrossRankArrows() if transfers is not None else pair_stages(extents) if stageless else \
        pair_sends_and_receives(extents, global_ranks)
    return transfers, arrows


def _shifted(info: RankInfo, offset: int) -> RankInfo:
    """The rank's blocks and ops on a clock `offset` ns later."""
    if not offset:
        return info
    return replace(info, blocks={key: extent.shifted(offset) for key, extent in info.blocks.items()},
                   p2p=info.p2p.shifted(offset))


def _clock_summary(clocks: Clocks, offsets: list[int], members: list[RankInfo]) -> dict[str, Any]:
    """Per rank: the offset estimated and the one applied, its uncertainty and evidence."""
    return {"applied": any(offsets), "warnings": clocks.warnings,
            "ranks": [{"global_rank": info.global_rank, "estimated_offset_ns": rank.offset_ns,
                       "applied_offset_ns": offset, "uncertainty_ns": rank.uncertainty_ns,
                       "evidence": dict(rank.evidence)}
                      for info, rank, offset in zip(members, clocks.ranks, offsets)]}


def _pipeline_places(members: list[RankInfo]) -> tuple[list[int], int]:
    """The members' PP ranks and the pipeline's size, whichever of its ranks are merged: from
    the PP group, else (the world is the pipeline) from the global ranks."""
    group = members[0].pp_group
    if group is not None:
        return [group.index(info.global_rank) for info in members], len(group)
    ranks = [info.global_rank for info in members]
    return ranks, members[0].world_size or max(ranks) + 1


def _in_workers(workers: Optional[Workers], function: Callable[..., Any], tasks: list, files: list[str],
                label: str) -> list:
    """function(*task) per rank file, results in task order: on the workers, stopping at the
    first failure, or (no workers) one after the other in this process."""
    if workers is None:
        return [function(*task) for task in tasks]
    return [outcome.value for outcome in run_tasks(workers, function, tasks, files, label, stop_at_failure=True)]


def _scan_rank(file: str, options: JobOptions, snapshot: str) -> RankInfo:
    # No queue depth rows: a rank's dozens of replay streams made its rows taller than a screen.
    prepared = prepare(Path(file), options, options.lanes, queue_rows=False)
    trace, header = prepared.trace, prepared.header
    if header.problem is not None or header.rank is None:
        raise CgtraceError(f"{file}: {header.problem}")
    base = kineto.base_time_ns(trace.metadata)  # the reader has checked it
    first_ts = int(trace.slices.ts.min()) if len(trace.slices) else 0
    stages = frozenset(key.stage for key in prepared.blocks) if prepared.pp_annotations in (CPU_PP, GPU_PP) \
        else frozenset()
    p2p = find_ops(trace, options.lanes, stages)  # before the snapshot takes the trace
    collectives = find_collectives(trace)
    arrivals = model_arrivals(trace)
    return RankInfo(
        file=file, global_rank=header.rank, world_size=header.world_size, pp_group=header.pp_group,
        base_time_ns=base,
        # Old Kineto traces carry epoch microseconds and no base: already one clock.
        absolute_clock=base is None and first_ts > 10**15,
        blocks={key: block.extent() for key, block in prepared.blocks.items()},
        pp_annotations=prepared.pp_annotations, p2p=p2p, collectives=collectives, arrivals=arrivals,
        snapshot=_saved(prepared, snapshot))


def _saved(prepared: Prepared, snapshot: str) -> str:
    try:
        save_snapshot(prepared, Path(snapshot))
    except OSError as error:
        raise _scratch_failed(Path(snapshot), "keep a rank for the merge's second pass", error) from None
    return snapshot


def _scratch_failed(path: Path, doing: str, error: OSError) -> NotWritten:
    """The one message for the scratch folder beside the output running out (of space, most often)."""
    return NotWritten(f"{path.parent}: cannot {doing} ({error.strerror or error}); free space beside the output "
                      "(the merge keeps its ranks there between passes) or write the output elsewhere with -o",
                      path.parent, error)


def _pipelines(infos: list[RankInfo], assume_aligned: bool, partial: bool = False) -> tuple[list[list[RankInfo]], str]:
    """Pipelines in PP order, whichever of their ranks were read; with `partial` (--ranks), one
    of fewer than two ranks is left out."""
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
        _check_agreement(group, members, infos)
        if len(members) >= 2 or not partial:  # a pipeline lacking ranks is named (_broken), not merged
            pipelines.append(members)
    return pipelines, "distributedInfo.pg_config"


def _check_agreement(group: tuple[int, ...], members: list[RankInfo], infos: list[RankInfo]) -> None:
    """Every rank a PP group lists lists that group, in that order: else two ranks disagree on
    the pipeline (`[1, 0]` against `[0, 1]`), and either order would be a guess."""
    listing = next(info for info in infos if info.pp_group == group)
    other = next((member for member in members if member.pp_group and member.pp_group != group), None)
    if other is not None:
        raise CgtraceError(f"{other.file}: its PP group {list(other.pp_group or ())} contradicts {listing.file}'s "
                           f"{list(group)} (distributedInfo.pg_config); the traces disagree on the pipeline: merge "
                           "one run's traces, or fix their pg_config")


@dataclass
class RankPart:
    """One rank's rows, written to `path` for the output to take whole."""

    path: str
    summary: dict[str, Any]
    expected: Expected
    busy_gpu_changes: list[tuple[int, int]]   # activity.busy_gpu_changes, for the root's counter
    gpus: int                                 # ... and how many GPUs (a CPU-only rank counts as one)
    work: RankWork  # its work graph on the pipeline's clock, for the critical path (written with the root)


def _write_rank_part(plan: RankPlan, path: str, tuning: Tuning) -> RankPart:
    prepared = load_snapshot(Path(plan.snapshot))
    trace, summary, blocks = prepared.trace, prepared.summary, prepared.blocks
    offset = plan.clock.offset_ns if plan.clock is not None else 0  # added to all its times
    if offset:  # first: the arrow ends' times are on the pipeline's clock
        trace.shift_clock(offset)
        blocks = {key: block.shifted(offset) for key, block in blocks.items()}
    summary.update(link_rank_local(trace, blocks))
    for key, anchor, flow_id, outgoing in plan.flow_ends:
        blocks[key].attach(trace, anchor, flow_id, outgoing)
    attach_transfer_ends(trace, plan.transfer_ends)
    work = rank_work(trace)  # before overlaps move: nodes keep their own lane or thread
    place_rank(trace, plan.position, plan.identity)
    summary["overlaps_moved"] = separate_overlaps(trace, tuning)
    stride = plan.position + 1
    try:
        with open(path, "wb") as stream:
            writer = PerfettoWriter(stream, sequence_id=stride + 1, uuid_base=stride << 32,
                                    flow_id_base=stride << 40, tuning=tuning)
            writer.write(trace, ExtraArgs.per_row({row: {KERNEL_ARGS_NAME: args} for row, args in plan.kernel_args.items()}))
            writer.close()
    except OSError as error:
        raise _scratch_failed(Path(path), "write a rank's part of the merge", error) from None
    summary.update(rank=plan.identity.title, pp_rank=plan.pp_rank, global_rank=plan.global_rank,
                   pp_annotations=prepared.pp_annotations, file=plan.file)
    return RankPart(path, summary, Expected(len(trace.slices), len(trace.flows), len(trace.counters)),
                    *busy_gpu_changes(trace), work)
