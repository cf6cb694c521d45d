"""Raises while importing: ``inventory asgi`` must report it in one line."""

raise RuntimeError("this module is broken on purpose")
