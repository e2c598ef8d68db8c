#!/usr/bin/env python3
"""What aligning clocks adds to a merge: the clock estimate's own cost on many generated ranks.

    .venv/bin/python benchmarks/clock_cost.py                 # 64 ranks: 8 pipelines of 8, clocks off by ms
    .venv/bin/python benchmarks/clock_cost.py --pp 4 --dp 4

Each rank is read and compacted as a merge's first pass does (not timed: that is the merge
itself); then timed: finding each rank's collectives (pass one's extra work), pairing each
pipeline's sends and receives for their bounds, the estimate, and pairing again on the corrected
clocks, as a merge whose ranks disagree does. Prints JSON: seconds per part and in all.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from converter.engine.clock import estimate_clocks, find_collectives  # noqa: E402
from converter.engine.pp_pairs import pair_sends_and_receives  # noqa: E402
from converter.generator import write_pp_run  # noqa: E402
from converter.jobs.runner import JobOptions, prepare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=8, help="ranks per pipeline")
    parser.add_argument("--dp", type=int, default=8, help="pipelines")
    parser.add_argument("--steps", type=int, default=4, help="profiler steps per rank")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    world = args.pp * args.dp
    offsets = [random.Random(args.seed + rank).randint(-3_000_000, 3_000_000) for rank in range(world)]
    options = JobOptions(compact=True)
    with tempfile.TemporaryDirectory() as scratch:
        files = write_pp_run(Path(scratch), args.pp, dp_size=args.dp, microbatches=args.pp, steps=args.steps,
                             seed=args.seed, graphs_per_step=6, kernels_per_replay=16, clock_offsets_ns=offsets)
        prepared = [prepare(path, options, options.lanes) for path in files]
    finding = time.perf_counter()
    collectives = [find_collectives(rank.trace) for rank in prepared]
    finding = time.perf_counter() - finding
    pipelines: dict[tuple[int, ...], list[int]] = {}
    for index, rank in enumerate(prepared):
        pipelines.setdefault(rank.header.pp_group or (), []).append(index)
    pairing = estimating = 0.0
    for members in pipelines.values():
        members.sort(key=lambda k: prepared[k].header.pp_rank)
        extents = [{key: block.extent() for key, block in prepared[k].blocks.items()} for k in members]
        global_ranks = [prepared[k].header.rank or 0 for k in members]
        start = time.perf_counter()
        bounds = pair_sends_and_receives(extents, global_ranks).bounds
        middle = time.perf_counter()
        clocks = estimate_clocks([collectives[k] for k in members], bounds, [f"rank {g}" for g in global_ranks])
        end = time.perf_counter()
        shifted = [{key: extent.shifted(rank.offset_ns) for key, extent in blocks.items()}
                   for blocks, rank in zip(extents, clocks.ranks)]
        again = time.perf_counter()
        pair_sends_and_receives(shifted, global_ranks)
        pairing += (middle - start) + (time.perf_counter() - again)
        estimating += end - middle
    collective_count = sum(found.count() for found in collectives)
    print(json.dumps({"ranks": world, "pipelines": len(pipelines), "collectives": collective_count,
                      "slices": sum(len(rank.trace.slices) for rank in prepared), "find_collectives_s": round(finding, 3),
                      "pairing_s": round(pairing, 3), "estimate_s": round(estimating, 3),
                      "total_s": round(finding + pairing + estimating, 3)}, indent=1))


if __name__ == "__main__":
    main()
