"""Kaldi-compatible log-mel filterbank through kaldi-native-fbank (the same code the
deployment runtimes use, so training and inference features agree)."""
import numpy as np
import kaldi_native_fbank as knf


def fbank_options(num_mel_bins: int = 40, frame_length_ms: float = 25.0,
                  frame_shift_ms: float = 10.0, dither: float = 0.0,
                  sample_rate: int = 16000) -> "knf.FbankOptions":
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = float(sample_rate)
    opts.frame_opts.frame_length_ms = float(frame_length_ms)
    opts.frame_opts.frame_shift_ms = float(frame_shift_ms)
    opts.frame_opts.dither = float(dither)
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = int(num_mel_bins)
    return opts


def options_from_config(feature_cfg, sample_rate: int) -> "knf.FbankOptions":
    return fbank_options(feature_cfg.num_mel_bins, feature_cfg.frame_length_ms,
                         feature_cfg.frame_shift_ms, feature_cfg.dither, sample_rate)


def compute_fbank(wave: np.ndarray, opts: "knf.FbankOptions") -> np.ndarray:
    """wave: float samples in [-1, 1] -> (frames, bins) float32. Kaldi expects int16 scale."""
    extractor = knf.OnlineFbank(opts)
    extractor.accept_waveform(opts.frame_opts.samp_freq, (wave * 32768.0).astype(np.float32))
    extractor.input_finished()
    n = extractor.num_frames_ready
    if n == 0:
        return np.zeros((0, opts.mel_opts.num_bins), dtype=np.float32)
    return np.stack([extractor.get_frame(i) for i in range(n)]).astype(np.float32, copy=False)


def num_frames(num_samples: int, opts_or_rate, frame_length_ms: float = 25.0,
               frame_shift_ms: float = 10.0) -> int:
    """Frame count with snip_edges=True, for planning batches from durations."""
    if isinstance(opts_or_rate, knf.FbankOptions):
        rate = opts_or_rate.frame_opts.samp_freq
        frame_length_ms = opts_or_rate.frame_opts.frame_length_ms
        frame_shift_ms = opts_or_rate.frame_opts.frame_shift_ms
    else:
        rate = opts_or_rate
    win = int(rate * frame_length_ms / 1000)
    hop = int(rate * frame_shift_ms / 1000)
    if num_samples < win:
        return 0
    return 1 + (num_samples - win) // hop


def fbank_metadata(opts: "knf.FbankOptions") -> dict:
    """What a runtime needs to reproduce the features (stored in exported models)."""
    return {
        "type": "kaldi_fbank",
        "sample_rate": int(opts.frame_opts.samp_freq),
        "num_mel_bins": int(opts.mel_opts.num_bins),
        "frame_length_ms": float(opts.frame_opts.frame_length_ms),
        "frame_shift_ms": float(opts.frame_opts.frame_shift_ms),
        "dither": float(opts.frame_opts.dither),
        "window_type": str(opts.frame_opts.window_type),
        "snip_edges": bool(opts.frame_opts.snip_edges),
        "input_scale": 32768.0,
    }
