"""Real torch.distributed.pipelining traces (torch 2.14.1, gloo, CPU only): `PP:` annotations
exist only on the CPU, so they are the blocks; the c10d ops inside them are the transfers."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from .helpers import SHARED_TRACES, merge_files, rows

PP_CPU = SHARED_TRACES / "torch_pp_cpu"
PP_NAME = re.compile(r"^PP:(\d+)(SEND_F|SEND_B|RECV_F|RECV_B|[A-Z_]+?)(\d*)$")
# A merge writes a rank's threads as rows under its process's group of rows: the arrow's ends'
# parents tell ranks apart.
CROSS_RANK_SQL = """
    select so.name src, sp.name src_parent, si.name dst, so.ts src_ts, so.dur src_dur, si.ts dst_ts,
           parent.name dst_parent, grandparent.name dst_grandparent, tto.parent_id src_rank, tti.parent_id dst_rank
    from flow f
    join cgtrace_all_slice so on so.id = f.slice_out join cgtrace_all_slice si on si.id = f.slice_in
    left join cgtrace_all_slice sp on sp.id = so.parent_id left join cgtrace_all_slice parent on parent.id = si.parent_id
    left join cgtrace_all_slice grandparent on grandparent.id = parent.parent_id
    join track tto on tto.id = so.track_id join track tti on tti.id = si.track_id
    where so.name glob 'PP:*' or sp.name glob 'PP:*'"""

pytestmark = pytest.mark.skipif(not PP_CPU.is_dir(), reason="../shared/traces is absent")


def _annotations_per_step(path: Path) -> Counter:
    """(step, stage, action, microbatch) -> how many CPU annotations, read from the input."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
    found: Counter = Counter()
    for event in events:
        match = PP_NAME.match(str(event.get("name", ""))) if event.get("ph") == "X" else None
        if match:
            step = next((name for start, end, name in steps if start <= event["ts"] <= end), None)
            found[(step, int(match.group(1)), match.group(2), match.group(3))] += 1
    return found


def _expected_send_recv_pairs(files: list[Path]) -> int:
    annotations = sum((_annotations_per_step(path) for path in files), Counter())
    pairs = 0
    for (step, stage, action, microbatch), count in annotations.items():
        if action in ("SEND_F", "SEND_B"):
            peer = (step, stage + (1 if action == "SEND_F" else -1), "RECV_" + action[-1], microbatch)
            pairs += min(count, annotations[peer])
    return pairs


def test_interleaved_cpu_pipeline_gets_its_arrows_on_cpu_tracks(tmp_path):
    files = sorted((PP_CPU / "interleaved1f1b_pp2v2").glob("rank*_trace.json.gz"))
    output = tmp_path / "merged.perfetto-trace"
    summary = merge_files(files, lambda group, groups: output)
    expected = _expected_send_recv_pairs(files)
    assert expected > 0
    assert summary["pp_annotations"] == ["CPU PP annotations only"]
    assert (summary["pp_send_recv_pairs"], summary["pp_send_recv_unmatched"]) == (expected, 0)
    arrows = rows(output, CROSS_RANK_SQL)
    across = [a for a in arrows if a["src_rank"] != a["dst_rank"]]
    # One arrow per matched pair, from the c10d send inside SEND_x, each forward in time, to an
    # arrival marker on the receiving thread: at the receive's start, inside the RECV_x that is
    # the SEND_x's peer, or, where the receive (gloo's is a non-blocking post) began before the
    # send ended, at the send's end, whatever that thread was doing by then.
    assert len(across) == expected
    assert all(a["src"] == "c10d::send" and PP_NAME.match(a["src_parent"]).group(2).startswith("SEND")
               for a in across)
    assert all(a["dst_ts"] >= a["src_ts"] + a["src_dur"] for a in across)
    landed = Counter(_landing(a) for a in across)
    assert set(landed) == {"in the peer's receive", "at the send's end"}
    assert sum(landed.values()) == summary["pp_arrival_markers"] == expected
    assert landed["at the send's end"] >= summary["pp_receives_posted_early"] > 0
    assert summary["pp_clock_skew_pairs"] == 0  # one machine, one clock
    assert summary["pp_compute_dependency_pairs"] > 0 and summary["pp_compute_dependency_unmatched"] == 0
    local = [a for a in arrows if a["src_rank"] == a["dst_rank"] and PP_NAME.match(a["src"])]
    assert all(PP_NAME.match(a["dst"]) for a in local)
    assert len(local) == summary["pp_compute_dependency_pairs"] + summary["pp_unshard_compute_pairs"]


def _landing(arrow: dict) -> str:
    """Where a cross-rank arrow's arrival marker (named after its SEND_x) sits: at the send's end,
    or inside the RECV_x that is the SEND_x's peer (directly, or inside its c10d receive)."""
    if not arrow["dst"].startswith(f"arrival of {arrow['src_parent']} from rank "):
        return "elsewhere: " + arrow["dst"]
    if arrow["dst_ts"] == arrow["src_ts"] + arrow["src_dur"]:
        return "at the send's end"
    block = arrow["dst_grandparent"] if arrow["dst_parent"] == "c10d::recv_" else arrow["dst_parent"]
    sent, received = PP_NAME.match(arrow["src_parent"]), PP_NAME.match(block or "")
    if received is None:
        return "outside a RECV block"
    downstream = 1 if sent.group(2) == "SEND_F" else -1
    peer = (int(sent.group(1)) + downstream, "RECV_" + sent.group(2)[-1], sent.group(3))
    return "in the peer's receive" if (int(received.group(1)), received.group(2), received.group(3)) == peer \
        else "in another receive"

def test_dp_by_pp_set_is_two_pipelines_in_pp_order(tmp_path):
    ranks = tmp_path / "dp2_pp2"
    shutil.copytree(PP_CPU / "dp2_pp2", ranks)
    summary = merge_files([ranks], lambda group, groups: tmp_path / f"pipeline{group}.perfetto-trace")
    pipelines = summary["pipelines"]
    assert [[r["global_rank"] for r in p["pp_ranks"]] for p in pipelines] == [[0, 2], [1, 3]]
    # Schedule1F1B writes no PP annotations: the c10d ops alone give the transfers (chain ends).
    assert _expected_send_recv_pairs(sorted(ranks.glob("rank*_trace.json.gz"))) == 0
    assert all(p["pp_annotations"] == ["none"] and p["pp_send_recv_pairs"] == 16 for p in pipelines)
    assert all(p["pp_transfer_peers_from"] == {"chain end": 16} for p in pipelines)
