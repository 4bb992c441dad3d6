"""Speaker embeddings: x-vector, ResNet and ECAPA-TDNN extractors with margin-softmax
heads, verification scoring. The task class is toolkit.tasks.speaker.task (registered
lazily by toolkit.tasks); scoring and corpus import no torch."""
