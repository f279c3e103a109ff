"""A job for the log tests: prints ``num=<i>`` for i in 0..COUNT-1, each line in two writes
(the number's line is incomplete on disk for a moment, as a training loop's progress lines
often are), flushing often so a follower sees the output grow while the job runs."""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> int:
    count = int(argv[1]) if len(argv) > 1 else 2000
    for i in range(count):
        sys.stdout.write("num=")
        sys.stdout.flush()
        sys.stdout.write(f"{i}\n")
        if i % 20 == 0:
            sys.stdout.flush()
            time.sleep(0.02)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
