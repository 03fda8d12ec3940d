"""The one exception type for errors a user can cause; cli.py turns it into one line and exit 1."""


class NllbError(Exception):
    """A problem with the user's input, model or options, described in a full sentence."""


class PoolFull(NllbError):
    """The GPU engine's KV pool cannot hold a request (cache slots, positions or cross K/V rows); the caller
    waits for room, splits the work, or turns this into advice on which option to change."""
