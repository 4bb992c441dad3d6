"""Kaldi-style recipe toolkit for keyword spotting (and, later, speaker models)."""
__version__ = "0.1.0"
