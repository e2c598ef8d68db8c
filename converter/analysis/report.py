"""`cgtrace report`: where GPU time goes, from SQL over the trace in trace_processor.

Figures per GPU and lane group (busy time as the union of slice intervals, so overlapping
kernels count once), exposed communication, pipeline-parallel bubbles per PP rank and step,
and the top kernels. In a trace cgtrace compacted, lanes, their groups and kinds and the
ranks of a merge come from the track roles it wrote (the `metadata` entries
"cr-[<k>-]cgtrace_track_roles", see README), never from track names; in any other trace
each GPU slice is grouped by lane rules (`--lanes FILE`, else the built-in ones `cgtrace
compact` uses), so both give the same figures. SQL merges each group's slices into disjoint
busy intervals; the set arithmetic on those (clipping to steps, comm minus compute) is a
linear sweep in Python.
"""

from __future__ import annotations

import html
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson

from ..kineto import KERNEL_CATEGORIES
from ..lane_rules import LaneRules, load_lane_rules
from ..model import LaneGroup, LaneKind
from .query import format_table, open_checked, run_sql

TRACK_ROLES_SQL = "select str_value from metadata where name glob 'cr-*cgtrace_track_roles' order by id"
PP_KINDS = ("F", "B", "I", "W", "F+B", "SEND", "RECV", "other")
_PP_KIND_OF = {"F": "F", "B": "B", "I": "I", "W": "W", "SEND_F": "SEND", "SEND_B": "SEND",
               "RECV_F": "RECV", "RECV_B": "RECV"}

Intervals = list[tuple[int, int]]


# -- interval arithmetic on sorted, disjoint [start, end) lists ----------------------------------
def union(intervals: Iterable[tuple[int, int]]) -> Intervals:
    merged: Intervals = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def subtract(base: Intervals, cut: Intervals) -> Intervals:
    """Parts of `base` that no interval of `cut` covers."""
    out: Intervals = []
    j = 0
    for start, end in base:
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < end:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def covered(intervals: Intervals, windows: Intervals) -> list[int]:
    """For each window, how much of it `intervals` covers."""
    ends = [end for _, end in intervals]
    totals = []
    for window_start, window_end in windows:
        total = 0
        i = bisect_right(ends, window_start)
        while i < len(intervals) and intervals[i][0] < window_end:
            total += min(intervals[i][1], window_end) - max(intervals[i][0], window_start)
            i += 1
        totals.append(total)
    return totals


# -- SQL -----------------------------------------------------------------------------------------
def _literal(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(int(value))


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(map(_literal, values))


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
    from cgtrace_gpu))
group by owner, grp, island order by owner, grp, start"""


Rank = Optional[tuple[int, int]]  # (PP rank, global rank) of a merged trace's part; None for a single trace


@dataclass
class _Roles:
    """What the track roles written by cgtrace say (empty for other traces)."""

    by_uuid: dict[int, dict[str, Any]] = field(default_factory=dict)
    rank_of_uuid: dict[int, Rank] = field(default_factory=dict)
    rank_of_pid: dict[int, Rank] = field(default_factory=dict)
    group_order: dict[str, int] = field(default_factory=dict)  # lane groups as compaction ordered them

    @classmethod
    def read(cls, documents: list[str]) -> "_Roles":
        roles = cls()
        for text in documents:
            document = orjson.loads(text)
            rank = document.get("rank")
            identity = (rank["pp_rank"], rank["global_rank"]) if rank else None
            for role in document["tracks"]:
                roles.by_uuid[role["uuid"]] = role
                if role["role"] == "lane":
                    roles.group_order.setdefault(role["group"], len(roles.group_order))
                roles.rank_of_uuid[role["uuid"]] = identity
            for pid in rank["pids"] if rank else ():
                roles.rank_of_pid[pid] = identity
        return roles


class _Trace:
    """One open trace plus the helper tables the report's queries share."""

    def __init__(self, tp: Any, path: Path, rules: LaneRules):
        self.tp = tp
        self.path = path
        self.rules = rules
        self.track_owners: dict[int, str] = {}   # owner id of a parent track -> its name
        self.owner_ranks: dict[int, Rank] = {}
        self.groups: dict[str, LaneGroup] = {}    # lane group id -> group, in display order

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return run_sql(self.tp, sql, self.path).rows

    def create(self, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
        self.rows(f"create table {table} ({columns})")
        for i in range(0, len(rows), 500):
            self.rows(f"insert into {table} values "
                      + ", ".join("(" + _quoted(row) + ")" for row in rows[i:i + 500]))

    def prepare(self) -> bool:
        """Creates cgtrace_track (owner, lane group, annotation flag per track) and cgtrace_gpu
        (GPU slices with owner and lane group); True when lanes come from track roles.

        An owner is a process (its upid) or, for tracks outside every process, the parent track
        they sit under (-1 - its id): a merged trace groups each rank's GPU lanes under a global
        track named after that rank's GPU process.
        """
        roles = _Roles.read([text for (text,) in self.rows(TRACK_ROLES_SQL)])
        tracks = self.rows("""
            select t.id, t.parent_id, coalesce(t.name, th.name), coalesce(pt.upid, th.upid),
              (select a.int_value from args a where a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id')
            from track t left join thread_track tt using (id) left join thread th using (utid)
            left join process_track pt using (id)""")
        parents = {track_id: parent for track_id, parent, _, _, _ in tracks}
        names = {track_id: name for track_id, _, name, _, _ in tracks}
        own_upid = {track_id: upid for track_id, _, _, upid, _ in tracks}

        def owner(track_id: int) -> Optional[int]:
            ancestor: Optional[int] = track_id
            seen: set[int] = set()
            while ancestor is not None and ancestor not in seen:
                if own_upid.get(ancestor) is not None:
                    return own_upid[ancestor]
                seen.add(ancestor)
                ancestor = parents.get(ancestor)
            return None if parents.get(track_id) is None else -1 - parents[track_id]

        owned = []
        for track_id, _, _, _, uuid in tracks:
            track_owner = owner(track_id)
            if track_owner is None:
                continue
            role = roles.by_uuid.get(uuid, {})
            group = None
            if role.get("role") == "lane":
                group = role["group"]
                self.groups.setdefault(group, LaneGroup(group, role["label"], LaneKind(role["kind"])))
            owned.append((track_id, track_owner, group, int(role.get("role") == "annotations")))
            if track_owner < 0 and uuid in roles.rank_of_uuid:
                self.owner_ranks[track_owner] = roles.rank_of_uuid[uuid]
        self.groups = dict(sorted(self.groups.items(), key=lambda item: roles.group_order[item[0]]))
        self.track_owners = {o: names[-1 - o] for _, o, _, _ in owned if o < 0}
        pids = dict(self.rows("select upid, pid from process"))
        self.owner_ranks.update({upid: roles.rank_of_pid[pid] for upid, pid in pids.items() if pid in roles.rank_of_pid})
        self.create("cgtrace_track", "id integer primary key, owner int, lane text, annotation int", owned)
        if self.groups:
            self.rows("""create table cgtrace_gpu as
                select t.owner, t.lane as grp, s.track_id, s.ts, s.dur, s.name, s.category
                from slice s join cgtrace_track t on t.id = s.track_id where s.dur > 0 and t.lane is not null""")
            return True
        # Not compacted by cgtrace: group each distinct (name, category) by the lane rules.
        rules = self.rules
        self.groups = {group.id: group for group in rules.groups}
        kinds = self.rows(f"""select distinct coalesce(name, ''), category from slice
                              where dur > 0 and category in ({_quoted(sorted(rules.gpu_categories))})""")
        self.create("cgtrace_group", "name text, category text, grp text, primary key (name, category)",
                    [(name, category, rules.group_of(name, category)) for name, category in kinds])
        self.rows("""create table cgtrace_gpu as
            select t.owner, g.grp, s.track_id, s.ts, s.dur, s.name, s.category
            from slice s join cgtrace_track t on t.id = s.track_id
            join cgtrace_group g on g.name = coalesce(s.name, '') and g.category = s.category
            where s.dur > 0""")
        return False

    def owners(self) -> dict[int, tuple[Optional[int], Optional[str], Optional[str]]]:
        """owner -> (pid or None, name, process labels joined by '|')."""
        found = {upid: (pid, name, labels) for upid, pid, name, labels in self.rows("""
            select p.upid, p.pid, p.name, (select group_concat(a.display_value, '|') from args a
              where a.arg_set_id = p.arg_set_id and a.flat_key = 'chrome.process_label')
            from process p""")}
        found.update({owner: (None, name, None) for owner, name in self.track_owners.items()})
        return found

    def rank(self, owner: Optional[int]) -> Rank:
        return None if owner is None else self.owner_ranks.get(owner)


# -- the report ----------------------------------------------------------------------------------
def build_report(path: Path, tp_bin: Optional[str] = None, top: int = 10,
                 lanes_file: Optional[Path] = None) -> dict[str, Any]:
    """All figures as one JSON-ready dict (times in integer ns). `lanes_file`: lane rules for
    traces cgtrace did not compact (default: the built-in rules)."""
    rules = load_lane_rules(lanes_file)
    with open_checked(path, tp_bin) as tp:
        trace = _Trace(tp, path, rules)
        by_roles = trace.prepare()
        owners = trace.owners()
        islands: dict[int, dict[str, Intervals]] = defaultdict(lambda: defaultdict(list))
        for owner, group, start, end in trace.rows(_ISLANDS_SQL):
            islands[owner][group].append((start, end))
        counts = {(owner, group): (slices, tracks) for owner, group, slices, tracks in trace.rows(
            "select owner, grp, count(*), count(distinct track_id) from cgtrace_gpu group by 1, 2")}
        steps = _steps(trace)
        pipeline = _pipeline(trace, steps)
        kernels = trace.rows(f"""
            select name, count(*), sum(dur) as total from cgtrace_gpu
            where category in ({_quoted(KERNEL_CATEGORIES)})
            group by name order by total desc, name limit {max(int(top), 0)}""")
    return {
        "trace": str(path),
        "lanes_from": "track roles" if by_roles else "lane rules on GPU slice names and categories",
        "gpus": _gpus(trace, islands, counts, owners, steps),
        "pipeline": pipeline,
        "top_kernels": [{"name": name, "count": count, "total_ns": total, "mean_ns": total / count}
                        for name, count, total in kernels],
    }


def _steps(trace: _Trace) -> dict[Rank, list[tuple[str, int, int]]]:
    """ProfilerStep#N spans on the CPU side, per rank: {rank: [(name, start, end)] by start}."""
    spans: dict[tuple[Rank, str], tuple[int, int]] = {}
    for name, start, end, owner in trace.rows(f"""
            select s.name, s.ts, s.ts + s.dur, t.owner from slice s left join cgtrace_track t on t.id = s.track_id
            where s.name glob 'ProfilerStep#*' and s.dur > 0
              and coalesce(s.category, '') not in ({_quoted(sorted(trace.rules.annotation_categories))})
              and coalesce(t.annotation, 0) = 0
              and (t.owner is null or t.owner not in (select distinct owner from cgtrace_gpu))"""):
        key = (trace.rank(owner), name)
        known = spans.get(key)
        spans[key] = (min(start, known[0]), max(end, known[1])) if known else (start, end)
    by_rank: dict[Rank, list[tuple[str, int, int]]] = defaultdict(list)
    for (rank, name), (start, end) in spans.items():
        by_rank[rank].append((name, start, end))
    return {rank: sorted(items, key=lambda item: item[1]) for rank, items in by_rank.items()}


def _gpu_name(pid: Optional[int], name: Optional[str], labels: Optional[str]) -> str:
    """The process name when it says GPU (merged traces), else Kineto's "GPU n" label, else
    the name and pid (a raw JSON trace keeps no labels; Kineto's GPU pid is the device)."""
    gpu_label = next((label for label in (labels or "").split("|") if label.startswith("GPU")), None)
    if name and "GPU" in name:
        return name
    if gpu_label:
        return gpu_label
    return f"{name or 'process'} (pid {pid})" if pid is not None else name or "unnamed"


def _gpus(trace: _Trace, islands: dict[int, dict[str, Intervals]], counts: dict[tuple[int, str], tuple[int, int]],
          owners: dict[int, tuple[Optional[int], Optional[str], Optional[str]]],
          steps: dict[Rank, list[tuple[str, int, int]]]) -> list[dict[str, Any]]:
    names = {owner: _gpu_name(*owners[owner]) for owner in islands}
    repeated = {name for name, n in Counter(names.values()).items() if n > 1}
    compute = [group.id for group in trace.groups.values() if group.kind is LaneKind.COMPUTE]
    communication = [group.id for group in trace.groups.values() if group.kind is LaneKind.COMMUNICATION]
    gpus = []
    for owner in sorted(islands, key=lambda o: (names[o], str(owners[o][0]))):
        groups = islands[owner]
        pid = owners[owner][0]
        rank = trace.rank(owner)
        all_busy = union(interval for intervals in groups.values() for interval in intervals)
        rank_steps = steps.get(rank, [])
        window = union((start, end) for _, start, end in rank_steps) or [(all_busy[0][0], all_busy[-1][1])]
        window_ns = sum(end - start for start, end in window)
        busy_communication = union(interval for group in communication for interval in groups.get(group, ()))
        busy_compute = union(interval for group in compute for interval in groups.get(group, ()))
        exposed = sum(covered(subtract(busy_communication, busy_compute), window))
        busy = sum(covered(all_busy, window))
        lane_groups = []
        for group in trace.groups.values():
            if group.id in groups:
                group_busy = sum(covered(groups[group.id], window))
                slices, tracks = counts[(owner, group.id)]
                lane_groups.append({"group": group.label, "kind": group.kind.value, "busy_ns": group_busy,
                                    "share": _share(group_busy, window_ns), "slices": slices, "tracks": tracks})
        gpus.append({
            "gpu": names[owner] + (f" (pid {pid})" if names[owner] in repeated else ""),
            "pid": pid, "pp_rank": rank[0] if rank else None, "global_rank": rank[1] if rank else None,
            "window": "steps" if rank_steps else "active span", "steps": len(rank_steps),
            "window_ns": window_ns, "busy_ns": busy, "busy_share": _share(busy, window_ns),
            "exposed_comm_ns": exposed, "exposed_comm_share": _share(exposed, window_ns),
            "lane_groups": lane_groups,
        })
    return gpus


def _pp_kind(name: str, rules: LaneRules) -> str:
    """F, B, I, W, SEND, RECV; F+B for a composite `(...)OVERLAP_F_B`; else other (UNSHARD, ...)."""
    if name.endswith(")OVERLAP_F_B"):
        return "F+B"
    match = rules.pp_match(name)
    return _PP_KIND_OF.get(match.group("action"), "other") if match else "other"


def _pipeline(trace: _Trace, steps: dict[Rank, list[tuple[str, int, int]]]) -> list[dict[str, Any]]:
    """Per PP rank and step: time in each kind of PP block, and the idle rest (the bubble)."""
    blocks: dict[Rank, dict[str, Intervals]] = defaultdict(lambda: defaultdict(list))
    for name, start, end, owner in trace.rows(f"""
            select s.name, s.ts, s.ts + s.dur, t.owner from slice s join cgtrace_track t on t.id = s.track_id
            where s.name glob 'PP:*' and s.dur > 0
              and (s.category in ({_quoted(sorted(trace.rules.annotation_categories))}) or t.annotation)"""):
        blocks[trace.rank(owner)][_pp_kind(name, trace.rules)].append((start, end))
    rows = []
    for rank in sorted(blocks, key=lambda r: r or (-1, -1)):
        kinds = {kind: union(intervals) for kind, intervals in blocks[rank].items()}
        every = union(interval for intervals in kinds.values() for interval in intervals)
        periods = steps.get(rank) or [("whole trace", every[0][0], every[-1][1])]
        windows = [(start, end) for _, start, end in periods]
        per_kind = {kind: covered(kinds.get(kind, []), windows) for kind in PP_KINDS}
        busy = covered(every, windows)
        for i, (step, start, end) in enumerate(periods):
            step_ns = end - start
            rows.append({
                "pp_rank": rank[0] if rank else None, "global_rank": rank[1] if rank else None,
                "step": step, "step_ns": step_ns,
                "time_ns": {kind: per_kind[kind][i] for kind in PP_KINDS},
                "pp_busy_ns": busy[i], "idle_ns": step_ns - busy[i],
                "bubble_fraction": _share(step_ns - busy[i], step_ns),
            })
    return rows


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


# -- output --------------------------------------------------------------------------------------
def render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    return render_html(report) if fmt == "html" else render_text(report)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _tables(report: dict) -> list[tuple[str, list[str], list[list[str]], list[int]]]:
    """(title, columns, rows of display text, numeric column indexes) for both text and HTML."""
    lanes = [[gpu["gpu"], lane["group"], _ms(lane["busy_ns"]), _pct(lane["share"]), str(lane["slices"]),
              str(lane["tracks"])] for gpu in report["gpus"] for lane in gpu["lane_groups"]]
    gpus = [[gpu["gpu"], f"{gpu['window']} ({gpu['steps']})" if gpu["steps"] else gpu["window"],
             _ms(gpu["window_ns"]), _ms(gpu["busy_ns"]), _pct(gpu["busy_share"]),
             _ms(gpu["exposed_comm_ns"]), _pct(gpu["exposed_comm_share"])] for gpu in report["gpus"]]
    tables = [
        ("GPUs: busy time (any lane) and exposed communication (an NCCL lane busy, no compute lane)",
         ["gpu", "window", "window ms", "busy ms", "busy", "exposed comm ms", "exposed"], gpus, [2, 3, 4, 5, 6]),
        ("Lane groups: busy time is the union of slice intervals, share is of the window",
         ["gpu", "lane group", "busy ms", "share", "slices", "tracks"], lanes, [2, 3, 4, 5]),
    ]
    if report["pipeline"]:
        pipeline = [[_rank_text(row), row["step"], _ms(row["step_ns"])]
                    + [_ms(row["time_ns"][kind]) for kind in PP_KINDS]
                    + [_ms(row["idle_ns"]), _pct(row["bubble_fraction"])] for row in report["pipeline"]]
        tables.append(("Pipeline: time in PP blocks per rank and step; idle is the step outside every block",
                       ["rank", "step", "step ms"] + [f"{kind} ms" for kind in PP_KINDS] + ["idle ms", "bubble"],
                       pipeline, list(range(2, 5 + len(PP_KINDS)))))
    kernels = [[_short(k["name"]), str(k["count"]), _ms(k["total_ns"]), f"{k['mean_ns'] / 1e3:.3f}"]
               for k in report["top_kernels"]]
    tables.append(("Top kernels by total time", ["kernel", "count", "total ms", "mean us"], kernels, [1, 2, 3]))
    return tables


def _short(name: str, limit: int = 100) -> str:
    """Templated kernel names run to hundreds of characters; tables show the head (JSON keeps all)."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _rank_text(row: dict) -> str:
    return "-" if row["pp_rank"] is None else f"PP {row['pp_rank']} (global {row['global_rank']})"


def render_text(report: dict) -> str:
    parts = [f"cgtrace report: {report['trace']} (lanes from {report['lanes_from']})\n"]
    if not report["gpus"]:
        parts.append("\nNo GPU slices found.\n")
    for title, columns, rows, numeric in _tables(report):
        if rows:
            parts.append(f"\n{title}\n" + format_table(columns, rows, numeric))
    return "".join(parts)


_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:80em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}th,td{padding:2px 10px;border-bottom:1px solid #ddd;text-align:left}
.n{text-align:right;font-variant-numeric:tabular-nums}svg text{font:12px system-ui,sans-serif}
.bar{fill:#4a7bd0}.rest{fill:#e8e8e8}.note{color:#666}"""


def _bars(items: list[tuple[str, float, str]]) -> str:
    """Inline SVG: one horizontal bar per (label, fraction 0..1, value text)."""
    label_width, bar_width, row = 330, 360, 20
    shapes = []
    for i, (label, fraction, text) in enumerate(items):
        y = i * row
        width = max(0.0, min(1.0, fraction)) * bar_width
        shapes.append(
            f'<text x="{label_width - 8}" y="{y + 14}" text-anchor="end">{html.escape(_short(label, 44))}</text>'
            f'<rect class="rest" x="{label_width}" y="{y + 3}" width="{bar_width}" height="{row - 6}"/>'
            f'<rect class="bar" x="{label_width}" y="{y + 3}" width="{width:.1f}" height="{row - 6}"/>'
            f'<text x="{label_width + bar_width + 8}" y="{y + 14}">{html.escape(text)}</text>')
    return (f'<svg width="{label_width + bar_width + 120}" height="{len(items) * row}" role="img">'
            + "".join(shapes) + "</svg>")


def _charts(report: dict) -> list[str]:
    """Bar charts in the order of _tables: GPUs, lane groups, pipeline, kernels."""
    gpus = _bars([(f"{g['gpu']} busy", g["busy_share"], _pct(g["busy_share"])) for g in report["gpus"]]
                 + [(f"{g['gpu']} exposed comm", g["exposed_comm_share"], _pct(g["exposed_comm_share"]))
                    for g in report["gpus"]])
    lanes = _bars([(f"{g['gpu']} {lane['group']}", lane["share"], _pct(lane["share"]))
                   for g in report["gpus"] for lane in g["lane_groups"]])
    charts = [gpus, lanes]
    if report["pipeline"]:
        charts.append(_bars([(("" if row["pp_rank"] is None else f"PP {row['pp_rank']} ") + row["step"],
                              row["bubble_fraction"], f"{_pct(row['bubble_fraction'])} bubble")
                             for row in report["pipeline"]]))
    longest = max((k["total_ns"] for k in report["top_kernels"]), default=0) or 1
    charts.append(_bars([(k["name"], k["total_ns"] / longest, f"{_ms(k['total_ns'])} ms")
                         for k in report["top_kernels"]]))
    return charts


def _html_row(tag: str, values: list[str], numeric: list[int]) -> str:
    return "<tr>" + "".join(f"<{tag}{' class=n' if i in numeric else ''}>{html.escape(v)}</{tag}>"
                            for i, v in enumerate(values)) + "</tr>"


def render_html(report: dict) -> str:
    """One self-contained page (inline CSS and SVG, no scripts, no external URLs)."""
    title = html.escape(f"cgtrace report: {Path(report['trace']).name}")
    body = [f"<h1>{title}</h1>",
            f"<p class=note>{html.escape(report['trace'])}; lanes from {html.escape(report['lanes_from'])}</p>"]
    if not report["gpus"]:
        body.append("<p>No GPU slices found.</p>")
    for (heading, columns, rows, numeric), chart in zip(_tables(report), _charts(report)):
        if not rows:
            continue
        lines = [_html_row("th", columns, numeric)] + [_html_row("td", row, numeric) for row in rows]
        body.append(f"<h2>{html.escape(heading)}</h2>{chart}<table>{''.join(lines)}</table>")
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")
