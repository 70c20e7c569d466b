"""Checking a dataset against a Great Expectations suite, streamed (stream.py has the whole story)."""
