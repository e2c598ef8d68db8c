"""Tests of the synthetic Kineto trace generator (converter.generator)."""

from __future__ import annotations

import collections
import gzip
import inspect
import json
import re
from pathlib import Path

import orjson
import pytest

from converter.generator import (
    GeneratorConfig,
    build_trace,
    iter_events,
    parse_action,
    pipeline_schedule,
    trace_bytes,
    write_pp_run,
    write_trace,
)

SMALL = dict(steps=2, graphs_per_step=6, kernels_per_replay=24)
GPU_OPS = ("kernel", "gpu_memcpy", "gpu_memset")


def ns(x: float) -> int:
    """A relative Kineto time (us, 3 decimals) as integer ns."""
    return round(x * 1000)


@pytest.fixture(scope="module")
def trace() -> dict:
    return build_trace(GeneratorConfig(seed=7, **SMALL))


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("pp")
    paths = write_pp_run(out, pp_size=4, dp_size=2, microbatches=4, steps=2, seed=3, kernels_per_replay=16)
    return [orjson.loads(p.read_bytes()) for p in paths]


# --- file format ------------------------------------------------------------------


def test_same_seed_same_bytes_and_different_seed_differs(tmp_path):
    cfg = GeneratorConfig(seed=11, **SMALL)
    a = write_trace(cfg, tmp_path / "a.json").read_bytes()
    b = write_trace(cfg, tmp_path / "b.json").read_bytes()
    assert a == b == trace_bytes(cfg)
    assert trace_bytes(GeneratorConfig(seed=12, **SMALL)) != a
    ga = write_trace(cfg, tmp_path / "a.json.gz").read_bytes()
    gb = write_trace(cfg, tmp_path / "b.json.gz").read_bytes()
    assert ga == gb
    assert gzip.decompress(ga) == a


def test_valid_json_with_kineto_keys(tmp_path):
    path = write_trace(GeneratorConfig(seed=1, **SMALL), tmp_path / "t.json")
    d = json.loads(path.read_text())  # the standard library parser accepts it
    for key in ("schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds",
                "displayTimeUnit", "traceName", "traceEvents"):
        assert key in d
    assert d["schemaVersion"] == 1 and d["displayTimeUnit"] == "ms"
    assert isinstance(d["baseTimeNanoseconds"], int)
    di = d["distributedInfo"]
    assert di["backend"] == "nccl" and di["rank"] == 0 and di["world_size"] == 1
    assert di["pg_count"] == len(di["pg_config"])
    for pg in di["pg_config"]:
        assert set(pg) == {"pg_name", "pg_desc", "backend_config", "pg_size", "ranks"}
    assert d["deviceProperties"][0]["id"] == 0


def test_event_kinds_present(trace):
    kinds = collections.Counter((e.get("cat"), e["ph"]) for e in trace["traceEvents"])
    for cat in ("user_annotation", "cpu_op", "python_function", "cuda_runtime", "cuda_driver",
                "kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Trace"):
        assert kinds[(cat, "X")] > 0, cat
    assert kinds[("cpu_instant_event", "i")] > 0
    assert kinds[("ac2g", "s")] > 0 and kinds[("ac2g", "f")] > 0
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"cudaGraphLaunch", "cudaLaunchKernel", "cudaMemcpyAsync", "ProfilerStep#0", "ProfilerStep#1",
            "process_name", "process_labels", "process_sort_index", "thread_name",
            "thread_sort_index"} <= names
    assert any(n.startswith("ncclDevKernel_") for n in names)
    assert any(n.startswith("ncclKernel_Broadcast") for n in names)
    assert any("symmetric_memory" in n for n in names)
    assert any(n.startswith("sm90_xmma_gemm") for n in names)
    assert {"Memcpy DtoD (Device -> Device)", "Memcpy HtoD (Pinned -> Device)", "Memset (Device)"} <= names
    instants = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_instant_event"]
    assert all(e["s"] == "t" for e in instants)


def test_relative_times_are_non_negative_and_three_decimals():
    text = trace_bytes(GeneratorConfig(seed=2, **SMALL)).decode()
    stamps = re.findall(r'"(?:ts|dur)":(-?[0-9.eE+]+)', text)
    assert stamps
    assert all(re.fullmatch(r"\d+\.\d{3}", s) for s in stamps)


def test_absolute_format_has_19_significant_digits():
    cfg = GeneratorConfig(seed=2, time_format="absolute", **SMALL)
    text = trace_bytes(cfg).decode()
    assert '"baseTimeNanoseconds"' not in text
    stamps = re.findall(r'"ts":([0-9.]+)', text)
    assert stamps
    for s in stamps:
        whole, frac = s.split(".")
        assert len(frac) == 3 and len(whole) + len(frac) == 19, s
    # Same events as the relative trace, shifted by the base.
    rel = build_trace(GeneratorConfig(seed=2, **SMALL))
    base = rel["baseTimeNanoseconds"]
    first_rel = next(e for e in rel["traceEvents"] if e["ph"] == "X")
    m = re.search(r'"ts":([0-9]+)\.([0-9]{3})', text)
    assert int(m.group(1)) * 1000 + int(m.group(2)) == base + ns(first_rel["ts"])


# --- CUDA graphs, flows, streams ------------------------------------------------------


def test_graph_replay_kernels_share_correlation_and_have_flows(trace):
    ev = trace["traceEvents"]
    launches = {e["args"]["correlation"]: e for e in ev if e.get("name") == "cudaGraphLaunch"}
    assert len(launches) == SMALL["graphs_per_step"] * SMALL["steps"]
    gpu_by_corr = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") in GPU_OPS:
            gpu_by_corr[e["args"]["correlation"]].append(e)
    starts = collections.Counter(e["id"] for e in ev if e["ph"] == "s")
    finishes = collections.defaultdict(list)
    for e in ev:
        if e["ph"] == "f":
            assert e["bp"] == "e" and e["cat"] == "ac2g" and e["name"] == "ac2g"
            finishes[e["id"]].append(e)
    for corr, launch in launches.items():
        kernels = gpu_by_corr[corr]
        assert len(kernels) == SMALL["kernels_per_replay"]
        assert starts[corr] == 1
        assert len(finishes[corr]) == len(kernels)
        flow_points = sorted((f["tid"], f["ts"]) for f in finishes[corr])
        assert flow_points == sorted((k["tid"], k["ts"]) for k in kernels)
        assert all(k["args"]["External id"] == launch["args"]["External id"] for k in kernels)
        assert all(ns(k["ts"]) > ns(launch["ts"]) for k in kernels)
        assert len({k["tid"] for k in kernels}) > 1  # a replay rotates over several streams
    # Every GPU op (graph or eager) has exactly one flow end at its start.
    gpu = [e for e in ev if e.get("cat") in GPU_OPS]
    assert sum(len(v) for v in finishes.values()) == len(gpu)


def test_no_two_gpu_ops_overlap_on_a_stream(trace):
    per_stream = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") in GPU_OPS:
            per_stream[e["tid"]].append((ns(e["ts"]), ns(e["dur"])))
    for stream, ops in per_stream.items():
        ops.sort()
        for (s0, d0), (s1, _) in zip(ops, ops[1:]):
            assert s1 >= s0 + d0, f"overlap on stream {stream}"


def test_streams_parallel_branches_and_labels():
    t = build_trace(GeneratorConfig(seed=5, steps=1, graphs_per_step=32, kernels_per_replay=32,
                                    parallel_branch_fraction=0.3))
    ev = t["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in GPU_OPS]
    assert len({e["tid"] for e in gpu}) >= 200  # hundreds of streams
    assert sum(1 for e in ev if e["name"] == "thread_name" and e["pid"] == 0) >= 200
    # Concurrency: some graph kernels overlap kernels on another stream.
    by_corr = collections.defaultdict(list)
    for e in gpu:
        by_corr[e["args"]["correlation"]].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["tid"]))
    overlapping = 0
    for ks in by_corr.values():
        ks.sort()
        overlapping += sum(1 for a, b in zip(ks, ks[1:]) if b[0] < a[1] and b[2] != a[2])
    assert overlapping > 0
    labels = [e["args"]["name"] for e in gpu if "name" in e["args"]]
    assert labels and all(re.fullmatch(r"layers\.\d+\.\w+", x) for x in labels)
    assert len(labels) < len(gpu)
    nccl = [e for e in gpu if e["name"].startswith("ncclDevKernel")]
    assert nccl


def test_gpu_user_annotations_cover_their_kernels(trace):
    ev = trace["traceEvents"]
    ann = [e for e in ev if e.get("cat") == "gpu_user_annotation"]
    cpu_ann = {e["args"]["External id"]: e for e in ev if e.get("cat") == "user_annotation"}
    for a in ann:
        assert a["pid"] == 0 and cpu_ann[a["args"]["External id"]]["name"] == a["name"]
    # One fragment per (region, stream) without the gaps option, covering first..last kernel.
    seen = collections.Counter((a["args"]["External id"], a["tid"]) for a in ann)
    assert max(seen.values()) == 1
    fwd = {a["tid"]: a for a in ann if a["name"] == "forward"}
    assert len(fwd) > 1
    names = {"ProfilerStep#0", "ProfilerStep#1", "forward", "backward", "Optimizer.step#AdamW.step"}
    assert names <= {a["name"] for a in ann}


def test_annotation_gaps_split_regions():
    t = build_trace(GeneratorConfig(seed=5, annotation_gaps=True, annotation_gap_ns=20_000, **SMALL))
    ann = [e for e in t["traceEvents"] if e.get("cat") == "gpu_user_annotation"]
    seen = collections.Counter((a["args"]["External id"], a["tid"]) for a in ann)
    assert max(seen.values()) > 1
    # Fragments of one region on one stream do not overlap.
    frags = collections.defaultdict(list)
    for a in ann:
        frags[(a["args"]["External id"], a["tid"])].append((ns(a["ts"]), ns(a["dur"])))
    for spans in frags.values():
        spans.sort()
        for (s0, d0), (s1, _) in zip(spans, spans[1:]):
            assert s1 >= s0 + d0


def test_cpu_events_nest_inside_profiler_steps(trace):
    ev = trace["traceEvents"]
    steps = [(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in ev if e["name"].startswith("ProfilerStep#")
             and e["cat"] == "user_annotation"]
    assert len(steps) == SMALL["steps"]
    for e in ev:
        if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "python_function") or (
                e.get("cat") == "user_annotation" and not e["name"].startswith("ProfilerStep")):
            s, t = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            assert any(a <= s and t <= b for a, b in steps), e["name"]


def test_iter_events_streams_same_events(trace):
    gen = iter_events(GeneratorConfig(seed=7, **SMALL))
    assert inspect.isgenerator(gen)
    events = list(gen)
    assert events == trace["traceEvents"]  # exactly what a JSON parser reads from the file


def test_target_events_scales_the_trace():
    n = sum(1 for _ in iter_events(GeneratorConfig(seed=1, target_events=20_000, kernels_per_replay=16)))
    assert 20_000 <= n < 26_000


# --- pipeline schedules ------------------------------------------------------------------


def _counts(actions):
    return collections.Counter((parse_action(a).type, parse_action(a).microbatch) for a in actions)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 4), (4, 8), (3, 5)])
def test_1f1b_actions_per_stage(pp, m):
    sched = pipeline_schedule("1f1b", pp, m)
    assert sorted(sched) == list(range(pp))
    for r, acts in sched.items():
        c = _counts(acts)
        for mb in range(m):
            assert c[("F", mb)] == 1 and c[("B", mb)] == 1
            assert c[("RECV_F", mb)] == (1 if r > 0 else 0)
            assert c[("SEND_F", mb)] == (1 if r < pp - 1 else 0)
            assert c[("RECV_B", mb)] == (1 if r < pp - 1 else 0)
            assert c[("SEND_B", mb)] == (1 if r > 0 else 0)
        assert acts[0] == f"{r}UNSHARD" and acts[-2:] == [f"{r}RESHARD", f"{r}REDUCE_GRAD"]
        pos = {a: i for i, a in enumerate(acts)}
        for mb in range(m):
            assert pos[f"{r}F{mb}"] < pos[f"{r}B{mb}"]
            if r > 0:
                assert pos[f"{r}RECV_F{mb}"] < pos[f"{r}F{mb}"] < pos[f"{r}SEND_B{mb}"]
            if r < pp - 1:
                assert pos[f"{r}F{mb}"] < pos[f"{r}SEND_F{mb}"]
                assert pos[f"{r}RECV_B{mb}"] < pos[f"{r}B{mb}"]
        # warmup forwards before the first backward
        first_b = pos[f"{r}B0"]
        assert sum(1 for a in acts[:first_b] if parse_action(a).type == "F") == min(pp - r, m)


def test_interleaved_virtual_stages():
    pp, m, v = 4, 8, 2
    sched = pipeline_schedule("interleaved", pp, m, stages_per_rank=v)
    n_stages = pp * v
    for r, acts in sched.items():
        stages = {parse_action(a).stage for a in acts}
        assert stages == {r + k * pp for k in range(v)}
        for s in stages:
            c = collections.Counter((parse_action(a).type, parse_action(a).microbatch)
                                    for a in acts if parse_action(a).stage == s)
            for mb in range(m):
                assert c[("F", mb)] == c[("B", mb)] == 1
                assert c[("RECV_F", mb)] == (1 if s > 0 else 0)
                assert c[("SEND_F", mb)] == (1 if s < n_stages - 1 else 0)
            assert c[("UNSHARD", None)] == c[("RESHARD", None)] == c[("REDUCE_GRAD", None)] == 1


def test_zero_bubble_splits_backward():
    pp, m = 4, 6
    sched = pipeline_schedule("zero_bubble", pp, m)
    for r, acts in sched.items():
        types = {parse_action(a).type for a in acts}
        assert "B" not in types and {"I", "W"} <= types
        pos = {a: i for i, a in enumerate(acts)}
        for mb in range(m):
            assert pos[f"{r}I{mb}"] < pos[f"{r}W{mb}"]
            if r < pp - 1:
                assert pos[f"{r}RECV_B{mb}"] < pos[f"{r}I{mb}"]
            if r > 0:
                assert pos[f"{r}SEND_B{mb}"] == pos[f"{r}I{mb}"] + 1


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1), ("zero_bubble", 2)])
def test_every_send_has_one_matching_recv(schedule, v):
    pp, m = 4, 4
    sched = pipeline_schedule(schedule, pp, m, stages_per_rank=v)
    sends, recvs = collections.Counter(), collections.Counter()
    for r, acts in sched.items():
        for a in map(parse_action, acts):
            assert a.stage % pp == r
            if a.type == "SEND_F":
                sends[("F", a.stage + 1, a.microbatch)] += 1
            elif a.type == "SEND_B":
                sends[("B", a.stage - 1, a.microbatch)] += 1
            elif a.type in ("RECV_F", "RECV_B"):
                recvs[(a.type[-1], a.stage, a.microbatch)] += 1
    assert sends == recvs
    assert sum(sends.values()) == 2 * (pp * v - 1) * m


def test_parse_action_round_trip():
    for text in ("2F0", "1UNSHARD", "0SEND_F12", "3RECV_B1", "5REDUCE_GRAD", "1W3"):
        assert str(parse_action(text)) == text
    with pytest.raises(ValueError):
        parse_action("1F")


# --- pipeline traces ---------------------------------------------------------------------


def _pp_blocks(trace: dict, cat: str):
    """{action: [(abs_start_ns, abs_end_ns, tid)]} for PP:<action> events of `cat`."""
    base = trace["baseTimeNanoseconds"]
    out = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") == cat and e["name"].startswith("PP:"):
            s = base + ns(e["ts"])
            out[e["name"][3:]].append((s, s + ns(e["dur"]), e["tid"]))
    return out


def test_pp_run_files_layout(pp_run):
    assert len(pp_run) == 8
    bases = {t["baseTimeNanoseconds"] for t in pp_run}
    assert len(bases) == 8
    for rank, t in enumerate(pp_run):
        di = t["distributedInfo"]
        assert di["rank"] == rank and di["world_size"] == 8
        pp_groups = [g for g in di["pg_config"] if g["pg_desc"] == "mesh_pp"]
        assert len(pp_groups) == 2
        assert sorted(r for g in pp_groups for r in g["ranks"]) == list(range(8))
        assert all(g["pg_size"] == 4 for g in pp_groups)
    groups = [g["ranks"] for g in pp_run[0]["distributedInfo"]["pg_config"] if g["pg_desc"] == "mesh_pp"]
    assert any(g != sorted(g) for g in groups)  # global order differs from PP order
    # Each rank runs its PP rank's schedule.
    sched = pipeline_schedule("1f1b", 4, 4)
    for g in groups:
        for pp_rank, rank in enumerate(g):
            cpu = [e["name"][3:] for e in pp_run[rank]["traceEvents"]
                   if e.get("cat") == "user_annotation" and e["name"].startswith("PP:")]
            assert cpu == sched[pp_rank] * 2


def test_pp_sends_start_before_matching_recvs_end(pp_run):
    groups = [g["ranks"] for g in pp_run[0]["distributedInfo"]["pg_config"] if g["pg_desc"] == "mesh_pp"]
    matched = 0
    for g in groups:
        blocks = {pp_rank: _pp_blocks(pp_run[rank], "gpu_user_annotation") for pp_rank, rank in enumerate(g)}
        for pp_rank, acts in blocks.items():
            for name, frags in acts.items():
                a = parse_action(name)
                if not a.type.startswith("SEND"):
                    continue
                peer_stage = a.stage + (1 if a.type == "SEND_F" else -1)
                recv = f"{peer_stage}RECV_{a.type[-1]}{a.microbatch}"
                rfrags = blocks[peer_stage % 4][recv]
                # two steps: match the k-th send with the k-th recv
                sends = sorted(frags)
                recvs = sorted(rfrags)
                assert len(sends) == len(recvs) == 2
                for s, r in zip(sends, recvs):
                    assert s[0] < r[1]
                    matched += 1
    assert matched == 2 * 2 * 2 * 3 * 4  # pipelines * steps * directions * links * microbatches


def test_pp_blocks_on_gpu_spread_and_split(pp_run):
    t = pp_run[pp_run[0]["distributedInfo"]["pg_config"][1]["ranks"][1]]
    gpu = _pp_blocks(t, "gpu_user_annotation")
    cpu = _pp_blocks(t, "user_annotation")
    for name in cpu:
        if "RESHARD" not in name:
            assert name in gpu, name
    compute = [frags for name, frags in gpu.items() if parse_action(name).type in ("F", "B")]
    assert all(len({f[2] for f in frags}) >= 3 for frags in compute)  # several streams
    assert any(len(frags) > len({f[2] for f in frags}) for frags in compute)  # split by gaps
    # every PP fragment lies inside a GPU ProfilerStep fragment on the same stream
    base = t["baseTimeNanoseconds"]
    steps = collections.defaultdict(list)
    for e in t["traceEvents"]:
        if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#"):
            s = base + ns(e["ts"])
            steps[e["tid"]].append((s, s + ns(e["dur"])))
    for frags in gpu.values():
        for s, e, tid in frags:
            assert any(a <= s and e <= b for a, b in steps[tid])


def test_pp_run_truncated_last_recv(tmp_path):
    paths = write_pp_run(tmp_path, pp_size=2, steps=2, seed=1, shuffle_global_ranks=False,
                         truncate_last_recv=True, kernels_per_replay=8)
    t0, t1 = (orjson.loads(p.read_bytes()) for p in paths)
    sched = pipeline_schedule("1f1b", 2, 4)
    last_recv = [a for a in sched[0] if "RECV" in a][-1]
    mb = parse_action(last_recv).microbatch
    for cat in ("user_annotation", "gpu_user_annotation"):
        # present in step 0, missing in the last step; the matching send is in both
        starts = {s for s, _, _ in _pp_blocks(t0, cat)[last_recv]}
        assert len(starts) == 1
        assert len({s for s, _, _ in _pp_blocks(t1, cat)[f"1SEND_B{mb}"]}) == 2
    # Every other receive is there in both steps, on the CPU and on the GPU.
    for a in sched[0]:
        if "RECV" in a and a != last_recv:
            for cat in ("user_annotation", "gpu_user_annotation"):
                assert len({s for s, _, _ in _pp_blocks(t0, cat)[a]}) == 2, (a, cat)
    # The untruncated rank is complete.
    assert [e["name"][3:] for e in t1["traceEvents"]
            if e.get("cat") == "user_annotation" and e["name"].startswith("PP:")] == sched[1] * 2
    # The capture window ends where the missing receive would have started.
    end = next(e for e in t0["traceEvents"] if e["name"] == "Record Window End")
    assert all(e["ts"] <= end["ts"] for e in t0["traceEvents"] if "ts" in e)


def test_pp_run_single_dict_pg_config_and_determinism(tmp_path):
    a = write_pp_run(tmp_path / "a", pp_size=3, steps=1, seed=4, pg_config_style="single_dict",
                     kernels_per_replay=8)
    b = write_pp_run(tmp_path / "b", pp_size=3, steps=1, seed=4, pg_config_style="single_dict",
                     kernels_per_replay=8)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    d = orjson.loads(a[0].read_bytes())["distributedInfo"]
    pg = d["pg_config"]
    assert isinstance(pg, dict) and pg["pg_name"] == "torchtitan_real_pp" and pg["pg_desc"] == "mesh_pp"
    assert sorted(pg["ranks"]) == [0, 1, 2] and d["pg_count"] == 1


@pytest.mark.parametrize("schedule,v", [("interleaved", 2), ("zero_bubble", 1)])
def test_pp_other_schedules_generate(tmp_path, schedule, v):
    paths = write_pp_run(tmp_path, pp_size=2, schedule=schedule, stages_per_rank=v, steps=1,
                         kernels_per_replay=8)
    t = orjson.loads(paths[0].read_bytes())
    names = {e["name"] for e in t["traceEvents"] if e.get("cat") == "gpu_user_annotation"}
    kinds = {parse_action(n[3:]).type for n in names if n.startswith("PP:")}
    assert ("I" in kinds and "W" in kinds) if schedule == "zero_bubble" else ("B" in kinds)


def test_pp_events_per_rank(tmp_path):
    paths = write_pp_run(tmp_path, pp_size=2, events_per_rank=6000, kernels_per_replay=8)
    counts = [len(orjson.loads(p.read_bytes())["traceEvents"]) for p in paths]
    assert all(3000 < c < 9000 for c in counts)


def test_config_validation():
    with pytest.raises(ValueError):
        GeneratorConfig(time_format="weird")
    with pytest.raises(ValueError):
        GeneratorConfig(pp_size=2, pp_rank=2)
    with pytest.raises(ValueError):
        GeneratorConfig(pp_size=2, schedule="gpipe")
    with pytest.raises(ValueError):
        GeneratorConfig(truncate_last_recv=True)
    cfg = GeneratorConfig(pp_size=4, pp_rank=2)
    assert cfg.rank == 2 and cfg.world_size == 4


def test_single_rank_pipeline_config(tmp_path):
    cfg = GeneratorConfig(pp_size=4, pp_rank=1, steps=1, kernels_per_replay=8)
    t = build_trace(cfg)
    names = [e["name"] for e in t["traceEvents"] if e.get("cat") == "user_annotation"]
    assert names[0] == "PP:1UNSHARD"
    assert any(n == "PP:1RECV_F0" for n in names)
    assert Path(write_trace(cfg, tmp_path / "r.json")).stat().st_size > 0


def test_flow_arrows_point_forward_in_time(pp_run):
    for t in pp_run[:2] + [build_trace(GeneratorConfig(seed=3, **SMALL))]:
        base = t.get("baseTimeNanoseconds", 0)
        starts = collections.defaultdict(list)
        finishes = collections.defaultdict(list)
        for e in t["traceEvents"]:
            if e["ph"] == "s":
                starts[e["id"]].append(ns(e["ts"]))
            elif e["ph"] == "f":
                finishes[e["id"]].append(ns(e["ts"]))
        assert finishes and set(finishes) <= set(starts)
        for fid, fts in finishes.items():
            assert len(starts[fid]) == 1 and all(starts[fid][0] < x for x in fts)
        assert base >= 0


def test_interleaved_config_rejects_bad_microbatches():
    with pytest.raises(ValueError):
        GeneratorConfig(pp_size=4, schedule="interleaved", microbatches=6)
