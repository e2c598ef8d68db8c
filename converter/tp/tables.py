"""cgtrace's meaning as SQL: the `cgtrace_*` views every trace processor cgtrace opens defines.

What cgtrace knows of a trace it wrote (which rank and PP rank a track belongs to, which lane
group and kind a GPU lane is, which rows it derived) lives in the track-roles documents of
the `metadata` table (model/roles_document.py). These views read it there, in SQL alone, so
the same statements run in any trace processor: `cgtrace query` and `open_trace` define them
before a user's SQL runs, and `cgtrace sql` prints them to paste into the Perfetto UI's query
page or a native shell. The views, version VERSION (docs/cli.md#sql-tables defines each column):

- `cgtrace_all_slice`: every slice as the file holds it; `cgtrace_derived_slice`: the rows
  cgtrace derived (model/derived.py), with `derived_as`; `cgtrace_slice`: the measured
  slices, each with its track's role, lane group, kind, GPU and rank;
- `cgtrace_rank`, `cgtrace_track`: ranks, and every track with its role and rank;
- `cgtrace_step`: each rank's profiler steps, their CPU spans and launched windows;
  `cgtrace_window`: each GPU's steps, or its active span where its rank has none;
  `cgtrace_transfer`: arrows between ranks; `cgtrace_critical_path`: a merge's critical path
  segments; `cgtrace_counter`: counter samples with what they mean; `cgtrace_collective_member`:
  a merge's NCCL collective kernels matched across ranks, each with its collective's message;
- `cgtrace_stage_span`: what each pipeline stage's anatomy is made of (its compute,
  communication, receives and schedule actions); `cgtrace_stage_piece`: its steps cut where
  any of those begins or ends, each piece with the report's stage part, so every part is a sum.

Where cgtrace opens a trace it wrote, `slice` itself is narrowed to the measured slices, so a
sum over `slice` never counts cgtrace's own answers as work; the printed statements leave
`slice` alone (the UI draws from it), and `cgtrace_slice` is the measured view there.
"""

from __future__ import annotations

import re
from typing import Any

from perfetto.trace_processor.api import TraceProcessorException

from ..errors import CgtraceError
from ..kineto import (COMMUNICATION_OPS, COMPUTE_ACTIONS, CPU_OP_CATEGORY, DTYPE_BYTES, GPU_ANNOTATION_CATEGORIES,
                      KERNEL_CATEGORIES, NCCL_KERNEL_PREFIXES, NCCL_OP, POINT_TO_POINT, PROFILER_STEP_PREFIX,
                      RECEIVE_OPS, TRANSFER_BUFFERS)
from ..model import LaneKind, TrackRole, derived, roles_document
from .sql_text import sql_list, sql_literal
from .wasm_backend import WasmBackend

VERSION = 5
OLDEST_PERFETTO = "v52"  # the oldest trace_processor the views are written for (docs/design.md)
_DERIVED = sql_list(derived.CATEGORIES)
# The window of a GPU whose rank has no profiler steps: cgtrace_window's name for it, and the report's.
ACTIVE_SPAN = "active span"


def _measured(category: str) -> str:
    """A slice whose `category` column is that is measured. Written as a `not in`: trace_processor
    v52 gives wrong counts under `group by` where the same test is written as `is null or (... !=
    ... and ...)`."""
    return f"coalesce({category}, '') not in ({_DERIVED})"


_DERIVED_AS = " ".join(f"when {sql_literal(category)} then {sql_literal(kind)}" for category, kind in derived.CATEGORIES.items())
_GPU_ANNOTATIONS = sql_list(GPU_ANNOTATION_CATEGORIES)


def _named(prefixes: tuple[str, ...]) -> str:
    """Whether a slice's name starts with one of `prefixes`, as kineto.py's tests of names ask."""
    return "(" + " or ".join(f"name glob '{prefix}*'" for prefix in prefixes) + ")"


_DIGITS = "'0123456789'"
# What a pipeline stage's anatomy is made of (analysis/pipeline_anatomy.py defines the parts):
# the schedule's slices on the rank's own side (the GPU's annotations on a rank with GPU lanes,
# else its CPU threads), their actions read as the built-in pp_pattern and GPipe's names read
# them, and the rank's compute and communication.
_STAGE_SPAN = f"""
with ranked as (
  select id, ts, end_ts, name, category, role, kind, rank_document,
         rank_document in (select rank_document from cgtrace_slice where role = 'lane' and dur > 0) as gpu_rank
  from cgtrace_slice where dur > 0 and rank_document is not null),
schedule as (
  select *, case when name glob 'PP:[0-9]*' then ltrim(substr(name, 4), {_DIGITS}) end as rest from ranked
  where (name glob 'PP:*' or name glob 'Forward *' or name glob 'Backward *' or {_named(RECEIVE_OPS)})
    and gpu_rank = (coalesce(category, '') in ({_GPU_ANNOTATIONS}) or role = '{TrackRole.ANNOTATIONS.value}')),
parsed as (
  select id, ts, end_ts, name, rank_document,
         case when name glob 'PP:(*)OVERLAP_F_B' then 'OVERLAP_F_B' when rest is not null then rtrim(rest, {_DIGITS})
              when name glob 'Forward [0-9]*' and substr(name, 9) not glob '*[^0-9]*' then 'F'
              when name glob 'Backward [0-9]*' and substr(name, 10) not glob '*[^0-9]*' then 'B' end as action,
         case when rest is not null then cast(substr(name, 4, length(name) - 3 - length(rest)) as int) end as stage,
         case when rest is not null then cast(nullif(substr(rest, length(rtrim(rest, {_DIGITS})) + 1), '') as int)
              when name glob 'Forward [0-9]*' or name glob 'Backward [0-9]*'
              then cast(substr(name, instr(name, ' ') + 1) as int) end as microbatch,
         {_named(RECEIVE_OPS)} as receive_op
  from schedule),
receive_block as (select * from parsed where action glob 'RECV_*')
select rank_document, case when kind = '{LaneKind.COMPUTE.value}' then 'compute' else 'communication' end as what,
       id as slice_id, ts, end_ts, null as action, null as stage, null as microbatch
from ranked where gpu_rank and role = '{TrackRole.LANE.value}'
  and kind in ('{LaneKind.COMPUTE.value}', '{LaneKind.COMMUNICATION.value}')
union all
select rank_document, case when not {_named(COMMUNICATION_OPS)} then 'compute'
                           when category = '{CPU_OP_CATEGORY}' then 'communication op' else 'communication' end,
       id, ts, end_ts, null, null, null
from ranked where not gpu_rank and (category = '{CPU_OP_CATEGORY}' or {_named(COMMUNICATION_OPS)})
  and not {_named(TRANSFER_BUFFERS)}
union all
select p.rank_document, case when p.receive_op then 'receive op'
                             when p.action in ({sql_list(COMPUTE_ACTIONS)}, 'OVERLAP_F_B')
                             then 'compute action'
                             when p.action glob 'RECV_*' then 'receive block' when p.action glob 'SEND_*' then 'send block'
                             else 'schedule' end,
       p.id, p.ts, p.end_ts, coalesce(p.action, b.action), coalesce(p.stage, b.stage),
       coalesce(p.microbatch, b.microbatch)
from parsed p left join receive_block b on b.id = (
  select o.id from receive_block o where p.receive_op and o.rank_document = p.rank_document
    and o.ts <= p.ts and o.end_ts > p.ts order by o.ts desc, o.end_ts desc limit 1)"""

# Each rank's profiler steps: the CPU span (`ts`, `dur`, `end_ts`) and the launched window
# (analysis/step_windows.py): a GPU slice belongs to the step whose span is the last to start
# by its launch (its incoming flow's source, the lowest id where several), where the launch is
# before that span ends. The window's end is then the running maximum of each step's own end
# (its span's end, or its launched work's, if later), and its start its span's start, or the
# previous window's end, if later: what owned_step_windows computes step by step.
_STEP = f"""
with mine as materialized (
  select id, ts, end_ts, name, role, rank_document, pp_rank, global_rank, rank from cgtrace_slice
  where (role = '{TrackRole.LANE.value}' and dur > 0)
     or (name glob '{PROFILER_STEP_PREFIX}[0-9]*' and role = '{TrackRole.PLAIN.value}' and dur > 0
         and coalesce(category, '') not in ({_GPU_ANNOTATIONS}))),
span as materialized (
  select rank_document, pp_rank, global_rank, rank, cast(substr(name, {len(PROFILER_STEP_PREFIX) + 1}) as int) as step,
         name, min(ts) as ts, max(end_ts) as end_ts,
         row_number() over (partition by rank_document order by min(ts), name) as nth
  from mine where role = '{TrackRole.PLAIN.value}' group by rank_document, name),
launch as (
  select g.rank_document, l.ts as at, null as nth, g.end_ts as gpu_end_ts
  from mine g join (select slice_in, min(slice_out) as launch from flow group by slice_in) f on f.slice_in = g.id
  join cgtrace_all_slice l on l.id = f.launch
  where g.role = '{TrackRole.LANE.value}' and {_measured("l.category")}),
latest as (
  select rank_document, at, gpu_end_ts,
         max(nth) over (partition by rank_document order by at, nth is null rows unbounded preceding) as nth
  from (select rank_document, ts as at, nth, null as gpu_end_ts from span union all select * from launch)),
own as (
  select s.*, max(s.end_ts, coalesce(max(l.gpu_end_ts), s.end_ts)) as own_end_ts
  from span s left join latest l on l.rank_document is s.rank_document and l.nth = s.nth
    and l.gpu_end_ts is not null and l.at < s.end_ts
  group by s.rank_document, s.nth)
select rank_document, pp_rank, global_rank, rank, step, name, ts, end_ts - ts as dur, end_ts,
       max(ts, coalesce(max(own_end_ts) over earlier, ts)) as window_ts,
       max(own_end_ts) over so_far - max(ts, coalesce(max(own_end_ts) over earlier, ts)) as window_dur,
       max(own_end_ts) over so_far as window_end_ts
from own
window so_far as (partition by rank_document order by nth rows unbounded preceding),
       earlier as (partition by rank_document order by nth rows between unbounded preceding and 1 preceding)"""

# Each GPU's windows, as the report bounds its figures: its rank's profiler steps (both
# bounds of cgtrace_step), or, where its rank has none, its active span (from its first lane
# slice's start to its last one's end) as the one row of both bounds, so a GPU figure is one
# join whether or not its trace has steps.
_WINDOW = f"""
with gpu as materialized (
  select gpu_track_id, rank_document, pp_rank, global_rank, rank, min(ts) as ts, max(end_ts) as end_ts
  from cgtrace_slice where role = '{TrackRole.LANE.value}' and dur > 0 group by gpu_track_id, rank_document),
step as materialized (select * from cgtrace_step)
select g.gpu_track_id, g.rank_document, g.pp_rank, g.global_rank, g.rank, w.step, w.name, w.ts, w.dur, w.end_ts,
       w.window_ts, w.window_dur, w.window_end_ts
from gpu g join step w on w.rank_document is g.rank_document
union all
select gpu_track_id, rank_document, pp_rank, global_rank, rank, null, '{ACTIVE_SPAN}', ts, end_ts - ts, end_ts,
       ts, end_ts - ts, end_ts
from gpu g where not exists (select 1 from step w where w.rank_document is g.rank_document)"""

# Each stage's steps (their launched windows, as the report bounds them by default) cut where
# any of its spans begins or ends: in each piece nothing changes, so every part of the anatomy
# is a sum of whole pieces.
_STAGE_PIECE = """
with span as materialized (select rank_document, what, ts, end_ts from cgtrace_stage_span),
stage as (select distinct rank_document from span where what not in ('compute', 'communication', 'communication op')),
step as materialized (
  select rank_document, step, window_ts as ts, window_end_ts as end_ts from cgtrace_step where rank_document in stage
  union all select distinct rank_document, null, window_ts, window_end_ts from cgtrace_window
  where step is null and rank_document in stage),
clipped as (
  select w.rank_document, w.step, s.what, max(s.ts, w.ts) as ts, min(s.end_ts, w.end_ts) as end_ts
  from span s join step w on w.rank_document = s.rank_document
    and s.ts < w.end_ts and s.end_ts > w.ts),
edge as (
  select rank_document, step, what, ts as at, 1 as delta from clipped
  union all select rank_document, step, what, end_ts, -1 from clipped
  union all select rank_document, step, 'step', ts, 0 from step
  union all select rank_document, step, 'step', end_ts, 0 from step),
point as (
  select rank_document, step, at,
         sum(case when what = 'compute' then delta else 0 end) as compute,
         sum(case when what = 'communication op' then delta else 0 end) as halting,
         sum(case when what in ('communication', 'communication op') then delta else 0 end) as communication,
         sum(case when what in ('receive block', 'receive op') then delta else 0 end) as receive,
         sum(case when what = 'receive block' then delta else 0 end) as receive_block,
         sum(case when what = 'send block' then delta else 0 end) as send_block,
         sum(case when what = 'compute action' then delta else 0 end) as compute_action
  from edge group by rank_document, step, at),
piece as (
  select rank_document, step, at as ts, lead(at) over (partition by rank_document, step order by at) as end_ts,
         sum(compute) over running > 0 and sum(halting) over running = 0 as computing,
         sum(communication) over running > 0 as communicating, sum(receive) over running > 0 as receiving,
         sum(receive_block) over running > 0 as in_receive_block, sum(send_block) over running > 0 as in_send_block,
         sum(compute_action) over running > 0 as in_compute_action
  from point window running as (partition by rank_document, step order by at rows unbounded preceding)),
bounds as (
  select rank_document, step, max(end_ts) as step_end_ts,
         coalesce(min(case when computing and in_compute_action then ts end), min(case when computing then ts end))
           as first_compute,
         coalesce(max(case when computing and in_compute_action then end_ts end),
                  max(case when computing then end_ts end)) as last_compute
  from piece where end_ts is not null group by rank_document, step)
select p.rank_document, k.pp_rank, k.global_rank, k.rank, p.step, p.ts, p.end_ts, p.end_ts - p.ts as dur,
       case when p.computing then 'compute' when p.end_ts <= coalesce(b.first_compute, b.step_end_ts) then 'warm-up'
            when p.ts >= b.last_compute then 'drain' when p.receiving then 'receive wait'
            when p.communicating then 'exposed communication' else 'other' end as part,
       p.computing, p.communicating, p.receiving, p.in_receive_block, p.in_send_block, p.in_compute_action
from piece p join bounds b on b.rank_document = p.rank_document and b.step is p.step
join cgtrace_rank k on k.document = p.rank_document
where p.end_ts is not null"""

# Where a collective's message (its collective, dtype and element counts) is read from: the
# kernel's own args, else the nccl:* op its launch ran in (the report's `message_from` too).
KERNEL_ARGS = "kernel args"
OP_INPUT = "launching nccl:* op's input"
_OP_INPUT_SQL = OP_INPUT.replace("'", "''")


# Every NCCL collective kernel matched across ranks as analysis/stragglers.py matches them: the
# k-th (`kind_index`) of a kind on a process group on every rank that has it, the kind being
# the collective and its size where the kernel records them, else the kernel's name (before
# its "("); where some kernels name a group, those that name none are left out; a kind is
# matched where at least two ranks run it, each as many times. Each member carries its
# message: the kernel's args, else its launching nccl:* op's first input (the product of its
# Input Dims, its Input type), and S, NCCL-tests' message size (the larger count times the
# element's bytes; none for an all-gather known only from its input).
_COLLECTIVE_MEMBER = f"""
with recursive kernel as materialized (
  select s.id, s.rank_document, s.ts, s.end_ts, s.arg_set_id,
         extract_arg(s.arg_set_id, 'debug.args.Process Group Name') as pg,
         extract_arg(s.arg_set_id, 'debug.args.Collective name') as named,
         extract_arg(s.arg_set_id, 'debug.args.dtype') as dtype,
         extract_arg(s.arg_set_id, 'debug.args.In msg nelems') as in_nelems,
         extract_arg(s.arg_set_id, 'debug.args.Out msg nelems') as out_nelems,
         extract_arg(s.arg_set_id, 'debug.args.Group size') as group_size,
         case when instr(s.name, '(') > 0 then substr(s.name, 1, instr(s.name, '(') - 1) else s.name end as kernel
  from cgtrace_slice s where s.dur > 0 and s.category in ({sql_list(KERNEL_CATEGORIES)})
    and ({" or ".join(f"s.name glob '{prefix}*'" for prefix in NCCL_KERNEL_PREFIXES)})),
arrival as materialized (
  select k.*,
         case when k.pg is not null then 'group ' || k.pg || ' [' || coalesce(
           (select group_concat(a.int_value, ',') from args a where a.arg_set_id = k.arg_set_id
              and a.key glob 'debug.args.Process Group Ranks[[]*'),
           replace(replace(replace(extract_arg(k.arg_set_id, 'debug.args.Process Group Ranks'), ' ', ''), '[', ''),
                   ']', ''), '') || ']' end as process_group,
         case when k.named is null then k.kernel
              else k.named || coalesce(' (' || nullif(rtrim(coalesce('dtype ' || k.dtype || ', ', '')
                                                             || coalesce('in ' || k.in_nelems || ', ', '')
                                                             || coalesce('out ' || k.out_nelems || ', ', ''), ', '), '')
                                        || ')', '') end as kind
  from kernel k where k.named is null or k.named not in ({sql_list(POINT_TO_POINT)})),
kept as materialized (
  select *, row_number() over (partition by rank_document, process_group, kind order by ts) - 1 as kind_index
  from arrival a
  where process_group is not null or not exists (select 1 from arrival n where n.process_group is not null)),
matched as (
  select process_group, kind from (
    select process_group, kind, rank_document, count(*) as n from kept group by process_group, kind, rank_document)
  group by process_group, kind having count(*) >= 2 and min(n) = max(n)),
member as materialized (
  select k.*, dense_rank() over (order by k.process_group, k.kind, k.kind_index) as collective_id
  from kept k join matched m on m.process_group is k.process_group and m.kind = k.kind),
launched as materialized (
  select m.id, o.name as op, o.arg_set_id as op_args from (
    select k.id, (select a.id from ancestor_slice(f.launch) a where a.name glob '{NCCL_OP}*'
                  order by a.depth desc limit 1) as op_id
    from member k join (select slice_in, min(slice_out) as launch from flow group by slice_in) f on f.slice_in = k.id
    where k.named is null) m
  join cgtrace_all_slice o on o.id = m.op_id),
dim as materialized (
  select l.id, a.int_value as size, row_number() over (partition by l.id order by a.id) as i
  from launched l join args a on a.arg_set_id = l.op_args and a.key glob 'debug.args.Input Dims[[]0][[]*'
  where a.int_value is not null),
product(id, i, elements) as (
  select id, i, size from dim where i = 1
  union all select p.id, d.i, p.elements * d.size from product p join dim d on d.id = p.id and d.i = p.i + 1),
op_input as (
  select l.id, substr(l.op, {len(NCCL_OP) + 1}) as collective, extract_arg(l.op_args, 'debug.args.Input type[0]') as dtype,
         (select p.elements from product p where p.id = l.id order by p.i desc limit 1) as in_nelems
  from launched l where (select min(size) from dim d where d.id = l.id) >= 0),
message as (
  select m.*, r.pp_rank, r.global_rank, r.rank,
         case when m.named is not null then '{KERNEL_ARGS}'
              when typeof(o.dtype) = 'text' and o.in_nelems is not null then '{_OP_INPUT_SQL}' end
           as message_from,
         o.collective as op_collective, o.dtype as op_dtype, o.in_nelems as op_in_nelems
  from member m left join op_input o on o.id = m.id left join cgtrace_rank r on r.document = m.rank_document),
said as (
  select id as slice_id, rank_document, pp_rank, global_rank, rank, ts, end_ts, end_ts - ts as dur, collective_id,
         process_group, kind, kind_index,
         case message_from when '{KERNEL_ARGS}' then named else op_collective end as collective,
         case message_from when '{KERNEL_ARGS}' then dtype else op_dtype end as dtype,
         case message_from when '{KERNEL_ARGS}' then (case when typeof(in_nelems) = 'integer' then in_nelems end)
              else op_in_nelems end as in_nelems,
         case when message_from = '{KERNEL_ARGS}' and typeof(out_nelems) = 'integer' then out_nelems end as out_nelems,
         case when message_from = '{KERNEL_ARGS}' and typeof(group_size) = 'integer' then group_size end as group_size,
         message_from
  from message)
select *, case when message_from = '{_OP_INPUT_SQL}'
                    and instr(lower(replace(collective, '_', '')), 'allgather') > 0 then null
               else max(coalesce(in_nelems, out_nelems), coalesce(out_nelems, in_nelems))
                    * (case dtype {" ".join(f"when '{name}' then {size}" for name, size in DTYPE_BYTES.items())} end)
          end as bytes
from said"""

# Every view but cgtrace_all_slice, in the order they can be created; each reads only earlier ones.
_VIEWS: tuple[tuple[str, str], ...] = (
    ("cgtrace_derived_slice", f"""
select *, case category {_DERIVED_AS} end as derived_as from cgtrace_all_slice where category in ({_DERIVED})"""),
    ("cgtrace_roles", f"""
select id as document, str_value as roles from metadata where name glob 'cr-*{roles_document.NAME}'"""),
    ("cgtrace_rank", """
select document, json_extract(roles, '$.rank.pp_rank') as pp_rank,
       json_extract(roles, '$.rank.global_rank') as global_rank,
       coalesce(json_extract(roles, '$.rank.pipeline'), 1) as in_pipeline,
       json_extract(roles, '$.rank.title') as rank,
       json_extract(roles, '$.rank.clock.offset_ns') as clock_offset_ns,
       json_extract(roles, '$.rank.clock.uncertainty_ns') as clock_uncertainty_ns,
       json_extract(roles, '$.rank.clock.evidence') as clock_evidence
from cgtrace_roles where json_extract(roles, '$.rank') is not null"""),
    ("cgtrace_track_role", """
select r.document, json_extract(j.value, '$.uuid') as uuid, json_extract(j.value, '$.role') as role,
       json_extract(j.value, '$.group') as lane_group, json_extract(j.value, '$.label') as lane_label,
       json_extract(j.value, '$.kind') as kind, json_extract(j.value, '$.home') as home,
       coalesce(json_extract(j.value, '$.layer'), 0) as layer, json_extract(j.value, '$.device') as device
from cgtrace_roles r, json_each(r.roles, '$.tracks') j"""),
    ("cgtrace_track", f"""
with recursive uuids as (
  select t.id as track_id, a.int_value as uuid from track t
  join args a on a.arg_set_id = t.source_arg_set_id and a.key = 'trace_id'),
up(track_id, ancestor, depth) as (
  select id, id, 0 from track
  union all select up.track_id, t.parent_id, up.depth + 1 from up join track t on t.id = up.ancestor
  where t.parent_id is not null),
rank_groups as (
  select up.track_id, up.depth, r.document from up join uuids u on u.track_id = up.ancestor
  join cgtrace_roles r join json_each(r.roles, '$.rank.groups') g on g.value = u.uuid),
grouped as (select track_id, document from rank_groups g
            where depth = (select min(depth) from rank_groups n where n.track_id = g.track_id)),
gpus as (
  select up.track_id, up.depth, up.ancestor from up join uuids u on u.track_id = up.ancestor
  join cgtrace_track_role r on r.uuid = u.uuid and r.role = '{TrackRole.LANES.value}'),
only_rank as (select min(document) as document from cgtrace_rank having count(*) = 1)
select t.id as track_id, t.name, t.parent_id, u.uuid, coalesce(r.role, '{TrackRole.PLAIN.value}') as role,
       r.lane_group, r.lane_label, r.kind, r.layer, r.device,
       (select g.ancestor from gpus g where g.track_id = t.id order by g.depth limit 1) as gpu_track_id,
       k.document as rank_document, k.pp_rank, k.global_rank, k.rank
from track t left join uuids u on u.track_id = t.id
left join cgtrace_track_role r on r.uuid = u.uuid
left join cgtrace_rank k on k.document = coalesce(
  (select document from grouped g where g.track_id = t.id),
  (select document from cgtrace_rank where document = r.document),
  (select document from only_rank))"""),
    # Tracks made once: joined as a view, each slice would walk its track's ancestors again.
    ("cgtrace_slice", f"""
with t as materialized (select * from cgtrace_track)
select s.id, s.ts, s.dur, s.ts + s.dur as end_ts, s.name, s.category, s.depth, s.parent_id, s.arg_set_id,
       s.track_id, t.role, t.lane_group, t.lane_label, t.kind, t.gpu_track_id,
       t.rank_document, t.pp_rank, t.global_rank, t.rank
from cgtrace_all_slice s join t on t.track_id = s.track_id
where {_measured("s.category")}"""),
    ("cgtrace_step", _STEP),
    ("cgtrace_window", _WINDOW),
    ("cgtrace_stage_span", _STAGE_SPAN),
    ("cgtrace_stage_piece", _STAGE_PIECE),
    # Tracks made once, as in cgtrace_slice.
    ("cgtrace_transfer", """
with t as materialized (select track_id, rank_document, rank, global_rank, pp_rank from cgtrace_track)
select f.id as flow_id, so.id as send_slice_id, so.name as send_name, so.ts as send_ts, so.ts + so.dur as send_end_ts,
       fr.rank as from_rank, fr.global_rank as from_global_rank, fr.pp_rank as from_pp_rank,
       si.id as arrival_slice_id, si.name as arrival_name, si.ts as arrival_ts,
       tr.rank as to_rank, tr.global_rank as to_global_rank, tr.pp_rank as to_pp_rank
from flow f join cgtrace_all_slice so on so.id = f.slice_out join cgtrace_all_slice si on si.id = f.slice_in
join t fr on fr.track_id = so.track_id join t tr on tr.track_id = si.track_id
where fr.rank_document is not tr.rank_document"""),
    ("cgtrace_collective_member", _COLLECTIVE_MEMBER),
    ("cgtrace_critical_path", f"""
select s.id, s.ts, s.dur, s.ts + s.dur as end_ts, s.name, extract_arg(s.arg_set_id, 'debug.args.kind') as kind,
       extract_arg(s.arg_set_id, 'debug.args.step') as step,
       extract_arg(s.arg_set_id, 'debug.args.pp_rank') as pp_rank,
       extract_arg(s.arg_set_id, 'debug.args.global_rank') as global_rank, s.track_id
from cgtrace_derived_slice s where s.category = '{derived.CRITICAL_PATH}'"""),
    # Each counter track's meaning found once, not once per sample.
    ("cgtrace_counter", f"""
with t as materialized (
  select *,
         case when t.role = '{TrackRole.LANES.value}' then 'gpu activity'
              when t.role = '{TrackRole.MEMORY_ALLOCATED.value}' then 'memory allocated'
              when t.role = '{TrackRole.MEMORY_RESERVED.value}' then 'memory reserved'
              when t.role = '{TrackRole.IDLE_CAUSE.value}' then 'idle cause'
              when t.role = '{TrackRole.QUEUE_DEPTH.value}' then 'queue depth'
              when t.rank_document is not null and t.track_id in (
                select u.track_id from cgtrace_track u join cgtrace_roles r
                join json_each(r.roles, '$.rank.groups') g on g.value = u.uuid) then 'rank activity'
              when exists (select 1 from cgtrace_track k where k.parent_id = t.track_id
                           and k.role = '{TrackRole.CRITICAL_PATH.value}') then 'critical path level'
              when exists (select 1 from cgtrace_track k where k.parent_id = t.track_id
                           and k.rank_document is not null) then 'pipeline computing'
              else 'other' end as meaning
  from cgtrace_track t where t.track_id in (select track_id from counter))
select c.id, c.ts, c.value, c.track_id, t.name as track, t.meaning,
       t.device, t.gpu_track_id, t.rank_document, t.pp_rank, t.global_rank, t.rank
from counter c join t on t.track_id = c.track_id"""),
)

# trace_processor defines `slice` as a view over its intrinsic table; its body is reused, so
# the narrowed view keeps every column (cat, slice_id, ...) that version gives.
_VIEW_BODY = re.compile(r"^\s*create\s+view\s+slice\s+as\s+(?P<body>.+)$", re.IGNORECASE | re.DOTALL)
_DEFINITION_SQL = "select sql from sqlite_master where type = 'view' and name = 'slice'"
_MARKED_SQL = f"select count(*) as n from ({roles_document.SQL})"


def printed() -> str:
    """The statements as `cgtrace sql` prints them: for a trace processor whose `slice` holds
    every row (the UI's), so it stays as it is."""
    statements = ["create view cgtrace_all_slice as select * from slice"]
    statements += [f"create view {name} as{body}" for name, body in _VIEWS]
    return f"-- cgtrace SQL tables, version {VERSION}: docs/sql.md\n" + ";\n".join(statements) + ";\n"


class TablesUndefined(CgtraceError):
    """A view of cgtrace's fails in this trace_processor: the views' fault, or the version's,
    never the trace's."""


def define(tp: Any, trace: str) -> None:
    """Defines the views in an open trace processor; in a trace cgtrace wrote, where this
    trace_processor defines `slice` as a view (every version cgtrace runs does), `slice`
    becomes the measured slices only. `trace`: the trace as messages name it."""
    found = [row.sql for row in tp.query(_DEFINITION_SQL)] if next(iter(tp.query(_MARKED_SQL))).n else []
    match = _VIEW_BODY.match(found[0]) if found else None
    if match is None:
        _run(tp, "create view cgtrace_all_slice as select * from slice", "cgtrace_all_slice", trace)
    else:
        body = match.group("body")
        _run(tp, f"create view cgtrace_all_slice as {body}", "cgtrace_all_slice", trace)
        _run(tp, "drop view slice", "slice", trace)
        _run(tp, f"create view slice as select * from cgtrace_all_slice where {_measured('category')}", "slice", trace)
    for name, body in _VIEWS:
        _run(tp, f"create view {name} as{body}", name, trace)


def check(tp: Any, trace: str) -> None:
    """Raises TablesUndefined where a view defined in `tp` does not compile there. SQLite
    compiles a view only when a query first reads it, so a view that reads a table or column
    this trace_processor lacks would fail inside the user's query, as if the query were wrong."""
    defined = {row.name for row in tp.query("select name from sqlite_master where type = 'view'")}
    for name in ("cgtrace_all_slice", *(name for name, _ in _VIEWS)):
        if name in defined:
            _run(tp, f"select * from {name} limit 0", name, trace)


def _run(tp: Any, sql: str, view: str, trace: str) -> None:
    """Runs one statement of the views' SQL; its failure blames the views and the
    trace_processor, in one line that says what to do."""
    try:
        tp.query(sql)
    except TraceProcessorException as error:
        lines = str(error).strip().splitlines()
        built_in = isinstance(tp.http, WasmBackend)
        raise TablesUndefined(
            f"{trace}: cgtrace's SQL view {view} (tables version {VERSION}) fails in "
            f"{tp.http.status().human_readable_version or 'this trace_processor'}: "
            f"{lines[-1] if lines else 'unknown error'}; the trace is not at fault: "
            + ("report this line to cgtrace's maintainers (`cgtrace sql` prints the views)" if built_in else
               f"pass --tp-bin a trace_processor_shell of Perfetto {OLDEST_PERFETTO} or newer, or leave --tp-bin "
               "out to use the built-in one")) from None
