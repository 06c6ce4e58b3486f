"""Writes a reply to standard output token by token, as an LLM streams it, for piping into
`codecstream say -` (which speaks the text while it is being written).

    python examples/simulated_llm.py --tokens-per-second 15 | codecstream say - --server ... --decoder ... --out a.wav
"""

from __future__ import annotations

import argparse
import re
import sys
import time

REPLY = "Sure, I can help with that. The train to Lyon leaves at nine fifteen. Shall I book a seat?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", default=REPLY)
    parser.add_argument("--tokens-per-second", type=float, default=15.0)
    args = parser.parse_args()
    for token in re.findall(r" ?[\w']+| ?[^\w\s]", args.text):  # words and punctuation, as LLM tokens
        sys.stdout.write(token)
        sys.stdout.flush()
        time.sleep(1 / args.tokens_per_second)
    return 0


if __name__ == "__main__":
    sys.exit(main())
