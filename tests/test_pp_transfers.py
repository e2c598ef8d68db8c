"""Pipeline truth on every schedule: one cross-rank arrow per `c10d::send` inside the profiled
steps, none drawn backwards, counted from the input JSON without cgtrace's code."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from converter.generator import write_pp_run
from converter.engine.transfers import P2POp, RankOps, pair_transfers
from converter.kineto import rank_header
from converter.lane_rules import load_lane_rules

from .helpers import SHARED_TRACES, merge_files, problem_stats, rows

PP_CPU = SHARED_TRACES / "torch_pp_cpu"
SETS = sorted(p.name for p in PP_CPU.iterdir() if p.is_dir()) if PP_CPU.is_dir() else []
# Each slice's rank: the global rank in the title of a row above its track (`PP rank k (global g) · CPU`).
CROSS_RANK_ARROWS_SQL = """
    with recursive up(track_id, ancestor, name) as (
        select id, parent_id, name from track
        union all
        select up.track_id, t.parent_id, t.name from up join track t on t.id = up.ancestor)
    , ranked as (select track_id, max(cast(substr(name, instr(name, '(global ') + 8) as int)) rank
                 from up where name glob '*rank * (global *)*' group by track_id)
    select so.ts src_ts, so.dur src_dur, si.ts dst_ts, si.dur dst_dur, si.name dst, si.category dst_cat,
           rs.rank src_rank, rd.rank dst_rank
    from flow f join cgtrace_all_slice so on so.id = f.slice_out join cgtrace_all_slice si on si.id = f.slice_in
    join ranked rs on rs.track_id = so.track_id join ranked rd on rd.track_id = si.track_id
    where rs.rank != rd.rank"""


def sends_in_steps(path: Path) -> int:
    """`c10d::send` ops that start inside a ProfilerStep of their own trace."""
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name")).startswith("ProfilerStep#")]
    return sum(1 for e in events if e.get("name") == "c10d::send" and any(a <= e["ts"] <= b for a, b in steps))


def drawn_backwards(arrow: dict) -> bool:
    """The UI draws from the source's end, or from its start when it starts no earlier than
    the target, to the target's start."""
    return arrow["dst_ts"] < arrow["src_ts"] + arrow["src_dur"] and arrow["src_ts"] < arrow["dst_ts"]


def merged_arrows(files: list[Path], output: Path, **options) -> tuple[dict, list[dict]]:
    summary = merge_files(files, lambda group, groups: output, **options)
    return summary, rows(output, CROSS_RANK_ARROWS_SQL)


@pytest.mark.skipif(not PP_CPU.is_dir(), reason="../shared/traces is absent")
@pytest.mark.parametrize("name", SETS)
def test_every_send_of_every_schedule_gets_one_forward_arrow(tmp_path, name):
    files = sorted((PP_CPU / name).glob("rank*_trace.json.gz"))
    for group in range(2 if name == "dp2_pp2" else 1):
        output = tmp_path / f"{name}{group}.perfetto-trace"
        summary, arrows = merged_arrows(files, output, pp_group=group if name == "dp2_pp2" else None)
        members = [Path(rank["file"]) for rank in summary["pp_ranks"]]
        expected = sum(map(sends_in_steps, members))
        assert expected > 0
        assert len(arrows) == expected == summary["pp_send_recv_pairs"]
        assert [a for a in arrows if drawn_backwards(a)] == []
        # Every arrow lands on a zero-duration marker of its own category (what the UI's Flow Events
        # panel filters by), at the receive's start or, for a receive posted early, the send's end.
        assert {a["dst_cat"] for a in arrows} == {"pp_p2p"} and all(a["dst_dur"] == 0 for a in arrows)
        assert len(arrows) == summary["pp_arrival_markers"]
        at_send_end = [a for a in arrows if a["dst_ts"] == a["src_ts"] + a["src_dur"]]
        assert len(at_send_end) >= summary["pp_receives_posted_early"] > 0
        assert summary["pp_transfers_no_peer"] == summary["pp_transfers_unpaired"] == 0
        assert summary["pp_transfer_causality_violations"] == summary["pp_transfers_outside_capture"] == 0
        assert problem_stats(output) == []


@pytest.mark.parametrize("profiler_steps", ["per_iteration", "one", "none"])
def test_generated_pipelines_keep_one_forward_arrow_per_pair(tmp_path, profiler_steps):
    files = write_pp_run(tmp_path / "run", pp_size=4, microbatches=2, steps=2, seed=5, graphs_per_step=3,
                         kernels_per_replay=6, profiler_steps=profiler_steps)
    summary, arrows = merged_arrows(files, tmp_path / "merged.perfetto-trace")
    assert len(arrows) == summary["pp_send_recv_pairs"] > 0
    assert [a for a in arrows if drawn_backwards(a)] == []
    assert "pp_transfers" not in summary  # no c10d ops: the annotations are the transfers
    # Each lands on an arrival marker of its own category (what the UI's Flow Events panel filters by).
    assert {a["dst_cat"] for a in arrows} == {"pp_p2p"} and all(a["dst_dur"] == 0 for a in arrows)
    assert summary["pp_arrival_markers"] == len(arrows)


def test_wait_annotations_are_no_action():
    """torch 2.15's WAIT_SEND_X / WAIT_REDUCE_GRAD complete a send: never read as action W."""
    rules = load_lane_rules()
    waits = ("PP:0WAIT_SEND_F3", "PP:1WAIT_SEND_B0", "PP:2WAIT_REDUCE_GRAD")
    assert all(rules.pp_match(name) is None for name in waits)
    assert rules.pp_match("PP:0W3").group("action") == "W"


def test_a_one_dimensional_world_is_the_pipeline_in_global_rank_order():
    """torch lists no mesh_pp for a 1-D mesh (only default_pg): the PP rank is then the global
    rank, so GPipe's stage-less blocks get their real stage."""
    default_pg = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]}
    header = rank_header({"distributedInfo": {"rank": 2, "world_size": 4, "pg_config": [default_pg]}}, "t")
    assert (header.pp_group, header.pp_rank, header.pp_rank_source.startswith("global rank")) == (None, 2, True)
    dp = {"pg_name": "1", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [0, 2]}
    two_dimensional = rank_header({"distributedInfo": {"rank": 2, "world_size": 4, "pg_config": [default_pg, dp]}},
                                  "t")
    assert two_dimensional.pp_rank == 0


@pytest.mark.skipif(not PP_CPU.is_dir(), reason="../shared/traces is absent")
def test_merging_some_ranks_keeps_their_places_in_the_pipeline(tmp_path):
    """Ranks 1 and 2 of four are middle ranks, not two chain ends: only the 1 <-> 2 transfers
    (8 forward, 8 backward in the two steps) pair; the ops toward ranks 0 and 3 have no merged peer."""
    files = sorted((PP_CPU / "torch215_1f1b_pp4").glob("rank*_trace.json.gz"))
    summary, arrows = merged_arrows(files, tmp_path / "middle.perfetto-trace", ranks={1, 2})
    assert len(arrows) == summary["pp_send_recv_pairs"] == 16
    assert {(a["src_rank"], a["dst_rank"]) for a in arrows} == {(1, 2), (2, 1)}
    assert [a for a in arrows if drawn_backwards(a)] == []
    assert summary["pp_transfers_no_peer"] == 32 and summary["pp_transfers_unpaired"] == 0


def _op(row: int, send: bool, start: int, end: int, done: int = 0, stage=None, forward=None) -> P2POp:
    return P2POp(row, send, start, end, max(done, end), stage, forward, "PP annotation" if stage is not None else "",
                 "" if stage is None else f"PP:{stage}{'SEND' if send else 'RECV'}_{'F' if forward else 'B'}0")


def test_pairing_is_in_order_per_channel_with_markers_for_early_receives():
    """Without ../shared: two chain ends; a receive posted before its send (a marker at the send's
    end), one after it (the receive itself), and a send whose receive lies beyond the receiver's capture."""
    sender = RankOps([_op(10, True, 100, 150), _op(11, True, 400, 450), _op(12, True, 2000, 2050)], first=0,
                     last=2100)
    receiver = RankOps([_op(20, False, 50, 60, done=160), _op(21, False, 500, 520)], first=0, last=1000)
    result = pair_transfers([sender, receiver], [4, 5], [0, 1], 2)
    assert result.pairs == 2 and result.early_receives == 1 and result.causality_violations == []
    ends = [(e.position, e.row, e.outgoing, e.marker_at, e.marker_name) for e in result.ends]
    assert ends == [(0, 10, True, None, ""), (1, 20, False, 150, "recv from rank 4"),
                    (0, 11, True, None, ""), (1, 21, False, 500, "recv from rank 4")]
    assert len(result.outside_capture) == 1 and result.unpaired == []


def test_a_receive_done_before_its_send_began_is_no_partner():
    sender = RankOps([_op(10, True, 100, 150), _op(11, True, 600, 650)], first=0, last=2000)
    receiver = RankOps([_op(20, False, 200, 210), _op(21, False, 500, 520), _op(22, False, 900, 910)], first=0,
                       last=2000)
    result = pair_transfers([sender, receiver], [0, 1], [0, 1], 2)
    assert result.pairs == 1 and len(result.causality_violations) == 1
    assert len(result.unpaired) == 1 and result.outside_capture == []


def test_annotated_peers_come_from_the_stages_each_rank_holds():
    """A V-shaped pipeline: stage 1 (rank 1) sends forward to stage 2, back on rank 0."""
    rank0 = RankOps([_op(1, False, 300, 310, stage=2, forward=True)], frozenset({0, 2}), 0, 1000)
    rank1 = RankOps([_op(2, True, 100, 200, stage=1, forward=True)], frozenset({1}), 0, 1000)
    result = pair_transfers([rank0, rank1], [0, 1], [0, 1], 2)
    assert result.pairs == 1 and dict(result.peers_from) == {"PP annotation": 1} and result.early_receives == 0
    marked = pair_transfers([RankOps([_op(1, False, 150, 160, stage=2, forward=True)], frozenset({0, 2}), 0, 1000),
                             rank1], [0, 1], [0, 1], 2)
    assert marked.ends[1].marker_name == "arrival of PP:1SEND_F0 from rank 1" and marked.ends[1].marker_at == 200
