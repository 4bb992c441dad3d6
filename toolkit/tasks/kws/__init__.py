"""Keyword spotting: wake words and command words. Importing registers the task."""
from toolkit.tasks.kws import task  # noqa: F401  (registers "kws")
