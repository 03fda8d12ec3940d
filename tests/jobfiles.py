"""What the job tests share about the files a job leaves in a directory."""

import json
import os


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
