"""The `nllb` command's entry point (also `python -m nllbcli`).

Importing the command's modules (click, pyarrow, numpy) takes a few hundred milliseconds; a Ctrl-C or SIGTERM in
that time ends the command at once with 130 or 143, as one later does, instead of a KeyboardInterrupt
traceback from inside an import. Nothing is open yet that needs closing. cli.main() hands SIGINT back to
Python's KeyboardInterrupt once the imports are done.
"""

import os
import signal


def exit_quietly(signum, frame) -> None:
    os._exit(128 + signum)


def main() -> None:
    previous = {s: signal.signal(s, exit_quietly) for s in (signal.SIGINT, signal.SIGTERM)}
    from .cli import main as run

    run(previous)


if __name__ == "__main__":
    main()
