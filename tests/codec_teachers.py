"""Small frozen teachers that tests build themselves (no pretrained weights can be fetched):
a strided conv feature extractor saved as TorchScript and exported to ONNX, with the
interface the codec's teachers have (mono audio (batch, samples) -> features (batch, frames,
dim))."""
import os
import warnings

import torch
from torch import nn


class FrameFeatures(nn.Module):
    """(B, T) -> (B, T / hop, dim): a strided conv over 25 ms windows, tanh."""

    def __init__(self, dim: int = 6, hop: int = 320, seed: int = 3):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.conv = nn.Conv1d(1, dim, kernel_size=2 * hop, stride=hop, padding=hop // 2)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=generator)
                                   / hop ** 0.5)
            self.conv.bias.zero_()

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return torch.tanh(4.0 * self.conv(audio.unsqueeze(1))).transpose(1, 2)


def write_teachers(root: str, dim: int = 6, hop: int = 320, seed: int = 3) -> dict:
    """teacher.pt (TorchScript) and teacher.onnx of one FrameFeatures; their paths."""
    model = FrameFeatures(dim, hop, seed).eval()
    paths = {"torchscript": os.path.join(root, "teacher.pt"),
             "onnx": os.path.join(root, "teacher.onnx")}
    torch.jit.script(model).save(paths["torchscript"])
    with warnings.catch_warnings():          # the TorchScript-based exporter, as export.py uses
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, (torch.zeros(1, 16000),), paths["onnx"], dynamo=False,
                          opset_version=17, input_names=["audio"],
                          output_names=["features"],
                          dynamic_axes={"audio": {0: "batch", 1: "samples"},
                                        "features": {0: "batch", 1: "frames"}})
    return paths
