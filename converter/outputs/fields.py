"""The field numbers and enum values the writer emits, named as proto/cgtrace_subset.proto names them.

The writer encodes packets by hand (wire.py) instead of loading protobuf's generated classes
(start-up time, and perfetto's package on every import), so it needs the bare numbers; they
are named here once. A class stands for a message of the subset, its upper-cased attributes
for the message's fields and its nested classes for the message's enums (nonzero values only:
the default is never written). tests/test_proto_subset.py checks this module against the
.proto both ways, so the .proto stays the one source.
"""

from typing import Final


class Trace:
    PACKET: Final = 1


class TracePacket:
    class SequenceFlags:
        SEQ_INCREMENTAL_STATE_CLEARED: Final = 1
        SEQ_NEEDS_INCREMENTAL_STATE: Final = 2

    CHROME_EVENTS: Final = 5
    TIMESTAMP: Final = 8
    TRUSTED_PACKET_SEQUENCE_ID: Final = 10
    TRACK_EVENT: Final = 11
    INTERNED_DATA: Final = 12
    SEQUENCE_FLAGS: Final = 13
    TRACK_DESCRIPTOR: Final = 60
    FIRST_PACKET_ON_SEQUENCE: Final = 87


class ChromeEventBundle:
    METADATA: Final = 2


class ChromeMetadata:
    NAME: Final = 1
    STRING_VALUE: Final = 2


class TrackDescriptor:
    class ChildTracksOrdering:
        EXPLICIT: Final = 3

    class SiblingMergeBehavior:
        SIBLING_MERGE_BEHAVIOR_NONE: Final = 2

    UUID: Final = 1
    NAME: Final = 2
    PROCESS: Final = 3
    THREAD: Final = 4
    PARENT_UUID: Final = 5
    COUNTER: Final = 8
    CHILD_ORDERING: Final = 11
    SIBLING_ORDER_RANK: Final = 12
    SIBLING_MERGE_BEHAVIOR: Final = 15


class ProcessDescriptor:
    PID: Final = 1
    PROCESS_NAME: Final = 6
    PROCESS_LABELS: Final = 8


class ThreadDescriptor:
    PID: Final = 1
    TID: Final = 2
    THREAD_NAME: Final = 5


class CounterDescriptor:
    UNIT_NAME: Final = 6
    Y_AXIS_SHARE_KEY: Final = 7


class TrackEvent:
    class Type:
        TYPE_SLICE_BEGIN: Final = 1
        TYPE_SLICE_END: Final = 2
        TYPE_INSTANT: Final = 3
        TYPE_COUNTER: Final = 4

    CATEGORY_IIDS: Final = 3
    DEBUG_ANNOTATIONS: Final = 4
    TYPE: Final = 9
    NAME_IID: Final = 10
    TRACK_UUID: Final = 11
    DOUBLE_COUNTER_VALUE: Final = 44
    FLOW_IDS: Final = 47
    TERMINATING_FLOW_IDS: Final = 48


class DebugAnnotation:
    NAME_IID: Final = 1
    BOOL_VALUE: Final = 2
    UINT_VALUE: Final = 3
    INT_VALUE: Final = 4
    DOUBLE_VALUE: Final = 5
    STRING_VALUE: Final = 6
    LEGACY_JSON_VALUE: Final = 9
    DICT_ENTRIES: Final = 11
    ARRAY_VALUES: Final = 12


class InternedData:
    EVENT_CATEGORIES: Final = 1
    EVENT_NAMES: Final = 2
    DEBUG_ANNOTATION_NAMES: Final = 3


class EventCategory:
    IID: Final = 1
    NAME: Final = 2


class EventName:
    IID: Final = 1
    NAME: Final = 2


class DebugAnnotationName:
    IID: Final = 1
    NAME: Final = 2
