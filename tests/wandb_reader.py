"""Reads back what a W&B run wrote offline (`run-<id>.wandb`): the file is a LevelDB-style
log (7-byte file header, then records of checksum, length and type in 32 KiB blocks)
whose payloads are wandb's protobuf `Record`s. Returns the history rows and the config."""
import json
from typing import Dict, List, Tuple

BLOCK = 32768
HEADER = 7           # ":W&B", magic (2 bytes), version


def payloads(path: str) -> List[bytes]:
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pos, pending = [], HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:                       # a block's tail too short for a header: padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        if kind == 0:                      # zero-filled rest of a block
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def read_run(path: str) -> Tuple[List[Dict[str, float]], Dict[str, object], str]:
    """(history rows as {key: value}, config {section: value}, run id)."""
    from wandb.proto import wandb_internal_pb2 as pb
    history, config, run_id = [], {}, ""
    for raw in payloads(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "run":
            run_id = record.run.run_id
            for item in record.run.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return history, config, run_id
