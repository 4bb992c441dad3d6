"""Neural speech codecs: generator, quantizer, discriminators, losses, metrics, baselines,
and the `codec` task (importing the package registers it)."""
from toolkit.tasks.codec import task  # noqa: F401  (registers the codec task)
