"""Small Hugging Face datasets on disk, written without `datasets`' audio encoder (which
needs torchcodec): a parquet directory in the hub's layout (`data/<split>-*.parquet`, the
Audio feature declared in the schema metadata), a `save_to_disk` directory and an
audiofolder (`<split>/*.wav`). Rows are voice-like WAVs at a given rate; `bad` rows hold
undecodable, truncated or silent audio."""
import io
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import soundfile as sf

from speaker_data import speaker_params, voice_wave


def wav_bytes(wave: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.clip(wave, -1, 1).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def rows(prefix: str, count: int, rate: int, seed: int, bad: Sequence[str] = ()) -> List[dict]:
    """`count` rows {audio: {bytes, path}, id, speaker, seconds}; the first len(bad) rows
    are broken: "garbage" (not audio), "truncated" (header longer than the data) or
    "silent" (all zeros: readable, so it fails only when a batch is built)."""
    from speaker_data import RATE
    from toolkit.data.audio import resample
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        pitch, formants = speaker_params(seed * 10 + i % 3)
        seconds = float(rng.uniform(0.6, 1.2))
        wave = resample(voice_wave(rng, pitch, formants, seconds), RATE, rate)
        data = wav_bytes(wave, rate)
        if i < len(bad):
            data = {"garbage": b"this is not audio" * 8, "truncated": data[:len(data) // 2],
                    "silent": wav_bytes(np.zeros_like(wave), rate)}[bad[i]]
        out.append({"audio": {"bytes": data, "path": f"{prefix}{i:03d}.wav"},
                    "id": f"{prefix}{i:03d}", "speaker": i % 3, "seconds": len(wave) / rate})
    return out


FEATURES = {"audio": {"_type": "Audio"}, "id": {"dtype": "string", "_type": "Value"},
            "speaker": {"dtype": "int64", "_type": "Value"},
            "seconds": {"dtype": "float64", "_type": "Value"}}


def write_parquet_dataset(root: str, splits: Dict[str, List[dict]]) -> str:
    """`root/data/<split>-00000-of-00001.parquet`, as datasets on the hub are laid out."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    for split, table_rows in splits.items():
        table = pa.Table.from_pylist(table_rows)
        table = table.replace_schema_metadata(
            {b"huggingface": json.dumps({"info": {"features": FEATURES}}).encode()})
        pq.write_table(table, os.path.join(root, "data", f"{split}-00000-of-00001.parquet"))
    return root


def write_saved_dataset(root: str, table_rows: List[dict], split: Optional[str] = None) -> str:
    """One `Dataset` written by `save_to_disk` (Arrow files + state.json), unsplit or
    recording the name of the split it was cut from."""
    import datasets
    import pyarrow as pa
    table = pa.Table.from_pylist(table_rows)
    features = datasets.Features.from_dict(FEATURES)
    ds = datasets.Dataset(datasets.table.InMemoryTable(table.cast(features.arrow_schema)),
                          info=datasets.DatasetInfo(features=features), split=split)
    ds.save_to_disk(root)
    return root


def write_audio_folder(root: str, split: str, table_rows: List[dict]) -> str:
    """`root/<split>/<id>.wav`: the layout `datasets`' audiofolder builder reads."""
    os.makedirs(os.path.join(root, split), exist_ok=True)
    for row in table_rows:
        with open(os.path.join(root, split, row["id"] + ".wav"), "wb") as f:
            f.write(row["audio"]["bytes"])
    return root
