"""The child process of an artifact's trial (artifact_trial.py): open the directory with the runtime named,
as the client would, and say why not on stderr.

    python -m codecstream.client.artifact_trial_child DIRECTORY RUNTIME     # exit 0: it opened and decoded
"""

from __future__ import annotations

import os
import sys

from codecstream.client.artifact_trial import REASON_PREFIX
from codecstream.client.runtimes import open_decoder
from codecstream.client.runtimes.pte_trial import CHILD_VARIABLE


def main(argv: list[str]) -> int:
    directory, runtime = argv
    # This process is the trial: a .pte opened here runs no trial of its own (runtimes/pte_trial.py).
    os.environ[CHILD_VARIABLE] = "1"
    try:
        open_decoder(directory, backend=runtime)
    except Exception as error:  # whatever the runtime raises, the artifact cannot be used
        print(f"{REASON_PREFIX}{' '.join(str(error).split()) or type(error).__name__}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
