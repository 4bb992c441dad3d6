"""Speaker embeddings: x-vector, ResNet and ECAPA-TDNN extractors with margin-softmax
heads, verification scoring. Importing registers the task."""
from toolkit.tasks.speaker import task  # noqa: F401  (registers "speaker")
