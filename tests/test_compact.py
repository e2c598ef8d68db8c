"""Compaction, checked through trace_processor: lanes, order, losslessness, flows, PP arrows."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from converter.generator import GeneratorConfig, pipeline_schedule, write_trace
from converter.lane_rules import load_lane_rules
from .helpers import compact_file, write_json

from .helpers import UNDER_GPU_SQL, problem_stats, rows, shared_trace_param, shared_trace_paths, track_roles
from .oracle import expected_from, load_events
from .test_convert_roundtrip import actual_flows, actual_slices

RULES = load_lane_rules()
ANNOTATION_CATEGORIES = ("gpu_user_annotation", "cuda_graph_label")
PP_NAME = re.compile(r"^PP:(\d+)([A-Z_]+?)(\d*)$")
# A GPU's lanes and annotation rows: its rows that hold slices, not its memory counters.
LANE_SQL = f"""{UNDER_GPU_SQL}
    select t.id, t.name, u.gpu, extract_arg(t.source_arg_set_id, 'sibling_order_rank') rank
    from track t join under_gpu u using (id) where t.type not glob '*counter*'"""


def compact(tmp_path: Path, source: Path, **options) -> tuple[Path, dict]:
    output = tmp_path / "compacted.perfetto-trace"
    return output, compact_file(source, output, **options)


def lane_name_parts(name: str) -> tuple[str, int, bool]:
    """'Compute 2 annotations 3' -> ('Compute', 2, True)."""
    match = re.match(r"^(.*?)(?: (\d+))?( annotations(?: \d+)?)?$", name)
    return match.group(1), int(match.group(2) or 1), bool(match.group(3))


def max_concurrency(intervals: list[tuple[int, int]]) -> int:
    """Most intervals running at once; touching ones do not overlap."""
    points = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    running = best = 0
    for _, delta in points:
        running += delta
        best = max(best, running)
    return best


def expected_lane_counts(source: Path) -> Counter:
    """Per (GPU pid, group label): the most slices of that group running at once, from the input."""
    _, events = load_events(source)
    intervals = defaultdict(list)
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") in RULES.gpu_categories:
            start = int(event["ts"] * 1000)
            group = RULES.label(RULES.group_of(event["name"], event["cat"]))
            intervals[(event["pid"], group)].append((start, start + int(event["dur"] * 1000)))
    return Counter({key: max_concurrency(spans) for key, spans in intervals.items()})


def assert_compacted_correctly(source: Path, output: Path, summary: dict) -> None:
    assert problem_stats(output) == []
    # Measured slices: the same multiset of (name, ts, dur, args) as the input.
    expected = expected_from(source, skip_categories=ANNOTATION_CATEGORIES)
    _, with_args = actual_slices(output, skip_categories=ANNOTATION_CATEGORIES)
    assert with_args == expected.slice_args

    lanes = rows(output, LANE_SQL)
    lane_ids = {lane["id"] for lane in lanes if not lane_name_parts(lane["name"])[2]}
    # No slice on a lane overlaps or nests in another.
    bad = rows(output, f"""
        select count(*) n from (
          select track_id, ts, dur, depth,
                 lead(ts) over (partition by track_id order by ts) next_ts
          from slice where track_id in ({','.join(map(str, lane_ids)) or -1}))
        where depth > 0 or next_ts < ts + dur""")
    assert bad[0]["n"] == 0
    # The lane count per (GPU, group) is the optimum: the most slices running at once.
    lane_counts = Counter()
    for lane in lanes:
        group, _, is_annotation = lane_name_parts(lane["name"])
        if not is_annotation:
            lane_counts[group] += 1
    expected_counts = Counter()
    for (_, group), count in expected_lane_counts(source).items():
        expected_counts[group] += count
    assert lane_counts == expected_counts
    assert summary["lanes_by_group"] == dict(expected_counts)
    assert_lane_order(output)

    # CPU->GPU flows join the same launch/kernel pairs as in the input; PP arrows are extra.
    flows = actual_flows(output)
    pp_flows = Counter({k: n for k, n in flows.items() if PP_NAME.match(k[0]) and PP_NAME.match(k[2])})
    assert flows - pp_flows == expected.flows
    assert_pp_arrows_are_sound(output)


def assert_lane_order(output: Path) -> None:
    """Within each GPU, as the UI orders them (its own SQL module): groups in rule order, lanes by
    number, annotation rows right above their lane. A row folded under a lane (shown a click
    away) is one of the group's further lanes, under its first, or an annotation row of that
    lane, read as if above it."""
    ordered = rows(output, f"""
        include perfetto module viz.summary.track_event;
        {UNDER_GPU_SQL}
        select u.id, g.name, g.parent_id parent, u.gpu from _track_event_tracks_ordered_groups g
        join under_gpu u on u.id = cast(g.track_ids as int) join track t on t.id = u.id
        where t.type not glob '*counter*' order by g.order_id""")  # lanes, not the memory counters
    children = defaultdict(list)
    for row in ordered:
        children[row["parent"]].append(row)

    def shown(parent: int) -> list[str]:
        """The rows under `parent`, in display order, a lane's own annotation rows before it."""
        names = []
        for row in children[parent]:
            folded = children[row["id"]]
            own = [c for c in folded if lane_name_parts(c["name"])[2] and
                   lane_name_parts(c["name"])[:2] == lane_name_parts(row["name"])[:2]]
            further = [c for c in folded if c not in own]
            assert all(lane_name_parts(c["name"])[0] == lane_name_parts(row["name"])[0] for c in further)
            assert not further or lane_name_parts(row["name"])[1:] == (1, False)  # under the group's first lane
            names += [c["name"] for c in own] + [row["name"]] + shown_rows(further)
        return names

    def shown_rows(rows_: list[dict]) -> list[str]:
        names = []
        for row in rows_:
            names += [c["name"] for c in children[row["id"]]] + [row["name"]]
        return names

    group_rank = {group.label: index for index, group in enumerate(RULES.groups)}
    for gpu in {row["gpu"] for row in ordered}:
        names = shown(gpu)
        keys = []
        for position, name in enumerate(names):
            group, number, is_annotation = lane_name_parts(name)
            keys.append((group_rank[group], number, 0 if is_annotation else 1))
            if is_annotation:
                lane_below = next(n for n in names[position:] if not lane_name_parts(n)[2])
                assert lane_name_parts(lane_below)[:2] == (group, number)
        assert keys == sorted(keys)


def assert_pp_arrows_are_sound(output: Path) -> None:
    arrows = rows(output, """
        select so.name sn, so.ts sts, so.dur sdur, si.name dn, si.ts dts from flow f
        join cgtrace_all_slice so on f.slice_out = so.id join cgtrace_all_slice si on f.slice_in = si.id
        where so.name glob 'PP:*' and si.name glob 'PP:*'""")
    for arrow in arrows:
        source, target = PP_NAME.match(arrow["sn"]), PP_NAME.match(arrow["dn"])
        assert arrow["sts"] <= arrow["dts"]
        assert source.group(1) == target.group(1)  # same stage
        kinds = (source.group(2), target.group(2))
        assert kinds in {("RECV_F", "F"), ("F", "SEND_F"), ("RECV_B", "B"), ("B", "SEND_B"),
                         ("RECV_B", "I"), ("I", "SEND_B")} or kinds[0] == "UNSHARD" and kinds[1] in "FBIW"
        if kinds[0] != "UNSHARD":
            assert source.group(3) == target.group(3)  # same microbatch


def expected_pp_pairs(schedule: str, pp_size: int, pp_rank: int, microbatches: int, steps: int,
                      stages_per_rank: int = 1) -> tuple[int, int]:
    actions = pipeline_schedule(schedule, pp_size, microbatches, stages_per_rank)[pp_rank]
    kinds = Counter(PP_NAME.match("PP:" + action).group(2) for action in actions)
    compute_pairs = sum(kinds[k] for k in ("RECV_F", "SEND_F", "RECV_B", "SEND_B"))
    return compute_pairs * steps, kinds["UNSHARD"] * steps


@pytest.mark.parametrize("schedule,pp_rank,stages_per_rank", [
    ("1f1b", 1, 1), ("interleaved", 0, 2), ("zero_bubble", 2, 1)])
def test_generated_pp_trace_with_gap_split_annotations(tmp_path, schedule, pp_rank, stages_per_rank):
    config = GeneratorConfig(seed=3, steps=2, pp_size=4, pp_rank=pp_rank, world_size=4, rank=pp_rank,
                             schedule=schedule, microbatches=4, stages_per_rank=stages_per_rank,
                             annotation_gaps=True, graphs_per_step=8, kernels_per_replay=16)
    source = write_trace(config, tmp_path / "trace.json")
    output, summary = compact(tmp_path, source)
    pairs, unshard = expected_pp_pairs(schedule, 4, pp_rank, 4, 2, stages_per_rank)
    assert (summary["pp_compute_dependency_pairs"], summary["pp_compute_dependency_unmatched"]) == (pairs, 0)
    assert (summary["pp_unshard_compute_pairs"], summary["pp_unshard_compute_unmatched"]) == (unshard, 0)
    assert summary["pp_rank"] == pp_rank and summary["pp_rank_source"] == "distributedInfo.pg_config"
    assert summary["gpu_annotations_mapped"] > 0 and summary["gpu_annotations_coalesced"] > 0
    assert summary["original_streams"] > summary["compacted_lanes"]
    pp_arrows = rows(output, """select count(*) n from flow f join cgtrace_all_slice so on f.slice_out = so.id
                                join cgtrace_all_slice si on f.slice_in = si.id
                                where so.name glob 'PP:*' and si.name glob 'PP:*'""")[0]["n"]
    assert pp_arrows == pairs + unshard
    assert_compacted_correctly(source, output, summary)


def test_step_numbers_that_come_back_keep_each_copys_blocks_apart(tmp_path):
    """A trace tiled in time (or a profiler restarted) repeats its ProfilerStep numbers: a block
    is keyed by step and run, so each copy's runs of an action must stay runs of their own."""
    config = GeneratorConfig(seed=3, steps=2, pp_size=4, pp_rank=1, world_size=4, rank=1, schedule="1f1b",
                             microbatches=4, graphs_per_step=8, kernels_per_replay=16)
    document = json.loads(write_trace(config, tmp_path / "trace.json").read_text())
    events = document["traceEvents"]
    span = max(e["ts"] + e.get("dur", 0) for e in events if e.get("ph") != "M") + 1000
    again = [{**e, "ts": e["ts"] + span} for e in events if e.get("ph") != "M"]
    source = write_json(tmp_path / "tiled.json", {**document, "traceEvents": events + again})
    output, summary = compact(tmp_path, source)
    pairs, unshard = expected_pp_pairs("1f1b", 4, 1, 4, 2)
    assert (summary["pp_compute_dependency_pairs"], summary["pp_unshard_compute_pairs"]) == (2 * pairs, 2 * unshard)
    arrows = rows(output, """select so.ts sts, si.ts dts from flow f join cgtrace_all_slice so on f.slice_out = so.id
                             join cgtrace_all_slice si on f.slice_in = si.id where so.name glob 'PP:*' and si.name glob 'PP:*'""")
    second_copy_ns = int(document.get("baseTimeNanoseconds", 0)) + span * 1000  # JSON times are in us
    first_copy = Counter((a["sts"] < second_copy_ns, a["dts"] < second_copy_ns) for a in arrows)
    assert first_copy == {(True, True): pairs + unshard, (False, False): pairs + unshard}
    assert_pp_arrows_are_sound(output)


def test_kernel_labels_become_spans_over_runs(tmp_path):
    source = tmp_path / "labels.json"
    kernels = [("a", 0, "L1"), ("b", 10, "L1"), ("c", 20, "L2"), ("d", 30, None), ("e", 40, "L1")]
    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7 + i, "ts": ts, "dur": 5,
               "args": {"stream": 7 + i, **({"name": label} if label else {})}}
              for i, (name, ts, label) in enumerate(kernels)]
    source.write_text(json.dumps({"traceEvents": events}))
    output, summary = compact(tmp_path, source)
    spans = rows(output, "select name, ts, dur from cgtrace_derived_slice where category = 'cuda_graph_label' order by ts")
    assert spans == [{"name": "L1", "ts": 0, "dur": 15000}, {"name": "L2", "ts": 20000, "dur": 5000},
                     {"name": "L1", "ts": 40000, "dur": 5000}]
    assert (summary["kernel_annotations_converted"], summary["kernel_annotation_blocks"]) == (4, 3)
    assert summary["original_streams"] == 5 and summary["compacted_lanes"] == 1
    kept = rows(output, "select count(*) n from args where key = 'debug.args.name'")[0]["n"]
    assert kept == 4  # the kernels keep args.name


TRACK_UUID = "(select a.int_value from args a where a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id')"


def test_label_spans_stay_within_one_replay_and_one_step(tmp_path):
    config = GeneratorConfig(seed=5, steps=3, graphs_per_step=6, kernels_per_replay=32, graphs_per_action=2)
    output, summary = compact(tmp_path, write_trace(config, tmp_path / "labels.json"))
    assert summary["kernel_annotation_blocks"] > 0
    roles = {r.uuid: r for r in track_roles(output)}
    spans = rows(output, f"""select s.ts, s.dur, {TRACK_UUID} uuid from slice s join track t on t.id = s.track_id
                             where s.category = 'cuda_graph_label'""")
    kernels = defaultdict(list)  # lane uuid -> (ts, end, launch)
    for k in rows(output, f"""select s.ts, s.dur, {TRACK_UUID} uuid, f.slice_out launch from slice s
                              join track t on t.id = s.track_id left join flow f on f.slice_in = s.id
                              where s.category in ('kernel', 'gpu_memcpy', 'gpu_memset')"""):
        kernels[k["uuid"]].append((k["ts"], k["ts"] + k["dur"], k["launch"]))
    steps = sorted(r["ts"] for r in rows(output, "select ts from slice where name glob 'ProfilerStep#*' "
                                                "and category != 'gpu_user_annotation'"))
    assert len(steps) == 3
    for span in spans:
        lane = roles[span["uuid"]].home
        inside = [k for k in kernels[lane] if span["ts"] <= k[0] and k[1] <= span["ts"] + span["dur"]]
        assert inside and len({launch for _, _, launch in inside}) == 1  # one replay
        assert len({sum(step <= ts for step in steps) for ts, _, _ in inside}) == 1  # one step


def test_identical_overlapping_annotations_merge(tmp_path):
    source = tmp_path / "annotations.json"
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": 10},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 8, "ts": 5, "dur": 10}]
    events += [{"ph": "X", "cat": "gpu_user_annotation", "name": "region", "pid": 0, "tid": tid,
                "ts": ts, "dur": 10} for tid, ts in ((7, 0), (8, 5))]
    source.write_text(json.dumps({"traceEvents": events}))
    output, summary = compact(tmp_path, source)
    assert summary["lanes_by_group"] == {"Compute": 2}
    regions = rows(output, "select name, ts, dur from slice where category = 'gpu_user_annotation'")
    assert len(regions) == 2  # on different lanes: not merged
    assert summary["gpu_annotations_coalesced"] == 0


@pytest.mark.parametrize("source", [shared_trace_param(p) for p in shared_trace_paths()])
def test_real_traces_compact(tmp_path, source):
    output, summary = compact(tmp_path, source, args_strategy="helper")  # as the command line runs it
    assert_compacted_correctly(source, output, summary)


def test_json_format_loads_losslessly(tmp_path):
    config = GeneratorConfig(seed=4, steps=2, pp_size=2, pp_rank=1, world_size=2, rank=1, microbatches=2,
                             annotation_gaps=True, graphs_per_step=6, kernels_per_replay=12)
    source = write_trace(config, tmp_path / "trace.json")
    output = tmp_path / "compacted.json"
    summary = compact_file(source, output, output_format="json")
    assert problem_stats(output) == []
    base = summary["json_base_time_ns"]
    measured = Counter((r["name"], r["ts"] + base, r["dur"]) for r in rows(output, f"""
        select name, ts, dur from slice where coalesce(category, "") not in {ANNOTATION_CATEGORIES}"""))
    assert measured == expected_from(source, skip_categories=ANNOTATION_CATEGORIES).slices
    lanes = rows(output, """
        select count(*) n from (select s.ts, s.dur, s.depth,
               lead(s.ts) over (partition by s.track_id order by s.ts) next_ts
          from slice s join thread_track t on s.track_id = t.id join thread using (utid)
          where thread.name in ('Compute', 'Compute 2', 'Compute 3', 'NCCL other', 'NCCL all-gather'))
        where depth > 0 or next_ts < ts + dur""")
    assert lanes[0]["n"] == 0
    lane_threads = {r["name"] for r in rows(output, "select name from thread")}
    assert {"Compute", "Compute annotations"} <= lane_threads
    flows = rows(output, "select count(*) n from flow")[0]["n"]
    assert flows == summary["flows"]


@pytest.mark.parametrize("fault", ["changed_duration", "overlapping_lane"])
def test_self_check_refuses_to_write_a_wrong_trace(tmp_path, monkeypatch, fault):
    import converter.engine.compaction as compaction
    from converter.errors import CgtraceError

    honest = compaction.partition_intervals

    def faulty(table, rows):
        lanes = honest(table, rows)
        if fault == "changed_duration":
            first = int(lanes[0][0])
            table.set_duration(first, int(table.dur[first]) + 1)
            return lanes
        return [np.concatenate(lanes)]

    monkeypatch.setattr(compaction, "partition_intervals", faulty)
    source = write_trace(GeneratorConfig(seed=1, steps=1, graphs_per_step=4, kernels_per_replay=16,
                                         parallel_branch_fraction=0.6), tmp_path / "trace.json")
    output = tmp_path / "out.perfetto-trace"
    with pytest.raises(CgtraceError, match="self-check failed"):
        compact_file(source, output)
    assert not output.exists() and list(tmp_path.iterdir()) == [source]
