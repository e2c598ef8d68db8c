"""Merging PP rank traces, checked by SQL over trace_processor's flow, slice, track and process tables."""

from __future__ import annotations

import gzip
import importlib
import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from converter.outputs.args_accelerator import BackgroundArgsEncoder, EncodedArgs
from converter.generator import pipeline_schedule, write_pp_run
from converter.engine.placement import PIPELINE_ROOT_NAME, RANKS_ROOT_NAME
from converter.engine.critical_path import GROUP_NAME as CRITICAL_PATH_GROUP
from converter.model import LaneKind, TrackRole

from .helpers import merge_files as merge_ranks
from converter.inputs.source import json_size
from converter.tuning import Tuning

MERGE_MODULE = importlib.import_module("converter.jobs.merge")  # `converter.jobs.merge` is also a function

from .helpers import (LANE_CONTAINERS_SQL, SHARED_TRACES, UNDER_GPU_SQL, problem_stats, require_shared_traces, rows,
                      track_roles)
from .test_convert_roundtrip import actual_slices

RANK = re.compile(r"^(?:PP )?rank (\d+) \(global (\d+)\)")
# Each track's rank row: itself or the row above it titled after a rank (a GPU's lanes may sit
# under one of its lanes, folded).
RANK_ROWS_SQL = """
    with recursive up(track_id, ancestor, name) as (
        select id, parent_id, name from track
        union all
        select up.track_id, t.parent_id, t.name from up join track t on t.id = up.ancestor)
    , rank_rows as (select track_id, min(name) name from up where name glob '*rank * (global *)*' group by track_id)"""
ARROWS_SQL = RANK_ROWS_SQL + """
    select so.name src, si.name dst, so.ts sts, so.dur sdur, si.ts dts, si.dur ddur, si.category dcat,
           rs.name src_rank, rd.name dst_rank,
           (select r.name from slice r where r.track_id = si.track_id and r.name glob 'PP:*RECV*'
              and r.ts <= si.ts and si.ts <= r.ts + r.dur order by r.ts desc limit 1) dst_receive
    from flow f
    join cgtrace_all_slice so on f.slice_out = so.id join cgtrace_all_slice si on f.slice_in = si.id
    left join rank_rows rs on rs.track_id = so.track_id left join rank_rows rd on rd.track_id = si.track_id
    where so.name glob 'PP:*' and (si.name glob 'PP:*' or si.name glob 'arrival of PP:*')"""


def merge(tmp_path, files, **options):
    output = tmp_path / "merged.perfetto-trace"
    summary = merge_ranks(files, lambda group, groups: tmp_path / f"merged{group}.perfetto-trace"
                          if groups > 1 else output, jobs=2, **options)
    return output, summary


def expected_counts(schedule: str, pp_size: int, microbatches: int, steps: int) -> dict:
    plan = pipeline_schedule(schedule, pp_size, microbatches)
    kinds = Counter(re.match(r"\d+([A-Z_]+?)\d*$", action).group(1)
                    for actions in plan.values() for action in actions)
    return {"send_recv": (kinds["SEND_F"] + kinds["SEND_B"]) * steps,
            "compute": (kinds["SEND_F"] + kinds["SEND_B"] + kinds["RECV_F"] + kinds["RECV_B"]) * steps,
            "unshard": kinds["UNSHARD"] * steps}


def classify_arrows(output) -> Counter:
    kinds = Counter()
    for arrow in rows(output, ARROWS_SQL):
        assert arrow["sts"] <= arrow["dts"]
        same_rank = RANK.match(arrow["src_rank"]).group(1) == RANK.match(arrow["dst_rank"]).group(1)
        source = re.match(r"PP:(\d+)([A-Z_]+?)(\d*)$", arrow["src"]).group(2)
        if not same_rank:
            # A send's arrow leaves its end and lands on a zero-duration arrival marker named
            # after it, on its receive's row: at the receive's start, or at the send's end where
            # the receive (an NCCL kernel waiting for its peer) began earlier.
            assert source.startswith("SEND") and arrow["dst"].startswith(f"arrival of {arrow['src']} from rank ")
            assert (arrow["dcat"], arrow["ddur"]) == ("pp_p2p", 0) and arrow["dts"] >= arrow["sts"] + arrow["sdur"]
            if arrow["dst_receive"] is not None:  # at the receive's start; after the send's end it may lie past it
                assert re.match(r"PP:\d+([A-Z_]+?)\d*$", arrow["dst_receive"]).group(1) == "RECV" + source[4:]
            kinds["send_recv"] += 1
        elif source == "UNSHARD":
            kinds["unshard"] += 1
        else:
            kinds["compute"] += 1
    return kinds


TRACK_UUID = "(select a.int_value from args a where a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id')"


def assert_root_counts_busy_gpus(output, root: str) -> None:
    """The root row's counter is, at each of its samples, the percentage of GPUs with a slice
    running on a compute lane (by its lane group's kind in the track roles), counted from the
    slices, not the GPUs' counters."""
    compute = ",".join(str(r.uuid) for r in track_roles(output)
                       if r.role is TrackRole.LANE and r.kind is LaneKind.COMPUTE)
    checked = rows(output, f"""
        {UNDER_GPU_SQL}, lanes as (select u.id, u.gpu from under_gpu u join track t on t.id = u.id
                                   where {TRACK_UUID} in ({compute})),
        busy as (select s.ts, s.ts + s.dur as end_ts, l.gpu from cgtrace_all_slice s join lanes l on s.track_id = l.id
                 where s.dur > 0)
        select c.ts, c.value, (select count(distinct b.gpu) from busy b where b.ts <= c.ts and c.ts < b.end_ts) gpus,
               (select count(*) from ({LANE_CONTAINERS_SQL})) of
        from counter c join track t on c.track_id = t.id where t.name = '{root}' order by c.ts""")
    assert checked and max(row["gpus"] for row in checked) > 1
    assert [row["value"] for row in checked] == [100 * row["gpus"] / row["of"] for row in checked]
    assert checked[-1]["value"] == 0   # idle after the last kernel


def assert_ranks_named_and_ordered(output, pp_size: int, pp_group: bool = True) -> None:
    """Rows named "PP rank N (global G) · ...", or "rank N (...)" where no PP group orders the
    ranks, all under the root in that order: no rank row is a process's or thread's, whose
    groups v52 orders by slice count."""
    named = "PP rank *" if pp_group else "rank *"
    processes = rows(output, f"select name from track where name glob '{named}'")
    assert {int(RANK.match(p["name"]).group(1)) for p in processes} == set(range(pp_size))
    shown = rows(output, f"""
        include perfetto module viz.summary.track_event;
        select g.name from _track_event_tracks_ordered_groups g join track p on g.parent_id = p.id
        where p.name = '{PIPELINE_ROOT_NAME if pp_group else RANKS_ROOT_NAME}' order by g.order_id""")
    if pp_group:  # the critical path's rows come first, then the ranks'
        assert shown[0]["name"] == CRITICAL_PATH_GROUP
    ranks = [int(RANK.match(r["name"]).group(1)) for r in shown if r["name"] != CRITICAL_PATH_GROUP]
    assert ranks == sorted(ranks) and set(ranks) == set(range(pp_size))
    assert rows(output, "select count(*) n from thread_track")[0]["n"] == 0


@pytest.mark.parametrize("profiler_steps", ["per_iteration", "one", "none"])
def test_pp_runs_come_from_cpu_annotations_whatever_the_profiler_steps(tmp_path, profiler_steps):
    """Two iterations under one ProfilerStep#N per iteration, one over both (no prof.step() per
    iteration), or none: every run of every action is its own block, so every arrow is drawn."""
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=2, seed=5, graphs_per_step=3,
                         kernels_per_replay=6, profiler_steps=profiler_steps)
    steps_written = rows(files[0], "select count(distinct name) n from slice where name glob 'ProfilerStep#*'")
    assert steps_written[0]["n"] == {"per_iteration": 2, "one": 1, "none": 0}[profiler_steps]
    output, summary = merge(tmp_path, files)
    expected = expected_counts("1f1b", 4, 2, 2)
    assert (summary["pp_send_recv_pairs"], summary["pp_send_recv_unmatched"]) == (expected["send_recv"], 0)
    assert (summary["pp_compute_dependency_pairs"], summary["pp_compute_dependency_unmatched"]) == \
        (expected["compute"], 0)
    assert (summary["pp_unshard_compute_pairs"], summary["pp_unshard_compute_unmatched"]) == (expected["unshard"], 0)
    assert classify_arrows(output) == Counter(expected)


@pytest.mark.parametrize("profiler_steps", ["one", "none"])
def test_pp_runs_without_cpu_annotations_split_where_other_actions_intervene(tmp_path, profiler_steps):
    """GPU annotations only (the CPU `PP:` annotations removed): runs split where another
    action of the stage began after the run ended; every arrow is still drawn."""
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=2, seed=5, graphs_per_step=3,
                         kernels_per_replay=6, profiler_steps=profiler_steps)
    for path in files:
        trace = json.loads(path.read_text())
        trace["traceEvents"] = [e for e in trace["traceEvents"] if not (
            e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("PP:"))]
        path.write_text(json.dumps(trace))
    output, summary = merge(tmp_path, files)
    expected = expected_counts("1f1b", 4, 2, 2)
    assert (summary["pp_send_recv_pairs"], summary["pp_send_recv_unmatched"]) == (expected["send_recv"], 0)
    assert summary["pp_compute_dependency_unmatched"] == summary["pp_unshard_compute_unmatched"] == 0
    assert classify_arrows(output) == Counter(expected)


def test_stage_less_gpipe_annotations_get_stage_to_stage_arrows(tmp_path):
    """ScheduleGPipe writes `Forward <mb>` / `Backward <mb>`: no stage, no send or receive.
    The stage is the rank's PP rank; F(s) -> F(s+1) and B(s) -> B(s-1), counted apart."""
    pp_size, microbatches, steps = 4, 2, 2
    files = write_pp_run(tmp_path / "run", pp_size=pp_size, microbatches=microbatches, steps=steps, seed=5,
                         graphs_per_step=3, kernels_per_replay=6, pp_annotations="gpipe")
    output, summary = merge(tmp_path, files)
    expected = 2 * (pp_size - 1) * microbatches * steps
    assert summary["pp_annotations"] == ["stage-less"]
    assert (summary["pp_stage_dependency_pairs"], summary["pp_stage_dependency_unmatched"]) == (expected, 0)
    assert summary["pp_send_recv_pairs"] == summary["pp_compute_dependency_pairs"] == 0
    arrows = rows(output, RANK_ROWS_SQL + """
        select so.name src, si.name dst, coalesce(rs.name, '') src_rank, coalesce(rd.name, '') dst_rank
        from flow f join cgtrace_all_slice so on f.slice_out = so.id join cgtrace_all_slice si on f.slice_in = si.id
        left join rank_rows rs on rs.track_id = so.track_id left join rank_rows rd on rd.track_id = si.track_id
        where (so.name glob 'Forward *' or so.name glob 'Backward *') and si.name = so.name""")
    assert len(arrows) == expected
    for arrow in arrows:
        source, target = (int(RANK.match(arrow[k]).group(1)) for k in ("src_rank", "dst_rank"))
        assert target - source == (1 if arrow["src"].startswith("Forward") else -1), arrow


@pytest.mark.parametrize("pp_size,schedule", [(2, "1f1b"), (4, "zero_bubble"), (8, "1f1b")])
def test_generated_pipelines_merge_with_exact_arrows(tmp_path, pp_size, schedule):
    files = write_pp_run(tmp_path / "run", pp_size=pp_size, schedule=schedule, microbatches=pp_size, steps=2,
                         seed=pp_size, graphs_per_step=4, kernels_per_replay=8)
    output, summary = merge(tmp_path, files)
    expected = expected_counts(schedule, pp_size, pp_size, 2)
    assert summary["pp_order_source"] == "distributedInfo.pg_config"
    assert [r["pp_rank"] for r in summary["pp_ranks"]] == list(range(pp_size))
    assert [r["global_rank"] for r in summary["pp_ranks"]] != sorted(r["global_rank"] for r in summary["pp_ranks"])
    assert len(set(summary["time_offsets_ns"])) > 1
    assert (summary["pp_send_recv_pairs"], summary["pp_send_recv_unmatched"]) == (expected["send_recv"], 0)
    assert summary["pp_arrival_markers"] == expected["send_recv"]
    assert (summary["pp_compute_dependency_pairs"], summary["pp_compute_dependency_unmatched"]) == \
        (expected["compute"], 0)
    assert (summary["pp_unshard_compute_pairs"], summary["pp_unshard_compute_unmatched"]) == (expected["unshard"], 0)
    assert problem_stats(output) == []
    assert classify_arrows(output) == Counter(expected)
    assert_ranks_named_and_ordered(output, pp_size)
    assert_root_counts_busy_gpus(output, PIPELINE_ROOT_NAME)
    # Profiler bookkeeping: each rank's global instants inside its CPU row, not a top-level row.
    instants = rows(output, """select count(*) n, count(distinct s.track_id) rows, max(t.parent_id is null) top
                               from slice s join track t on s.track_id = t.id where s.name = 'Record Window End'""")[0]
    assert (instants["n"], instants["rows"], instants["top"]) == (pp_size, pp_size, 0)


def test_titles_keep_the_inputs_ids(tmp_path):
    """The UI titles a thread "<name> <tid>": a merged rank's CPU threads, written as plain rows
    to keep pipeline order, carry the tids their input gave them in their titles."""
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=1, seed=4, graphs_per_step=2,
                         kernels_per_replay=4)
    output, _ = merge(tmp_path, files)
    inputs = [json.loads(path.read_text())["traceEvents"] for path in files]
    cpu_pids = {e["pid"] for events in inputs for e in events
                if e.get("name") == "process_labels" and e["args"]["labels"] == "CPU"}
    cpu_tids = {e["tid"] for events in inputs for e in events if e.get("pid") in cpu_pids and e.get("ph") == "X"}
    shown = rows(output, "select t.name from track t join track p on t.parent_id = p.id where p.name glob '* · CPU'")
    assert {int(word) for r in shown for word in r["name"].split() if word.isdigit()} == cpu_tids




def test_pp_arrows_meet_the_work_not_a_memcpy_it_covers(tmp_path):
    # The demo's pipeline: some compute blocks' first fragments sit above a memcpy lane.
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=4, steps=2, seed=7,
                         graphs_per_step=6, kernels_per_replay=16)
    output, summary = merge(tmp_path, files)
    roles = {r.uuid: r for r in track_roles(output)}
    ends = rows(output, f"""select s.name, {TRACK_UUID} uuid from flow f
                            join cgtrace_all_slice s on s.id in (f.slice_out, f.slice_in) join track t on t.id = s.track_id
                            where f.slice_out in (select id from slice where name glob 'PP:*')""")
    assert len(ends) == 2 * (summary["pp_send_recv_pairs"] + summary["pp_compute_dependency_pairs"]
                             + summary["pp_unshard_compute_pairs"]) > 0
    landed = Counter()
    for end in ends:
        action = re.match(r"(?:arrival of )?PP:\d+([A-Z_]+?)\d*(?: from rank \d+)?$", end["name"]).group(1)
        row = roles[end["uuid"]]
        assert row.role is TrackRole.ANNOTATIONS
        landed[(action in ("F", "B", "I", "W"), roles[row.home].kind)] += 1
    # Compute ends above compute lanes; sends, receives' arrival markers and UNSHARD (an
    # all-gather) above communication.
    assert set(landed) == {(True, LaneKind.COMPUTE), (False, LaneKind.COMMUNICATION)}


def test_dp_by_pp_writes_one_file_per_pipeline(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=2, dp_size=2, microbatches=2, steps=2, seed=5,
                         graphs_per_step=4, kernels_per_replay=8)
    _, summary = merge(tmp_path, files)
    pipelines = summary["pipelines"]
    assert len(pipelines) == 2
    expected = expected_counts("1f1b", 2, 2, 2)
    for result in pipelines:
        assert (result["pp_send_recv_pairs"], result["pp_send_recv_unmatched"]) == (expected["send_recv"], 0)
        assert classify_arrows(result["output"]) == Counter(expected)
        assert_ranks_named_and_ordered(result["output"], 2)
    ranks = [{r["global_rank"] for r in result["pp_ranks"]} for result in pipelines]
    assert not ranks[0] & ranks[1]


def test_truncated_capture_reports_the_missing_receive(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=2, microbatches=2, steps=2, seed=9, truncate_last_recv=True,
                         graphs_per_step=4, kernels_per_replay=8)
    output, summary = merge(tmp_path, files)
    assert summary["pp_send_recv_unmatched"] == 1
    assert summary["pp_send_recv_pairs"] == expected_counts("1f1b", 2, 2, 2)["send_recv"] - 1
    (example,) = summary["pp_send_recv_unmatched_examples"]
    assert "step 1" in example and "SEND" in example and "RECV" in example
    drawn = classify_arrows(output)["send_recv"]
    assert drawn == summary["pp_send_recv_pairs"] == summary["pp_arrival_markers"]


def test_directory_merge_leaves_other_json_files_alone(tmp_path):
    """`cgtrace merge DIR` takes the files named like rank traces; a config beside them is no trace."""
    files = write_pp_run(tmp_path / "run", pp_size=2, microbatches=2, steps=1, seed=3,
                         graphs_per_step=2, kernels_per_replay=4)
    (tmp_path / "run" / "config.json").write_text('{"lr": 0.1}')
    output, summary = merge(tmp_path, [tmp_path / "run"])
    assert sorted(r["file"] for r in summary["pp_ranks"]) == sorted(map(str, files))
    assert problem_stats(output) == []
    assert classify_arrows(output)["send_recv"] == summary["pp_send_recv_pairs"] > 0


def test_real_dlrm_ranks_merge_in_global_order(tmp_path):
    require_shared_traces()
    output, summary = merge(tmp_path, [SHARED_TRACES / "dlrm_8ranks"])
    assert summary["pp_order_source"].startswith("global rank order")
    assert [r["global_rank"] for r in summary["pp_ranks"]] == list(range(8))
    assert summary["pp_send_recv_pairs"] == summary["pp_compute_dependency_pairs"] == 0
    assert problem_stats(output) == []
    assert rows(output, ARROWS_SQL) == []
    assert_ranks_named_and_ordered(output, 8, pp_group=False)


@pytest.mark.parametrize("case,expected", [
    ("one_file", "at least two rank traces"),
    ("duplicate_rank", "appears twice"),
    ("no_distributed_info", "no distributedInfo.rank"),
    ("no_base_time", "--assume-aligned"),
])
def test_merge_errors(tmp_path, case, expected):
    run = tmp_path / "run"
    files = write_pp_run(run, pp_size=2, microbatches=2, steps=1, seed=1, graphs_per_step=2, kernels_per_replay=4)
    document = json.loads(files[1].read_text())
    if case == "one_file":
        files = files[:1]
    elif case == "duplicate_rank":
        document["distributedInfo"]["rank"] = json.loads(files[0].read_text())["distributedInfo"]["rank"]
    elif case == "no_distributed_info":
        del document["distributedInfo"]
    elif case == "no_base_time":
        del document["baseTimeNanoseconds"]
    if case != "one_file":
        files[-1].write_text(json.dumps(document))
    result = subprocess.run([sys.executable, "-m", "converter.cli", "merge", *map(str, files),
                             "-o", str(tmp_path / "out.perfetto-trace")], capture_output=True, text=True)
    assert result.returncode == 2
    assert expected in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out.perfetto-trace").exists()


@pytest.mark.parametrize("rank_mb, ranks, cores, jobs, helper", [
    (75, 2, 2, 1, False),    # two equal ranks: one at a time; a helper's interpreter would not fit
    (500, 2, 2, 1, True),    # ... but beside a 500 MB rank it does
    (500, 2, 8, 1, True),
    (20, 8, 2, 2, False),    # eight small ranks: two at a time, no idle core left for helpers
    (50, 16, 8, 7, False),   # more cores: as many ranks as stay below the total
    (500, 8, 8, 5, False),   # eight large ranks on eight cores: five at a time, too few cores for helpers
    (500, 4, 8, 2, True),    # four: memory allows two at a time, each with a helper on an idle core
    (20, 8, 1, 1, False),
])
def test_merge_plans_its_processes_to_stay_below_the_input(rank_mb, ranks, cores, jobs, helper):
    machine = Tuning(cores=cores)
    sizes = [rank_mb * 10**6] * ranks
    assert machine.default_jobs(sizes) == jobs
    assert machine.helper_fits(sizes, jobs) == helper


def test_json_size_reads_the_gzip_trailer(tmp_path):
    text = json.dumps({"traceEvents": [{"ph": "X", "name": "a" * 50, "ts": i} for i in range(5000)]}).encode()
    path = tmp_path / "rank0_trace.json.gz"
    path.write_bytes(gzip.compress(text))
    assert path.stat().st_size < len(text) // 10
    assert json_size(path) == len(text)
    assert json_size(tmp_path / "missing.json") == 0


@pytest.mark.parametrize("jobs", [1, 2])
def test_args_helpers_in_pass_two_change_nothing(tmp_path, monkeypatch, jobs):
    """Large ranks get an args helper each; forced here on small ones, the merge is the same."""
    files = write_pp_run(tmp_path / "run", pp_size=2, schedule="1f1b", microbatches=2, steps=1,
                         seed=11, graphs_per_step=3, kernels_per_replay=8)
    seen = tmp_path / "helper_results.txt"  # written by the workers, where the helpers run
    original = BackgroundArgsEncoder.result

    def result(self):
        encoded = original(self)
        with seen.open("a") as log:
            log.write(f"{type(encoded).__name__}\n")
        return encoded

    monkeypatch.setattr(BackgroundArgsEncoder, "result", result)
    outputs = {}
    for helper in (False, True):
        outputs[helper] = tmp_path / f"merged_{helper}.perfetto-trace"
        summary = merge_ranks(files, lambda group, groups: outputs[helper], jobs=jobs,
                              args_strategy="helper" if helper else "in-process")
        assert summary["pp_send_recv_unmatched"] == 0 and summary["pp_send_recv_pairs"] > 0
    assert set(seen.read_text().split()) == {EncodedArgs.__name__}  # every helper delivered
    assert outputs[True].read_bytes() == outputs[False].read_bytes()
    assert problem_stats(outputs[True]) == []
    assert actual_slices(outputs[True]) == actual_slices(outputs[False])
    assert classify_arrows(outputs[True]) == classify_arrows(outputs[False])


def test_the_summary_says_how_many_ranks_were_held_at_once(tmp_path):
    files = write_pp_run(tmp_path / "run", pp_size=2, schedule="1f1b", microbatches=2, steps=1,
                         seed=5, graphs_per_step=2, kernels_per_replay=4)
    output = tmp_path / "out.perfetto-trace"
    command = [sys.executable, "-m", "converter.cli", "merge", *map(str, files), "-o", str(output)]
    default = subprocess.run(command, capture_output=True, text=True, check=True)
    summary = json.loads(default.stdout)
    assert (summary["ranks_at_once"], summary["args_helpers"]) == (1, False)  # small ranks: the main process
    one_at_a_time = "ranks were read one at a time to keep memory below the inputs' size; --jobs 2"
    assert (one_at_a_time in default.stderr) == (Tuning.for_this_machine().cores > 1)
    chosen = subprocess.run([*command, "--overwrite", "--jobs", "2"], capture_output=True, text=True, check=True)
    assert json.loads(chosen.stdout)["ranks_at_once"] == 2 and one_at_a_time not in chosen.stderr


@pytest.mark.parametrize("strategy", ["in-process", "helper"])
def test_merge_reads_each_rank_once_and_leaves_only_its_output(monkeypatch, tmp_path, strategy):
    """Pass two writes from pass one's snapshots: the JSON is read once per rank (counted in
    this process: one job and no helper run the passes here); the scratch folder beside the
    output goes; and with the args helper's encoding kept in the snapshots or not, in workers
    or here, the merged bytes are the same."""
    runner = importlib.import_module("converter.jobs.runner")
    files = write_pp_run(tmp_path / "run", pp_size=3, microbatches=2, steps=1, seed=8, graphs_per_step=2)
    reads = []
    real_read = runner.read_trace
    monkeypatch.setattr(runner, "read_trace", lambda path, **kw: reads.append(path) or real_read(path, **kw))
    out = tmp_path / "out"
    out.mkdir()
    first = merge_ranks(files, lambda group, groups: out / "merged.perfetto-trace", jobs=1, args_strategy="in-process")
    assert sorted(map(str, reads)) == sorted(map(str, files))
    assert [p.name for p in out.iterdir()] == ["merged.perfetto-trace"]  # no snapshot or part left behind
    again = merge_ranks(files, lambda group, groups: out / "again.perfetto-trace", jobs=2, args_strategy=strategy)
    assert (out / "again.perfetto-trace").read_bytes() == (out / "merged.perfetto-trace").read_bytes()
    assert first["pp_send_recv_pairs"] == again["pp_send_recv_pairs"] > 0
    assert not problem_stats(out / "merged.perfetto-trace")
