"""The trace model: what every reader builds and every engine stage and writer works on."""

from . import derived
from .args import ArgsStore, ExtraArgs, LabelRule, PreparedArgs, decode_json, encode_json
from .trace import (ClockPlacement, CounterSample, CounterScale, Flow, FlowEnd, LaneGroup, LaneKind, Process,
                    RankIdentity, Thread, Trace, Track, TrackRole)
from .slices import NO_ARGS, SliceRow, SliceTable

__all__ = ["NO_ARGS", "ArgsStore", "ClockPlacement", "CounterSample", "CounterScale", "ExtraArgs", "Flow", "FlowEnd", "LabelRule",
           "LaneGroup", "LaneKind", "PreparedArgs", "Process", "RankIdentity", "SliceRow", "SliceTable", "Thread", "Trace", "Track",
           "TrackRole", "decode_json", "derived", "encode_json"]
