"""Codes files (toolkit.bin.codec): an .npz of the codes (n_q, frames) and what decoding
them needs, the sample rate, hop and length of the decoded audio and the fingerprint of the
model that encoded them. Reading checks every field, so a file cut short, damaged or written
by another program is refused in one line naming the file and what is wrong, never with
numpy's or zipfile's own errors."""
import os
import zipfile
import zlib
from typing import Any, Dict, Optional

import numpy as np

from toolkit.errors import DataError, MissingInputError

CODES_FORMAT = "toolkit-codec-codes"
CODES_VERSION = 1
_INT_FIELDS = ("version", "sample_rate", "hop", "length", "codebook_size")
FIELDS = ("format", "codes", "fingerprint") + _INT_FIELDS
_ZIP_MAGIC = b"PK\x03\x04"


def write_codes(path: str, codes: np.ndarray, codec, length: int) -> None:
    """An .npz: codes (n_q, frames) int16 (int32 for codebooks above 2^15 entries), the
    sample rate, hop and length of the audio that decoding gives (the codec's output rate),
    and the fingerprint of the model that decodes them. Written under a temporary name,
    then renamed, so a crash never leaves a partial file under `path`."""
    dtype = np.int16 if codec.codebook_size <= 2 ** 15 else np.int32
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, format=np.array(CODES_FORMAT), version=np.array(CODES_VERSION),
                 codes=np.asarray(codes).astype(dtype), sample_rate=np.array(codec.sample_rate),
                 hop=np.array(codec.hop), length=np.array(int(length), dtype=np.int64),
                 codebook_size=np.array(codec.codebook_size),
                 fingerprint=np.array(codec.fingerprint))
    os.replace(tmp, path)


def _load_fields(path: str) -> Dict[str, np.ndarray]:
    """The arrays of a codes file, after checking it is one of ours (its `format`)."""
    if not os.path.exists(path):
        raise MissingInputError(f"{path} not found")
    if not zipfile.is_zipfile(path):
        # An .npz is a zip archive; one cut short has lost the directory at its end.
        with open(path, "rb") as f:
            head = f.read(len(_ZIP_MAGIC))
        if head == _ZIP_MAGIC:
            raise DataError(f"{path}: codes file cut short or damaged (its .npz archive has "
                            "no end): encode the audio again")
        raise DataError(f"{path} is not a codes file written by toolkit.bin.codec encode "
                        "(not an .npz archive)")
    field = "format"
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile) or "format" not in data.files \
                    or str(data["format"]) != CODES_FORMAT:
                raise DataError(f"{path} is not a codes file written by toolkit.bin.codec "
                                "encode (no 'format' field of that name)")
            missing = [k for k in FIELDS if k not in data.files]
            if missing:
                raise DataError(f"{path}: codes file without field(s) "
                                f"{', '.join(repr(k) for k in missing)}: damaged or written "
                                "by another program; encode the audio again")
            fields = {}
            for field in FIELDS:
                fields[field] = data[field]
            return fields
    except DataError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error) as err:
        raise DataError(f"{path}: codes file damaged (field '{field}': {err}); encode the "
                        "audio again") from None


def _int_field(fields: Dict[str, np.ndarray], key: str, path: str) -> int:
    value = fields[key]
    if value.shape != () or value.dtype.kind not in "iu":
        raise DataError(f"{path}: field '{key}' is not one integer ({value.dtype}, shape "
                        f"{value.shape})")
    return int(value)


def read_codes(path: str, codec=None) -> Dict[str, Any]:
    """A codes file's fields (codes as int64); with `codec` (an ExportedCodec), checks that
    this model can decode them: its fingerprint, codebook size, and n_q in 1..n_codebooks
    (the first n_q codebooks of the residual quantizer: a lower bitrate)."""
    fields = _load_fields(path)
    out = {key: _int_field(fields, key, path) for key in _INT_FIELDS}
    if not 1 <= out["version"] <= CODES_VERSION:
        raise DataError(f"{path}: codes format version {out['version']}; this toolkit reads "
                        f"1..{CODES_VERSION}" + (": update the toolkit"
                                                 if out["version"] > CODES_VERSION else ""))
    for key in ("sample_rate", "hop", "codebook_size"):
        if out[key] <= 0:
            raise DataError(f"{path}: field '{key}' must be positive, got {out[key]}")
    codes, fingerprint = fields["codes"], fields["fingerprint"]
    if codes.ndim != 2 or codes.dtype.kind not in "iu":
        raise DataError(f"{path}: field 'codes' must be integers (n_q, frames), got "
                        f"{codes.dtype} of shape {codes.shape}")
    if fingerprint.shape != () or fingerprint.dtype.kind != "U":
        raise DataError(f"{path}: field 'fingerprint' is not a string")
    frames = codes.shape[1]
    # Encoding records the input's duration, never more than its frames' samples.
    if not 0 <= out["length"] <= frames * out["hop"]:
        raise DataError(f"{path}: length {out['length']} outside the {frames} frames' "
                        f"0..{frames * out['hop']} samples")
    if codes.size and (codes.min() < 0 or codes.max() >= out["codebook_size"]):
        raise DataError(f"{path}: codes outside [0, {out['codebook_size']})")
    out.update(codes=codes.astype(np.int64), fingerprint=str(fingerprint))
    if codec is not None:
        check_decodable(out, path, codec)
    return out


def check_decodable(data: Dict[str, Any], path: str, codec) -> None:
    """Refuses codes that `codec` cannot decode, naming the file."""
    if data["fingerprint"] != codec.fingerprint:
        raise DataError(f"{path} was encoded by the codec model with fingerprint "
                        f"{data['fingerprint']}, but --model is {codec.fingerprint}: decode "
                        "with the model that encoded it")
    if data["codebook_size"] != codec.codebook_size:
        raise DataError(f"{path}: codebooks of {data['codebook_size']} entries, the model's "
                        f"have {codec.codebook_size}")
    n_q = data["codes"].shape[0]
    if not 1 <= n_q <= codec.n_codebooks:
        raise DataError(f"{path}: codes of {n_q} codebooks, the model decodes 1.."
                        f"{codec.n_codebooks} (its first n_q codebooks)")
