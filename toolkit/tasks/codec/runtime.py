"""Running an exported codec (toolkit.tasks.codec.export): `ExportedCodec` encodes and
decodes with the ONNX or TorchScript graphs, whole signals or, for causal models, chunk by
chunk with the left context that keeps chunked output equal to whole-signal output; codes
files (.npz with the fingerprint of the model that decodes them); encoding and decoding of
sound files in constant memory (toolkit.bin.codec).

Rates: `sample_rate` is the rate the codec reconstructs (decoded audio, codes files'
lengths); a codec whose encoder reads another rate (`encoder_sample_rate`, e.g. 16 kHz
codes decoded to 24 kHz) resamples its input to the encoder's rate, so `encode` takes audio
at sample_rate (or any `rate` given) either way.
"""
import os
from typing import Any, Dict, Iterable, Iterator, List, Optional

import numpy as np
import torch

from toolkit.config import ConfigError
from toolkit.errors import DataError, MissingInputError
# The codes-file format lives in codes_file; its names stay importable from here.
from toolkit.tasks.codec.codes_file import (CODES_FORMAT, CODES_VERSION,  # noqa: F401
                                            read_codes, write_codes)
from toolkit.tasks.codec.export import (EXPORT_FORMAT_VERSION, GRAPH_FILES, SAFETENSORS_NAME,
                                        pad_to_hop)

# onnx: onnxruntime on the .onnx graphs; torch: the TorchScript .zip graphs; safetensors:
# PyTorch modules built from model.safetensors + config.json (all a pretrained codec ships)
BACKENDS = ("onnx", "torch", "safetensors")


class ExportedCodec:
    """Encodes and decodes with the graphs of an export dir (onnx: onnxruntime; torch:
    the TorchScript files; safetensors: modules built from the weights, which is all a
    shipped pretrained codec has, `ExportedCodec.pretrained(NAME)`), whole signals or chunk by chunk (causal models). Codes of
    fewer than all codebooks (the first n_q of the residual VQ: a lower bitrate, which
    quantizer dropout trains) decode through the export's safetensors generator, as the
    graphs take every codebook."""

    def __init__(self, export_dir: str, backend: str = "onnx", threads: int = 1):
        self.export_dir, self.threads = export_dir, threads
        self._generator = None
        if backend not in BACKENDS:
            raise ConfigError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        from toolkit.export import onnx_runner, read_metadata, torch_runner
        if backend == "safetensors":
            # A shipped pretrained model holds only the weights and config.json: the
            # graphs are built from them (the same modules the export traces).
            from toolkit.tasks.codec.export import DecoderGraph, EncoderGraph
            path = os.path.join(export_dir, SAFETENSORS_NAME)
            if not os.path.exists(path):
                raise MissingInputError(f"{path} not found: is {export_dir} a codec export "
                                        "(toolkit.bin.export_model) or a pretrained codec?")
            self.metadata = read_metadata(path)
            self._check_task(path)
        else:
            enc, dec = (os.path.join(export_dir, name) for name in GRAPH_FILES[backend])
            for path in (enc, dec):
                if not os.path.exists(path):
                    raise MissingInputError(f"{path} not found: is {export_dir} a codec "
                                            "export (toolkit.bin.export_model)?")
            self.metadata = read_metadata(enc)
            self._check_task(enc)
            if backend == "onnx":
                self._encode, self._decode = onnx_runner(enc, threads), onnx_runner(dec, threads)
            else:
                torch.set_num_threads(threads)
                self._encode = torch_runner(torch.jit.load(enc).eval())
                self._decode = torch_runner(torch.jit.load(dec).eval())
        m = self.metadata
        if int(m.get("format_version", 1)) > EXPORT_FORMAT_VERSION:
            raise DataError(f"{export_dir}: codec export format {m['format_version']} is "
                            f"newer than this toolkit's ({EXPORT_FORMAT_VERSION}): update the toolkit")
        # Output side (decoded audio) and encoder side; one rate in a format-1 export.
        self.sample_rate, self.hop = int(m["sample_rate"]), int(m["hop"])
        self.encoder_sample_rate = int(m.get("encoder_sample_rate") or self.sample_rate)
        self.encoder_hop = int(m.get("encoder_hop") or self.hop)
        self.n_codebooks, self.codebook_size = int(m["n_codebooks"]), int(m["codebook_size"])
        self.causal, self.fingerprint = bool(m["causal"]), str(m["fingerprint"])
        self.bitrate = float(m["bitrate"])
        # A decoder whose stream lags its input: encoding appends the frames of silence that
        # flush it, decoding drops the lag, so decoded audio lines up with what was encoded.
        self.delay = int(m.get("decoder_delay_samples") or 0)
        self.flush_frames = self.delay // self.hop
        if backend == "safetensors":
            generator = self.generator()
            self._encode = torch_runner(EncoderGraph(generator).eval())
            self._decode = torch_runner(DecoderGraph(generator).eval())

    @classmethod
    def pretrained(cls, name: str, threads: int = 1) -> "ExportedCodec":
        """A codec shipped with the toolkit (toolkit/pretrained/NAME), its weights checked
        against the sha256 on its model card first."""
        from toolkit import pretrained
        pretrained.weights(name)
        return cls(pretrained.model_dir(name), "safetensors", threads)

    def _check_task(self, path: str) -> None:
        if self.metadata.get("task") != "codec":
            raise DataError(f"{path} is a {self.metadata.get('task')} model, not a codec")

    def encode(self, wave: np.ndarray, rate: Optional[int] = None) -> np.ndarray:
        """Mono samples at `rate` (default: sample_rate, the rate decode returns) ->
        codes (n_codebooks, frames), resampled to the encoder's rate first when it differs;
        frames = ceil(encoder samples / encoder_hop)."""
        rate = self.sample_rate if rate is None else int(rate)
        if rate != self.encoder_sample_rate:
            from toolkit.data.audio import resample
            wave = resample(wave, rate, self.encoder_sample_rate)
        wave = pad_to_hop(wave, self.encoder_hop)
        if not len(wave):
            return np.zeros((self.n_codebooks, 0), np.int64)
        if self.flush_frames:
            wave = np.concatenate([wave, np.zeros(self.flush_frames * self.encoder_hop,
                                                  wave.dtype)])
        return self._encode(wave[None, None])[0][0]

    def output_length(self, samples: int, rate: int) -> int:
        """Samples at sample_rate of `samples` input samples at `rate` (rounded up)."""
        return -(-int(samples) * self.sample_rate // int(rate))

    def decode(self, codes: np.ndarray, length: Optional[int] = None) -> np.ndarray:
        """codes (n_q, frames), n_q <= n_codebooks -> frames * hop samples less the
        decoder's lag (or `length`), aligned with the encoded audio."""
        codes = np.ascontiguousarray(codes, dtype=np.int64)
        if codes.shape[1] == 0:
            return np.zeros(0, np.float32)
        audio = self._decoder(codes.shape[0])(codes[None])[self.delay:]
        return audio if length is None else audio[:length]

    def _decoder(self, n_q: int):
        """codes (1, n_q, frames) int64 -> frames * hop samples: the graphs for all
        codebooks, the safetensors generator for fewer (the graphs take every codebook)."""
        if n_q == self.n_codebooks:
            return lambda codes: self._decode(codes)[0][0, 0]
        self.check_n_q(n_q)
        generator = self.generator()

        def run(codes: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return generator.decode(torch.from_numpy(codes))[0, 0].numpy()
        return run

    def check_n_q(self, n_q: int) -> int:
        if not 1 <= n_q <= self.n_codebooks:
            raise ConfigError(f"n_q={n_q}: this codec has {self.n_codebooks} codebooks "
                              f"(n_q in 1..{self.n_codebooks})")
        return n_q

    def bitrate_at(self, n_q: int) -> float:
        """Bits per second of the first n_q codebooks."""
        return self.bitrate * self.check_n_q(n_q) / self.n_codebooks

    def generator(self):
        """The export's safetensors generator (PyTorch, eval mode), loaded on first use and
        checked to hold the graphs' weights."""
        if self._generator is None:
            from toolkit.tasks.codec.export import load_safetensors_model, weights_fingerprint
            path = os.path.join(self.export_dir, SAFETENSORS_NAME)
            if not os.path.exists(path):
                raise MissingInputError(f"{path} not found: decoding fewer than all "
                                        f"{self.n_codebooks} codebooks needs it")
            torch.set_num_threads(self.threads)
            model = load_safetensors_model(path)
            if weights_fingerprint(model) != self.fingerprint:
                raise DataError(f"{path} holds other weights than the graphs of "
                                f"{self.export_dir} (fingerprint {weights_fingerprint(model)} "
                                f"vs {self.fingerprint})")
            self._generator = model
        return self._generator

    def _need_causal(self) -> None:
        if not self.causal:
            raise ConfigError("chunked processing needs a causal model (model.causal: true); "
                              "this export is not causal: process whole files")

    def encode_chunks(self, blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Blocks of samples at the encoder's rate in, codes of the frames completed so far
        out (the last, partial frame zero padded at the end, then the frames of silence
        that flush a lagging decoder), equal to encoding the whole
        signal at once: each window re-reads `encoder_context_samples` before its new
        frames."""
        self._need_causal()
        hop, context = self.encoder_hop, int(self.metadata["encoder_context_samples"])
        buffer = np.zeros(0, np.float32)
        buffer_start = total = done = 0
        for block in blocks:
            buffer = np.concatenate([buffer, np.asarray(block, np.float32)])
            total += len(block)
            complete = total // hop
            if complete == done:
                continue
            start = max(0, done * hop - context)
            window = buffer[start - buffer_start:complete * hop - buffer_start]
            yield self._encode(window[None, None])[0][0][:, done - start // hop:]
            done = complete
            keep = max(0, complete * hop - context)
            buffer, buffer_start = buffer[keep - buffer_start:], keep
        if total % hop or (total and self.flush_frames):
            # The last, partial frame and the frames of silence that flush a lagging decoder.
            start = max(0, done * hop - context)
            window = pad_to_hop(buffer[start - buffer_start:], hop)
            window = np.concatenate([window, np.zeros(self.flush_frames * hop, np.float32)])
            yield self._encode(window[None, None])[0][0][:, done - start // hop:]

    def decode_chunks(self, blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Code blocks (n_q, frames), n_q <= n_codebooks, in, frames * hop samples each
        out, equal (to rounding) to decoding all codes at once: `decoder_context_frames` are
        re-read."""
        self._need_causal()
        context = int(self.metadata["decoder_context_frames"])
        kept = decoder = None
        skip = self.delay              # the lag, dropped from the start of the stream
        for block in blocks:
            block = np.asarray(block, np.int64)
            new = block.shape[1]
            if not new:
                continue
            if decoder is None:
                decoder = self._decoder(block.shape[0])
                kept = np.zeros((block.shape[0], 0), np.int64)
            window = np.concatenate([kept, block], axis=1)
            audio = decoder(np.ascontiguousarray(window[None]))[-new * self.hop:]
            kept = window[:, max(0, window.shape[1] - context):]
            if skip:
                audio, skip = audio[skip:], max(0, skip - len(audio))
            if len(audio):
                yield audio


def open_codec(model: str, backend: str = "onnx", threads: int = 1) -> ExportedCodec:
    """An export dir, or `pretrained:NAME` for a codec shipped with the toolkit."""
    from toolkit.pretrained import PREFIX
    if model.startswith(PREFIX):
        return ExportedCodec.pretrained(model[len(PREFIX):], threads)
    return ExportedCodec(model, backend, threads)


# --------------------------------------------------------------------------- files

def _read_blocks(path: str, block: int, counter: List[int]) -> Iterator[np.ndarray]:
    """Mono float32 blocks of a sound file (channels averaged), `counter[0]` the samples
    read so far: only one block is in memory at a time. Every input goes through here,
    streamed or read whole, so the checks are the same at every rate: a WAV cut short and
    NaN or infinite samples are refused; silence is audio like any other."""
    import soundfile as sf
    from toolkit.data.audio import _wav_data_shortfall
    if path.lower().endswith(".wav") and _wav_data_shortfall(path) > 0:
        raise DataError(f"{path}: WAV cut short (its header promises more audio than the "
                        "file holds)")
    with sf.SoundFile(path) as f:
        while True:
            try:
                data = f.read(block, dtype="float32", always_2d=True)
            except RuntimeError as err:
                raise DataError(f"{path}: cannot read audio after sample {counter[0]} "
                                f"({err})") from None
            if not len(data):
                return
            wave = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
            finite = np.isfinite(wave)
            if not finite.all():
                at = counter[0] + int(np.argmin(finite))
                raise DataError(f"{path}: sample {at} ({at / f.samplerate:.3f} s) is NaN or "
                                "infinite: damaged audio, not encoded")
            counter[0] += len(data)
            yield wave


def _check_output_dir(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise MissingInputError(f"{path}: output folder {folder} does not exist")


def _chunk_samples(codec: ExportedCodec, chunk_seconds: float, rate: int, hop: int) -> int:
    """Whole code frames of about `chunk_seconds`, in samples of `hop` per frame."""
    if chunk_seconds <= 0:
        raise ConfigError(f"--chunk-seconds must be positive, got {chunk_seconds}")
    frames = max(1, int(round(chunk_seconds * rate / hop)))
    return frames * hop


def encode_file(codec: ExportedCodec, wav_path: str, codes_path: str,
                chunk_seconds: float = 1.0, n_q: Optional[int] = None) -> Dict[str, Any]:
    """WAV -> codes file of the first `n_q` codebooks (default all; fewer: a lower bitrate,
    the same codes as the first rows of all, as the residual quantizer works codebook by
    codebook). A causal model with the file at its encoder's rate reads and encodes block
    by block (constant memory); otherwise the file is read whole and resampled to the
    encoder's rate. The recorded length is the file's duration at the codec's output rate
    (what decode writes)."""
    import soundfile as sf
    n_q = codec.n_codebooks if n_q is None else int(n_q)
    if not 1 <= n_q <= codec.n_codebooks:
        raise ConfigError(f"--n-q {n_q}: this codec has {codec.n_codebooks} codebooks "
                          f"(give 1..{codec.n_codebooks})")
    if not os.path.exists(wav_path):
        raise MissingInputError(f"{wav_path} not found")
    _check_output_dir(codes_path)
    try:
        rate = sf.info(wav_path).samplerate
    except RuntimeError as err:
        raise DataError(f"{wav_path}: cannot read audio ({err})") from None
    chunk = _chunk_samples(codec, chunk_seconds, codec.encoder_sample_rate, codec.encoder_hop)
    counter = [0]
    if codec.causal and rate == codec.encoder_sample_rate:
        parts = list(codec.encode_chunks(_read_blocks(wav_path, chunk, counter)))
        samples = counter[0]
    else:
        # At the file's own rate, read through the same checks as the streamed case.
        wave = np.concatenate([np.zeros(0, np.float32),
                               *_read_blocks(wav_path, 1 << 16, counter)])
        samples = len(wave)
        if codec.causal:
            from toolkit.data.audio import resample
            wave = resample(wave, rate, codec.encoder_sample_rate)
            parts = list(codec.encode_chunks(wave[i:i + chunk]
                                             for i in range(0, len(wave), chunk)))
        else:
            parts = [codec.encode(wave, rate)]
    codes = (np.concatenate(parts, axis=1) if parts
             else np.zeros((codec.n_codebooks, 0), np.int64))[:n_q]
    length = codec.output_length(samples, rate)
    write_codes(codes_path, codes, codec, length)
    return {"samples": length, "frames": int(codes.shape[1]), "n_q": n_q,
            "seconds": length / codec.sample_rate,
            "resampled_from": rate if rate != codec.encoder_sample_rate else None}


def decode_file(codec: ExportedCodec, codes_path: str, wav_path: str,
                chunk_seconds: float = 1.0) -> Dict[str, Any]:
    """Codes file (all or the first n_q codebooks) -> 16-bit WAV at the model's rate with
    the encoded length; a causal model decodes and writes block by block."""
    import soundfile as sf
    data = read_codes(codes_path, codec)
    _check_output_dir(wav_path)
    codes, length = data["codes"], data["length"]
    frames = _chunk_samples(codec, chunk_seconds, codec.sample_rate, codec.hop) // codec.hop
    tmp = wav_path + ".tmp"
    written = 0
    try:
        with sf.SoundFile(tmp, "w", samplerate=codec.sample_rate, channels=1,
                          subtype="PCM_16", format="WAV") as out:
            if codec.causal:
                pieces = codec.decode_chunks(codes[:, i:i + frames]
                                             for i in range(0, codes.shape[1], frames))
            else:
                pieces = iter([codec.decode(codes)])
            for audio in pieces:
                audio = audio[:max(0, length - written)]
                out.write(np.clip(audio, -1.0, 1.0))
                written += len(audio)
        os.replace(tmp, wav_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return {"samples": written, "frames": int(codes.shape[1]), "n_q": int(codes.shape[0]),
            "seconds": written / codec.sample_rate}
