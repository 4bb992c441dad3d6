"""Neural speech codecs: generator, quantizer, discriminators, losses, metrics, baselines.
The task class is toolkit.tasks.codec.task (registered lazily by toolkit.tasks); its config
sections and checks are toolkit.tasks.codec.config, its examples toolkit.tasks.codec.data."""
