"""TensorBoard behind a secret path: the process ``dl-jobs tensorboard`` starts as the job's user.

    python -m bootstrap_scripts.ops.tensorboard_run [TensorBoard flags...]  < secret line

TensorBoard listens on the master's loopback, which every process on the master can reach,
other cluster users' included. It has no authentication of its own, but with
``--path_prefix`` it answers 404 to every path outside the prefix
(``tensorboard.backend.path_prefix``): a random prefix of 192 bits works as a capability,
like a notebook server's token.

The prefix must not show where other users can read it. A command line is public
(``/proc/<pid>/cmdline`` is world-readable), so the prefix is not an argument: it comes on
standard input (a pipe from the root service that started us; nothing on a file system)
and is added to ``sys.argv`` inside this process only. The process environment would be
private (``/proc/<pid>/environ`` is readable by its owner only) but would also reach every
child; stdin is read once and closed.
"""

from __future__ import annotations

import sys

from bootstrap_scripts.protocol.tensorboard_path import PREFIX_RE


def read_prefix(line: str) -> str:
    """The path prefix from the first line of standard input; ValueError when it is not one
    (TensorBoard must never start without its secret: it would serve every path)."""
    prefix = line.strip()
    if not PREFIX_RE.fullmatch(prefix):
        raise ValueError("no valid secret path prefix on standard input")
    return prefix


def main(argv: list[str]) -> None:
    prefix = read_prefix(sys.stdin.readline())
    sys.stdin.close()
    sys.argv = ["tensorboard", *argv, f"--path_prefix={prefix}"]
    from tensorboard import main as tensorboard_main  # heavy: only once the secret is there

    tensorboard_main.run_main()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as exc:
        sys.exit(f"tensorboard_run: {exc}")
