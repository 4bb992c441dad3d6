"""An ONNX model's metadata_props, read and rewritten at the protobuf wire level.

Importing the `onnx` package costs about 0.75 CPU-s (its ml_dtypes extension registers
its types with numpy), and every scoring and thresholding step of a recipe only wants one
string out of the model's metadata. ModelProto is a protobuf message whose top-level
fields can be walked without a schema: each is a varint key (field number, wire type)
and a payload. metadata_props is field 14, a repeated StringStringEntryProto (key = 1,
value = 2). Everything else (the graph, the opsets) is copied through byte for byte.
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict, Iterator, List, Tuple

GRAPH, METADATA_PROPS = 7, 14
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class OnnxProtoError(ValueError):
    pass


def _varint(data: bytes, pos: int, where: str) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise OnnxProtoError(f"{where}: truncated protobuf varint at byte {pos}")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise OnnxProtoError(f"{where}: malformed protobuf varint at byte {pos}")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _fields(data: bytes, where: str) -> Iterator[Tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the field, start of its payload, end) of each
    top-level field of a message."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos, where)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, end = _varint(data, pos, where)
        elif wire == _FIXED64:
            end = pos + 8
        elif wire == _FIXED32:
            end = pos + 4
        elif wire == _LENGTH:
            size, pos = _varint(data, pos, where)
            end = pos + size
        else:
            raise OnnxProtoError(f"{where}: protobuf wire type {wire} (field {number}) "
                                 f"at byte {start} is not one ONNX uses: not an ONNX model?")
        if number == 0 or end > len(data):
            raise OnnxProtoError(f"{where}: truncated or corrupt protobuf at byte {start}: "
                                 f"not an ONNX model?")
        yield number, wire, start, pos, end
        pos = end


def _entry(payload: bytes, where: str) -> Tuple[str, str]:
    parts = {1: "", 2: ""}
    for number, wire, _, begin, end in _fields(payload, where):
        if number in parts and wire == _LENGTH:
            parts[number] = payload[begin:end].decode("utf-8")
    return parts[1], parts[2]


def _encode_entry(key: str, value: str) -> bytes:
    body = b""
    for number, text in ((1, key), (2, value)):
        raw = text.encode("utf-8")
        body += _encode_varint(number << 3 | _LENGTH) + _encode_varint(len(raw)) + raw
    return _encode_varint(METADATA_PROPS << 3 | _LENGTH) + _encode_varint(len(body)) + body


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _model_fields(data: bytes, path: str) -> List[Tuple[int, int, int, int, int]]:
    fields = list(_fields(data, path))
    if not any(number == GRAPH and wire == _LENGTH for number, wire, *_ in fields):
        raise OnnxProtoError(f"{path}: no graph in the file: not an ONNX model?")
    return fields


def read_metadata_props(path: str) -> Dict[str, str]:
    """The model's metadata_props as a dict (a later duplicate key wins, as in ONNX
    Runtime)."""
    data = _read(path)
    props = {}
    for number, wire, _, begin, end in _model_fields(data, path):
        if number == METADATA_PROPS and wire == _LENGTH:
            key, value = _entry(data[begin:end], path)
            props[key] = value
    return props


def set_metadata_prop(path: str, key: str, value: str) -> None:
    """Sets one metadata_props entry (replacing that key's entries in place, else appending
    one) and rewrites the file atomically: a kill leaves the old model or the new one."""
    data = _read(path)
    pieces: List[bytes] = []
    written = False
    for number, wire, start, begin, end in _model_fields(data, path):
        if number == METADATA_PROPS and wire == _LENGTH and _entry(data[begin:end], path)[0] == key:
            if not written:
                pieces.append(_encode_entry(key, value))
                written = True
            continue
        pieces.append(data[start:end])
    if not written:
        pieces.append(_encode_entry(key, value))
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".onnx-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(pieces))
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
