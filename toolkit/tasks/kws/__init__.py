"""Keyword spotting: wake words and command words. The task class is
toolkit.tasks.kws.task (registered lazily by toolkit.tasks); the light modules (labels,
tokens, decision, scoring, corpus) import no torch."""
