"""What the job tests share about the files a job leaves in a directory."""

import json
import os
from contextlib import contextmanager


def listing(directory) -> list[str]:
    """A directory's names, sorted, leaving out the record each finished job keeps beside its output (a
    `.NAME.nllb-state.json` that says finished): what a job leaves behind besides its files."""
    names = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".nllb-state.json"):
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as stream:
                    if json.load(stream).get("finished"):
                        continue
            except (OSError, ValueError):
                pass
        names.append(name)
    return names


@contextmanager
def stopped_after_commits(commits: int):
    """While the block runs, the job loop's save_state raises KeyboardInterrupt at its commit number
    `commits` + 1 (standing for a kill after the next chunk is written, before it is committed); yields the
    states saved before that."""
    import nllbcli.job.loop as loop

    saved = []
    save_state = loop.save_state

    def stop_after_commits(path, state):
        if len(saved) == commits:
            raise KeyboardInterrupt
        save_state(path, state)
        saved.append(state)

    loop.save_state = stop_after_commits
    try:
        yield saved
    finally:
        loop.save_state = save_state
