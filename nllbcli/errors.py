"""The one exception type for errors a user can cause; cli.py turns it into one line and exit 1."""


class NllbError(Exception):
    """A problem with the user's input, model or options, described in a full sentence."""
