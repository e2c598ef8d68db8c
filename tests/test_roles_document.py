"""The track-roles document (model/roles_document.py): written as documented, read back whole,
the same on both sides of trace_processor, and refused with advice when its version is unknown."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from converter.engine.layout import separate_overlaps
from converter.errors import CgtraceError
from converter.generator import write_pp_run
from converter.jobs.runner import JobOptions, prepare, write_trace
from converter.lane_rules import load_lane_rules
from converter.model import LaneGroup, LaneKind, Process, RankIdentity, Thread, Trace, Track, TrackRole
from converter.model.roles_document import SQL, VERSION, RankEntry, RolesDocument, decode, document_of, encode
from converter.tp import open_trace

SOURCE = Path("trace.perfetto-trace")


def _sample() -> tuple[Trace, dict[int, int]]:
    """One track of every role, a merged rank's row group, and the uuids a writer gave them."""
    gpu = Process(pid=1, source_pid=1, labels=["GPU 0"])
    rows = Process(pid=2, source_pid="Spans", row_group=True)
    thread = Thread(gpu, tid=3, source_tid=3)
    lanes = Track("GPU 0", process=gpu, role=TrackRole.LANES)
    lane = Track("Compute", parent=lanes, role=TrackRole.LANE, group=LaneGroup("compute", "Compute", LaneKind.COMPUTE))
    tracks = [Track("thread 3", thread=thread), lanes, lane,
              Track("Compute annotations", parent=lanes, role=TrackRole.ANNOTATIONS, home=lane, layer=1),
              Track("Compute (overlaps)", parent=lanes, role=TrackRole.OVERLAP, home=lane, layer=2),
              Track("Global instants", role=TrackRole.GLOBAL, uuid=900)]
    trace = Trace(processes=[gpu, rows], threads=[thread], tracks=tracks, rank=RankIdentity(1, 5))
    uuids = {id(thing): 10 + index for index, thing in enumerate([gpu, rows, *tracks])}
    return trace, uuids


def _document(trace: Trace, uuids: dict[int, int]) -> RolesDocument:
    document = document_of(trace, lambda track: track.uuid or uuids[id(track)], lambda process: uuids[id(process)])
    assert document is not None
    return document


def test_the_document_is_written_as_documented():
    """Key order and left-out fields are the contract readers of older traces rely on."""
    assert encode(_document(*_sample())) == (
        '{"version":1,"tracks":[{"uuid":13,"role":"lanes"},'
        '{"uuid":14,"role":"lane","group":"compute","label":"Compute","kind":"compute"},'
        '{"uuid":15,"role":"annotations","home":14,"layer":1},{"uuid":16,"role":"overlap","home":14,"layer":2},'
        '{"uuid":900,"role":"global"}],"rank":{"pp_rank":1,"global_rank":5,"groups":[11],"title":"PP rank 1 (global 5)"}}')


def test_decoding_an_encoded_document_gives_the_same_roles():
    trace, uuids = _sample()
    document = _document(trace, uuids)
    decoded = decode(encode(document), SOURCE)
    assert decoded == document
    roled = [track for track in trace.tracks if track.role is not TrackRole.PLAIN]
    assert [(entry.role, entry.lane_group, entry.layer) for entry in decoded.tracks] == \
           [(track.role, track.group, track.layer) for track in roled]
    assert decoded.rank == RankEntry(1, 5, (11,), title="PP rank 1 (global 5)")


def test_a_trace_with_no_roles_and_no_rank_has_no_document():
    trace, uuids = _sample()
    plain = Trace(processes=trace.processes, threads=trace.threads, tracks=trace.tracks[:1])
    assert document_of(plain, lambda track: uuids[id(track)], lambda process: uuids[id(process)]) is None
    plain.rank = RankIdentity(0, 0)
    assert _document(plain, uuids) == RolesDocument((), RankEntry(0, 0, (11,), title="PP rank 0 (global 0)"))


def test_an_unknown_version_is_refused_with_what_to_do():
    with pytest.raises(CgtraceError) as refused:
        decode(f'{{"version":{VERSION + 1},"tracks":[{{"uuid":1,"role":"plate"}}]}}', SOURCE)
    message = refused.value.message
    assert str(SOURCE) in message and f"version {VERSION + 1}" in message and "upgrade cgtrace" in message


@pytest.mark.parametrize("text", [
    '{"tracks":[]}',                                                     # no version
    '{"version":1,"tracks":[{"uuid":1,"role":"plate"}]}',                # an unknown role
    '{"version":1,"tracks":[{"uuid":1,"role":"lane"}]}',                 # a lane without its group
    '{"version":1,"tracks":[{"uuid":1,"role":"lane","group":"g"}]}',     # half a lane group
    '{"version":1,"tracks":[],"rank":{"pp_rank":0}}',                    # half a rank
    '{"version":1,',
])
def test_a_malformed_document_is_refused(text):
    with pytest.raises(CgtraceError, match="write the trace again"):
        decode(text, SOURCE)


def test_what_report_reads_is_what_the_writer_wrote(tmp_path):
    """Written by the Perfetto writer, found through trace_processor's metadata table with the
    module's own SQL: every compacted track's role, lane group, home and layer, and the rank."""
    [source] = write_pp_run(tmp_path / "run", pp_size=1, steps=1, seed=3, graphs_per_step=2, kernels_per_replay=8)
    trace = prepare(source, JobOptions(compact=True), load_lane_rules()).trace
    separate_overlaps(trace)
    output = tmp_path / "compacted.perfetto-trace"
    with output.open("wb") as stream:
        write_trace(trace, stream)
    with open_trace(output) as tp:
        [document] = [decode(row.str_value, output) for row in tp.query(SQL)]
        names = {row.uuid: row.name for row in tp.query(
            "select t.name, (select a.int_value from args a where a.arg_set_id = t.source_arg_set_id "
            "and a.key = 'trace_id') uuid from track t")}
    read = Counter((names[entry.uuid], entry.role, entry.lane_group, entry.home and names[entry.home], entry.layer)
                   for entry in document.tracks)
    written = Counter((track.name, track.role, track.group, track.home and track.home.name, track.layer)
                      for track in trace.tracks if track.role is not TrackRole.PLAIN)
    assert read == written and {role for _, role, _, _, _ in read} >= {TrackRole.LANES, TrackRole.LANE,
                                                                       TrackRole.ANNOTATIONS}
    assert trace.rank is not None and document.rank is not None
    assert (document.rank.pp_rank, document.rank.global_rank) == (trace.rank.pp_rank, trace.rank.global_rank)

