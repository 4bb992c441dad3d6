"""Reads scalar summaries from real TensorBoard event files (TFRecord framing + the
Event protobuf that tensorboardX ships), without needing TensorBoard itself."""
import struct
from typing import Dict, List, Tuple

from tensorboardX.proto import event_pb2


def read_events(path: str):
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            f.read(4)  # data CRC
            if len(data) < length:
                return
            yield event_pb2.Event.FromString(data)


def scalars(paths: List[str]) -> Dict[str, List[Tuple[int, float]]]:
    out: Dict[str, List[Tuple[int, float]]] = {}
    for path in paths:
        for event in read_events(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def scalar_tags(paths: List[str]):
    return set(scalars(paths))
