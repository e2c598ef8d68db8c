"""`cgtrace report`: where GPU time goes, from SQL over the trace in trace_processor.

Every figure is defined once, in DEFINITIONS, which the text and HTML legends, the JSON's
"definitions" and docs/cli.md repeat word for word; all of them cover one window per GPU
(its profiled steps, else its active span), with slices cut at the window's edges. Lanes,
their groups and kinds, and the ranks of a merge come from the track roles cgtrace wrote
(model/roles_document.py), never from track names; in a trace cgtrace did not compact each
GPU slice is grouped by lane rules (`--lanes FILE`, else the built-in ones), so both give
the same figures. SQL merges each group's slices into disjoint busy intervals; the set
arithmetic on those is in intervals.py, the output in render.py.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..kineto import CPU_OP_CATEGORY, KERNEL_CATEGORIES, PROFILER_STEP_PREFIX
from ..lane_rules import LaneRules, load_lane_rules
from ..model import LaneGroup, LaneKind, TrackRole, roles_document
from ..model.roles_document import RolesDocument, TrackEntry
from ..model.intervals import Intervals, Spans, covered, intersect, subtract, union
from ..model.trace import rank_title
from ..model.waits import no_host, no_work, ready_times
from .findings import FINDINGS_DEFINITION, report_findings
from .idle import IDLE_DEFINITIONS, gpu_work, host_sides, idle_by_cause
from .launches import LAUNCH_DEFINITIONS, launch_stats
from .gpu_time_by_op import GPU_TIME_BY_OP_DEFINITIONS, NOT_ATTRIBUTED, gpu_time_by_op
from .collectives import COLLECTIVE_DEFINITIONS, collectives
from .critical_path import CRITICAL_PATH_DEFINITIONS, read_critical_path
from .memory import MEMORY_DEFINITIONS, memcpy_traffic, memory_peaks
from .pipeline_anatomy import ANATOMY_DEFINITIONS, anatomy, read_stages
from .step_windows import owned_step_windows
from .stragglers import STRAGGLER_DEFINITIONS, Arrival, hold_ups, late_arrivals, read_arrivals, straggler_answer
from ..tp.sql_text import sql_list
from ..tp.tables import ACTIVE_SPAN
from .query import open_checked, run_sql

# The figures, each defined once: keys as in the JSON's "definitions".
DEFINITIONS: dict[str, str] = {
    "window": "each GPU's profiled steps (its rank's ProfilerStep#N spans, bounded as step windows says), else "
              "its active span (from its first GPU slice's start to its last one's end); every figure covers "
              "this window only, slices cut at its edges",
    "step windows": "launched (the default): a step runs from its CPU span's start to the end of the last GPU "
                    "slice launched within that span (its launch arrow, Kineto's ac2g flow, starts there), or "
                    "to its CPU span's end if later, and starts no earlier than the previous step ends, so steps "
                    "never overlap and each holds the GPU work it launched; cpu: the CPU spans alone",
    "busy": "time at least one slice runs: the union of slice intervals, so concurrent slices count once",
    "exposed communication": "time some communication lane is busy while no compute lane is; a kernel that "
                             "waits for data inside a compute lane is compute, so this is not time blocked",
    "bubble": "per GPU and step: time in the step with no compute lane busy",
    "RECV, SEND": "per GPU and step, apart from the bubble: time inside PP RECV_F/RECV_B (SEND_F/SEND_B) "
                  "blocks, and how much of it a compute lane is busy; blocks overlap compute and each other, "
                  "so they do not add up to the step",
    "top kernels": "kernels by their total time in the window; count is the kernels that overlap it",
    "kernels by op": "per GPU, kernel time in the window under the op that launched each kernel: the innermost "
                     "cpu_op or user_annotation (a ProfilerStep#N span is a step, not an op; of ops with one "
                     "span, the last by name, as cgtrace nests them) around the CPU call its launch arrow comes "
                     "from (Kineto's ac2g flow, by correlation id, from cudaLaunchKernel or cudaGraphLaunch); "
                     "kernels with no launch arrow, and those whose launch no op encloses, are counted apart",
    "kind": "what a lane group counts as (compute, communication, memory, other): the lane rules' `kind`, "
            "kept in the track roles of a trace cgtrace compacted",
    **ANATOMY_DEFINITIONS,
    **STRAGGLER_DEFINITIONS,
    **COLLECTIVE_DEFINITIONS,
    **CRITICAL_PATH_DEFINITIONS,
    **MEMORY_DEFINITIONS,
    **GPU_TIME_BY_OP_DEFINITIONS,
    **IDLE_DEFINITIONS,
    **LAUNCH_DEFINITIONS,
    "findings": FINDINGS_DEFINITION,
}
_PP_KIND_OF = {"F": "F", "B": "B", "I": "I", "W": "W", "SEND_F": "SEND", "SEND_B": "SEND",
               "RECV_F": "RECV", "RECV_B": "RECV"}


# -- SQL -----------------------------------------------------------------------------------------
# Busy intervals: a slice opens a new one when it starts after every earlier slice of its group ended.
_ISLANDS_SQL = """
select owner, grp, min(ts) as start, max(end_ts) as end from (
  select owner, grp, ts, end_ts,
         sum(opens) over (partition by owner, grp order by ts, end_ts rows unbounded preceding) as island
  from (
    select owner, grp, ts, ts + dur as end_ts,
           case when ts <= max(ts + dur) over (partition by owner, grp order by ts, ts + dur
                                               rows between unbounded preceding and 1 preceding)
                then 0 else 1 end as opens
    from report_gpu))
group by owner, grp, island order by owner, grp, start"""


# (PP rank, global rank, in a pipeline) of a merged trace's part or a compacted rank; else None
Rank = Optional[tuple[int, int, bool]]


@dataclass
class _Roles:
    """What the track roles written by cgtrace say (empty for other traces)."""

    by_uuid: dict[int, TrackEntry] = field(default_factory=dict)
    rank_of_uuid: dict[int, Rank] = field(default_factory=dict)  # tracks and a rank's groups of rows
    group_order: dict[str, int] = field(default_factory=dict)  # lane groups as compaction ordered them
    only_rank: Rank = None  # the rank of a trace that holds one (a compacted rank trace): all of it
    clocks: list[dict[str, Any]] = field(default_factory=list)  # how a merge set each rank's clock

    @classmethod
    def read(cls, documents: list[RolesDocument]) -> "_Roles":
        roles = cls()
        order: list[str] = []  # each document's lane groups in its order, merged (a rank may lack some)
        for document in documents:
            rank = document.rank
            identity = (rank.pp_rank, rank.global_rank, rank.pipeline) if rank else None
            place = 0
            for role in document.tracks:
                roles.by_uuid[role.uuid] = role
                roles.rank_of_uuid[role.uuid] = identity
                lane = _lane_group(role)
                if lane is not None and lane.id not in order:
                    order.insert(place, lane.id)
                if lane is not None:
                    place = order.index(lane.id) + 1
            for uuid in rank.groups if rank else ():
                roles.rank_of_uuid[uuid] = identity
            if rank is not None and rank.clock is not None:
                roles.clocks.append({"pp_rank": rank.pp_rank, "global_rank": rank.global_rank,
                                     "rank": rank_title(rank.pp_rank, rank.global_rank, rank.pipeline),
                                     "offset_ns": rank.clock.offset_ns, "uncertainty_ns": rank.clock.uncertainty_ns,
                                     "evidence": rank.clock.evidence})
        roles.group_order = {group: index for index, group in enumerate(order)}
        if len(documents) == 1:
            roles.only_rank = next(iter(set(roles.rank_of_uuid.values())), None)
        return roles


def _lane_group(role: Optional[TrackEntry]) -> Optional[LaneGroup]:
    """The lane group of a lane's role; None for any other track."""
    return role.lane_group if role is not None and role.role is TrackRole.LANE else None


class _Trace:
    """One open trace plus the helper tables the report's queries share."""

    def __init__(self, tp: Any, path: Path, rules: LaneRules):
        self.tp = tp
        self.path = path
        self.rules = rules
        self.track_owners: dict[int, str] = {}   # owner id of a parent track -> its name
        self.owner_ranks: dict[int, Rank] = {}
        self.only_rank: Rank = None
        self.clocks: list[dict[str, Any]] = []    # how a merge set each rank's clock, where it did
        self.groups: dict[str, LaneGroup] = {}    # lane group id -> group, in display order
        self.path_tracks: list[int] = []          # the tracks of a merge's critical path

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return run_sql(self.tp, sql, self.path).rows

    def create(self, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
        self.rows(f"create table {table} ({columns})")
        for i in range(0, len(rows), 500):
            self.rows(f"insert into {table} values "
                      + ", ".join("(" + sql_list(row) + ")" for row in rows[i:i + 500]))

    def prepare(self) -> bool:
        """Creates report_track (owner, lane group, annotation flag per track) and report_gpu
        (GPU slices with owner and lane group); True when lanes come from track roles.

        An owner is a process (its upid) or, for tracks outside every process, the parent track
        they sit under (-1 - its id): a merged trace groups each rank's GPU lanes under a global
        track named after that rank's GPU process.
        """
        roles = _Roles.read([roles_document.decode(text, self.path) for (text,) in self.rows(roles_document.SQL)])
        self.only_rank, self.clocks = roles.only_rank, sorted(roles.clocks, key=lambda c: c["pp_rank"])
        tracks = self.rows("""
            select t.id, t.parent_id, coalesce(t.name, th.name), coalesce(pt.upid, th.upid),
              (select a.int_value from args a where a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id')
            from track t left join thread_track tt using (id) left join thread th using (utid)
            left join process_track pt using (id)""")
        parents = {track_id: parent for track_id, parent, _, _, _ in tracks}
        uuids = {track_id: uuid for track_id, _, _, _, uuid in tracks}
        names = {track_id: name for track_id, _, name, _, _ in tracks}
        own_upid = {track_id: upid for track_id, _, _, upid, _ in tracks}

        def shown_in(track_id: int) -> Optional[int]:
            """The row a track sits in, past the lanes the UI folds rows under."""
            parent = parents.get(track_id)
            while parent is not None and _lane_group(roles.by_uuid.get(uuids[parent])) is not None:
                parent = parents.get(parent)
            return parent

        def owner(track_id: int) -> Optional[int]:
            ancestor: Optional[int] = track_id
            seen: set[int] = set()
            while ancestor is not None and ancestor not in seen:
                if own_upid.get(ancestor) is not None:
                    return own_upid[ancestor]
                seen.add(ancestor)
                ancestor = parents.get(ancestor)
            parent = shown_in(track_id)
            return None if parent is None else -1 - parent

        owned = []
        for track_id, _, _, _, uuid in tracks:
            track_owner = owner(track_id)
            if track_owner is None:
                continue
            role = roles.by_uuid.get(uuid)
            lane = _lane_group(role)
            if lane is not None:
                self.groups.setdefault(lane.id, lane)
            if role is not None and role.role is TrackRole.CRITICAL_PATH:
                self.path_tracks.append(track_id)
            owned.append((track_id, track_owner, None if lane is None else lane.id,
                          int(role is not None and role.role is TrackRole.ANNOTATIONS)))
            # Ranked by its own role (a compacted rank's tracks, in its process), or by the
            # group of rows it sits in (a merged rank's).
            for known in (uuid, uuids[-1 - track_owner]) if track_owner < 0 else (uuid,):
                if roles.rank_of_uuid.get(known) is not None:
                    self.owner_ranks[track_owner] = roles.rank_of_uuid[known]
        self.groups = dict(sorted(self.groups.items(), key=lambda item: roles.group_order[item[0]]))
        self.track_owners = {o: names[-1 - o] for _, o, _, _ in owned if o < 0}
        self.create("report_track", "id integer primary key, owner int, lane text, annotation int", owned)
        if self.groups:
            self.rows("""create table report_gpu as
                select s.id, s.arg_set_id, t.owner, t.lane as grp, s.ts, s.dur, s.name, s.category
                from slice s join report_track t on t.id = s.track_id where s.dur > 0 and t.lane is not null""")
            return True
        # Not compacted by cgtrace: group each distinct (name, category) by the lane rules.
        rules = self.rules
        self.groups = {group.id: group for group in rules.groups}
        kinds = self.rows(f"""select distinct coalesce(name, ''), category from slice
                              where dur > 0 and category in ({sql_list(sorted(rules.gpu_categories))})""")
        self.create("report_group", "name text, category text, grp text, primary key (name, category)",
                    [(name, category, rules.group_of(name, category)) for name, category in kinds])
        self.rows("""create table report_gpu as
            select s.id, s.arg_set_id, t.owner, g.grp, s.ts, s.dur, s.name, s.category
            from slice s join report_track t on t.id = s.track_id
            join report_group g on g.name = coalesce(s.name, '') and g.category = s.category
            where s.dur > 0""")
        return False

    def gpu_names(self) -> dict[int, tuple[str, Optional[int]]]:
        """owner -> (name, device): "GPU <n>" from the `device` arg Kineto gives every GPU slice
        (kept in every form of the trace, merged too), else the process's "GPU ..." label, else
        its name."""
        devices = {owner: device for owner, device in self.rows("""
            select owner, min(device) from (
              select owner, extract_arg(arg_set_id, 'debug.args.device') as device from report_gpu)
            group by owner having count(distinct device) = 1 and min(device) is not null""")}
        names = {upid: (labels or "", name or f"process {pid}") for upid, pid, name, labels in self.rows("""
            select p.upid, p.pid, p.name, (select group_concat(a.display_value, '|') from args a
              where a.arg_set_id = p.arg_set_id and a.flat_key = 'chrome.process_label')
            from process p""")}
        names.update({owner: ("", name) for owner, name in self.track_owners.items()})
        found = {}
        for owner, (labels, name) in names.items():
            device = devices.get(owner)
            label = next((label for label in labels.split("|") if label.startswith("GPU")), None)
            found[owner] = (f"GPU {device}" if device is not None else label or name, device)
        return found

    def rank(self, owner: Optional[int]) -> Rank:
        return self.only_rank if owner is None else self.owner_ranks.get(owner, self.only_rank)


# -- the report ----------------------------------------------------------------------------------
@dataclass
class Timeline:
    """One GPU's PP blocks and bubbles over its steps: what the HTML draws per rank."""

    label: str
    steps: list[tuple[str, int, int]]
    blocks: dict[str, Intervals]   # PP kind -> the time inside its blocks
    bubbles: Intervals
    pp_rank: Optional[int] = None  # where a merge ranks it: the critical path's segments on it are drawn too


@dataclass
class Report:
    """The figures (JSON-ready, times in integer ns) and the pipeline timelines HTML draws."""

    figures: dict[str, Any]
    timelines: list[Timeline] = field(default_factory=list)
    arrivals: dict[Rank, list[Arrival]] = field(default_factory=dict)  # each rank's collective kernels
    span: tuple[int, int] = (0, 0)  # the first slice's start and the last one's end: how far a clock drift reaches


def build_report(path: Path, tp_bin: Optional[str] = None, top: int = 10, lanes: Optional[LaneRules] = None,
                 shown_as: Optional[Path] = None, step_windows: str = "launched") -> Report:
    """All figures of the trace at `path` (named `shown_as` where it was made from another file).
    `lanes`: lane rules for traces cgtrace did not compact (default: the built-in rules);
    `step_windows`: how a step is bounded, "launched" or "cpu" (--step-windows; step_windows.py)."""
    rules = lanes or load_lane_rules()
    with open_checked(path, tp_bin, shown_as) as tp:
        trace = _Trace(tp, path, rules)
        by_roles = trace.prepare()
        islands: dict[int, dict[str, Intervals]] = defaultdict(lambda: defaultdict(list))
        for owner, group, start, end in trace.rows(_ISLANDS_SQL):
            islands[owner][group].append((start, end))
        names = trace.gpu_names()
        steps = _steps(trace)
        if step_windows == "launched":
            steps = _owning(trace, steps)
        blocks = _blocks(trace)
        gpus = sorted((_Gpu(trace, owner, groups, names[owner], steps, blocks.get(owner, {}))
                       for owner, groups in islands.items()), key=_Gpu.order)
        _clip_to_windows(trace, gpus)
        counts = {(owner, group): slices for owner, group, slices in trace.rows("""
            select owner, grp, count(*) from report_gpu_in_window group by 1, 2""")}
        kernels = trace.rows(f"""
            select name, count(*), sum(inside) as total from report_gpu_in_window
            where category in ({sql_list(KERNEL_CATEGORIES)})
            group by name order by total desc, name limit {max(int(top), 0)}""")
        by_op = _kernels_by_op(trace, top)
        by_launch = gpu_time_by_op(trace.rows, top)
        hosts, work = host_sides(trace.rows), gpu_work(trace.rows)
        owners = dict(trace.rows("select id, owner from report_track"))
        arrivals = read_arrivals(trace.rows, lambda track: trace.rank(owners.get(track)))
        critical = read_critical_path(trace.rows, trace.path_tracks)
        peaks, copies = memory_peaks(trace.rows), memcpy_traffic(trace.rows)
        span = trace.rows("select coalesce(min(ts), 0), coalesce(max(ts + dur), 0) from slice")[0]
        pipeline = anatomy(read_stages(trace.rows, trace.rank, rules, steps,
                                       {gpu.rank: (gpu.compute, gpu.communication) for gpu in gpus if gpu.rank}))
    per_gpu = []
    for gpu in gpus:
        host = hosts.get(gpu.rank[:2] if gpu.rank else (None, None)) or no_host()
        mine = work.get(gpu.owner) or no_work()
        ready = ready_times(mine, host)
        per_gpu.append({**gpu.figures(counts), "kernels_by_op": by_op.get(gpu.owner, _launched_by([], top)),
                        "gpu_time_by_op": by_launch.get(gpu.owner, {"could_not_tell": NOT_ATTRIBUTED}),
                        "idle_by_cause": idle_by_cause(mine, ready, Spans.of(gpu.busy), gpu.periods, host),
                        "launches": launch_stats(mine, ready, gpu.periods, host)})
    figures: dict[str, Any] = {
        "input": {"trace": str(shown_as or path),
                  "lanes_from": "track roles" if by_roles else "lane rules on GPU slice names and categories",
                  "step_windows": step_windows},
        "definitions": DEFINITIONS,
        "gpus": per_gpu,
        "top_kernels": [{"name": name, "count": count, "total_ns": total, "mean_ns": total / count}
                        for name, count, total in kernels],
    }
    if pipeline is not None:
        figures["pipeline"] = pipeline
    if critical:  # a merge, or a compact asked to, wrote its critical path
        figures["critical_path"] = critical
    if peaks:  # the trace holds [memory] events
        figures["memory"] = peaks
    if copies:
        figures["memcpy"] = copies
    if trace.clocks:  # a merge that moved its ranks' clocks
        figures["clocks"] = trace.clocks
    if len(arrivals) > 1:  # a merge: its ranks' collectives on its one clock
        title = _rank_title(arrivals, per_gpu)
        figures.update(_stragglers(arrivals, per_gpu, trace.clocks, title))
        figures["collectives"] = collectives(arrivals, title, lambda rank: {
            "pp_rank": rank[0] if rank else None, "global_rank": rank[1] if rank else None})
    figures = {"input": figures["input"], "findings": [f.as_json() for f in report_findings(figures)], **figures}
    return Report(figures, [gpu.timeline(gpu_label(shown)) for gpu, shown in zip(gpus, per_gpu) if gpu.blocks],
                  arrivals, (int(span[0]), int(span[1])))


# How much of each window list lies before `t`: the window open at or last before `t`, found
# through the (owner, start) key, and the windows before it (`before`, their summed length).
_BEFORE_SQL = """coalesce((select w.before + max(0, min({t}, w.end) - w.start) from report_window w
                        where w.owner = g.owner and w.start <= {t} order by w.start desc limit 1), 0)"""


def _clip_to_windows(trace: _Trace, gpus: list["_Gpu"]) -> None:
    """report_gpu_in_window: each GPU slice that overlaps its GPU's window, with how long it
    is inside (`inside`). A slice's share is the windows' length before its end less that
    before its start, two lookups by key, where joining every slice with every step window
    grew with slices times steps."""
    rows = []
    for gpu in gpus:
        before = 0
        for start, end in gpu.window:
            rows.append((gpu.owner, start, end, before))
            before += end - start
    trace.create("report_window", "owner int, start int, end int, before int, primary key (owner, start)", rows)
    trace.rows(f"""create table report_gpu_in_window as
        select * from (select g.id, g.owner, g.grp, g.name, g.category,
                              {_BEFORE_SQL.format(t="g.ts + g.dur")} - {_BEFORE_SQL.format(t="g.ts")} as inside
                       from report_gpu g)
        where inside > 0""")


# Each kernel's launch (the source of its one incoming flow, Kineto's ac2g arrow) and the
# innermost op around that launch; NULL op: no launch, or a launch outside every op.
_KERNELS_BY_OP_SQL = """
select owner, launched, op, count(*), sum(inside) from (
  select k.owner, k.inside, l.launch is not null as launched,
         case when l.launch is null then null else
           (select a.name from ancestor_slice(l.launch) a
            where a.category in ({ops}) and a.name not glob '{step}*' order by a.depth desc limit 1) end as op
  from report_gpu_in_window k
  left join (select slice_in, min(slice_out) as launch from flow group by slice_in) l on l.slice_in = k.id
  where k.category in ({kernels}))
group by owner, launched, op"""
_OP_CATEGORIES = (CPU_OP_CATEGORY, "user_annotation")


def _kernels_by_op(trace: _Trace, top: int) -> dict[int, dict[str, Any]]:
    """Per GPU (owner), its kernels' time in the window by the op that launched them."""
    rows: dict[int, list[tuple[bool, Optional[str], int, int]]] = defaultdict(list)
    for owner, launched, op, kernels, total in trace.rows(_KERNELS_BY_OP_SQL.format(
            ops=sql_list(_OP_CATEGORIES), step=PROFILER_STEP_PREFIX, kernels=sql_list(KERNEL_CATEGORIES))):
        rows[owner].append((bool(launched), op, kernels, total))
    return {owner: _launched_by(found, top) for owner, found in rows.items()}


def _launched_by(rows: list[tuple[bool, Optional[str], int, int]], top: int) -> dict[str, Any]:
    """One GPU's kernels by op, `top` ops by time (then name), and those no op can be told for."""
    def apart(launched: bool) -> dict[str, int]:
        found = [(kernels, total) for has_launch, op, kernels, total in rows if op is None and has_launch == launched]
        return {"kernels": sum(kernels for kernels, _ in found), "total_ns": sum(total for _, total in found)}

    ops = sorted(((op, kernels, total) for _, op, kernels, total in rows if op is not None),
                 key=lambda row: (-row[2], row[0]))
    return {"ops": [{"op": op, "kernels": kernels, "total_ns": total} for op, kernels, total in ops[:max(top, 0)]],
            "no_launch": apart(False), "no_op": apart(True)}


def _ranked_gpus(arrivals: dict[Rank, list[Arrival]], gpus: list[dict[str, Any]]) -> dict[Rank, dict[str, Any]]:
    """Each merged rank that runs collectives -> its GPU's figures."""
    gpu_of = {(gpu["pp_rank"], gpu["global_rank"]): gpu for gpu in gpus}
    return {rank: gpu_of[rank[:2]] for rank in arrivals if rank and rank[:2] in gpu_of}


def _rank_title(arrivals: dict[Rank, list[Arrival]], gpus: list[dict[str, Any]]) -> Callable[[Rank], str]:
    """A merged rank as the collectives' answers name it: as its GPU is named."""
    ranked = _ranked_gpus(arrivals, gpus)

    def title(rank: Rank) -> str:
        return gpu_label(ranked[rank]) if rank in ranked else rank_title(*rank) if rank else "a rank"
    return title


def _stragglers(arrivals: dict[Rank, list[Arrival]], gpus: list[dict[str, Any]], clocks: list[dict[str, Any]],
                title: Callable[[Rank], str]) -> dict[str, Any]:
    """The merged ranks that hold collectives up (stragglers.py), named by `title`, and what
    backs the answer; a rank's lateness is sure only beyond its clock's uncertainty, where the
    merge moved its clock."""
    ranked = _ranked_gpus(arrivals, gpus)
    steps = [step["step_ns"] for gpu in gpus for step in gpu["steps"]]
    median = statistics.median(steps) if steps else 0
    moved = {(clock["pp_rank"], clock["global_rank"]): clock["uncertainty_ns"] or 0 for clock in clocks}
    unsure: dict[Rank, int] = {rank: moved[rank[:2]] for rank in arrivals if rank and rank[:2] in moved}
    found = late_arrivals(arrivals, title, unsure)
    rows = [{"file": None, "global_rank": rank[1] if rank else None, "gpu": ranked[rank]["gpu"] if rank in ranked
             else None, "title": title(rank), **figures}
            for rank, figures in hold_ups(found.late, {rank: len(gpu["steps"]) for rank, gpu in ranked.items()},
                                          median)]
    return straggler_answer(found, rows, median)


def _steps(trace: _Trace) -> dict[Rank, list[tuple[str, int, int]]]:
    """ProfilerStep#N spans on the CPU side, per rank: {rank: [(name, start, end)] by start}."""
    spans: dict[tuple[Rank, str], tuple[int, int]] = {}
    for name, start, end, owner in trace.rows(f"""
            select s.name, s.ts, s.ts + s.dur, t.owner from slice s left join report_track t on t.id = s.track_id
            where s.name glob 'ProfilerStep#*' and s.dur > 0
              and coalesce(s.category, '') not in ({sql_list(sorted(trace.rules.annotation_categories))})
              and coalesce(t.annotation, 0) = 0
              and (t.owner is null or t.owner not in (select distinct owner from report_gpu))"""):
        key = (trace.rank(owner), name)
        known = spans.get(key)
        spans[key] = (min(start, known[0]), max(end, known[1])) if known else (start, end)
    by_rank: dict[Rank, list[tuple[str, int, int]]] = defaultdict(list)
    for (rank, name), (start, end) in spans.items():
        by_rank[rank].append((name, start, end))
    return {rank: sorted(items, key=lambda item: item[1]) for rank, items in by_rank.items()}


def _owning(trace: _Trace, steps: dict[Rank, list[tuple[str, int, int]]]) -> dict[Rank, list[tuple[str, int, int]]]:
    """Each rank's steps run on to the end of the GPU work launched within them (the "step
    windows" definition): each GPU slice's launch is the start of its launch arrow's source."""
    launched: dict[Rank, list[tuple[int, int]]] = defaultdict(list)
    for owner, launch, end in trace.rows("""
            select g.owner, s.ts, g.ts + g.dur from report_gpu g
            join (select slice_in, min(slice_out) as launch from flow group by slice_in) l on l.slice_in = g.id
            join slice s on s.id = l.launch"""):
        launched[trace.rank(owner)].append((launch, end))
    owned = {}
    for rank, spans in steps.items():
        found = np.array(launched.get(rank, []), np.int64).reshape(-1, 2)
        windows = owned_step_windows([(start, end) for _, start, end in spans], found[:, 0], found[:, 1])
        owned[rank] = [(name, start, end) for (name, _, _), (start, end) in zip(spans, windows)]
    return owned


def _pp_kind(name: str, rules: LaneRules) -> str:
    """F, B, I, W, SEND, RECV; F+B for a composite `(...)OVERLAP_F_B`; else other (UNSHARD, ...)."""
    if name.endswith(")OVERLAP_F_B"):
        return "F+B"
    match = rules.pp_match(name)
    return _PP_KIND_OF.get(match.group("action"), "other") if match else "other"


def _blocks(trace: _Trace) -> dict[int, dict[str, Intervals]]:
    """The GPU side of PP blocks (`PP:` annotations), per owner and kind, as busy intervals."""
    found: dict[int, dict[str, Intervals]] = defaultdict(lambda: defaultdict(list))
    for name, start, end, owner in trace.rows(f"""
            select s.name, s.ts, s.ts + s.dur, t.owner from slice s join report_track t on t.id = s.track_id
            where s.name glob 'PP:*' and s.dur > 0
              and (s.category in ({sql_list(sorted(trace.rules.annotation_categories))}) or t.annotation)"""):
        found[owner][_pp_kind(name, trace.rules)].append((start, end))
    return {owner: {kind: union(intervals) for kind, intervals in kinds.items()} for owner, kinds in found.items()}


class _Gpu:
    """One GPU's busy intervals per lane group, cut to its window."""

    def __init__(self, trace: _Trace, owner: int, groups: dict[str, Intervals], name: tuple[str, Optional[int]],
                 steps: dict[Rank, list[tuple[str, int, int]]], blocks: dict[str, Intervals]):
        self.owner, self.groups, self.blocks = owner, groups, blocks
        self.name, self.device = name
        self.rank = trace.rank(owner)
        self.lane_groups = [group for group in trace.groups.values() if group.id in groups]
        self.busy = union(interval for intervals in groups.values() for interval in intervals)
        self.steps = steps.get(self.rank, [])
        self.periods = self.steps or [(ACTIVE_SPAN, self.busy[0][0], self.busy[-1][1])]
        self.window = union((start, end) for _, start, end in self.periods)
        self.compute = self._of_kind(LaneKind.COMPUTE)
        self.communication = self._of_kind(LaneKind.COMMUNICATION)
        # Made once: per step, each figure takes its part of these by bisection.
        self.blocks_computing = {kind: intersect(self.blocks.get(kind, []), self.compute) for kind in ("RECV", "SEND")}

    def _of_kind(self, kind: LaneKind) -> Intervals:
        return union(interval for group in self.lane_groups if group.kind is kind for interval in self.groups[group.id])

    def order(self) -> tuple:
        return (self.rank or (-1, -1), self.device if self.device is not None else -1, self.name)

    def within(self, intervals: Intervals) -> int:
        return sum(covered(intervals, self.window))

    def figures(self, counts: dict[tuple[int, str], int]) -> dict[str, Any]:
        window_ns = sum(end - start for start, end in self.window)
        busy, exposed = self.within(self.busy), self.within(subtract(self.communication, self.compute))
        return {
            "gpu": self.name, "device": self.device,
            "pp_rank": self.rank[0] if self.rank else None, "global_rank": self.rank[1] if self.rank else None,
            "rank": rank_title(*self.rank) if self.rank else None,
            "window": "steps" if self.steps else ACTIVE_SPAN,
            "window_start_ns": self.window[0][0], "window_end_ns": self.window[-1][1], "window_ns": window_ns,
            "busy_ns": busy, "busy_share": _share(busy, window_ns),
            "exposed_comm_ns": exposed, "exposed_comm_share": _share(exposed, window_ns),
            "lane_groups": [{"group": group.label, "kind": group.kind.value,
                             "busy_ns": self.within(self.groups[group.id]),
                             "share": _share(self.within(self.groups[group.id]), window_ns),
                             "slices": counts.get((self.owner, group.id), 0)} for group in self.lane_groups],
            "steps": [self._step(*period) for period in self.periods],
        }

    def _step(self, name: str, start: int, end: int) -> dict[str, Any]:
        [compute] = covered(self.compute, [(start, end)])
        row: dict[str, Any] = {"step": name, "start_ns": start, "step_ns": end - start, "compute_busy_ns": compute,
                               "bubble_ns": end - start - compute, "bubble_share": _share(end - start - compute,
                                                                                           end - start)}
        if self.blocks:
            for kind in ("RECV", "SEND"):
                row[f"{kind.lower()}_ns"] = covered(self.blocks.get(kind, []), [(start, end)])[0]
                row[f"{kind.lower()}_compute_ns"] = covered(self.blocks_computing[kind], [(start, end)])[0]
        return row

    def timeline(self, label: str) -> Timeline:
        return Timeline(label, self.periods, self.blocks, subtract(self.window, self.compute),
                        self.rank[0] if self.rank else None)


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def gpu_label(gpu: dict) -> str:
    """A GPU's figures as one label: its name, and its rank named as the UI names it."""
    return gpu["gpu"] + ("" if gpu["rank"] is None else f", {gpu['rank']}")
