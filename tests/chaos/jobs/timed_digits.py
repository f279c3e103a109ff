"""The example job (``train_digits``, its flags as given) with its start-up phases
timestamped on stderr (``WK <unix time> rank=<R> <phase> cpu=<seconds>``): the process
started, torch imported, ``init_process_group`` done, the data loaded, the checkpoint
loaded, and each line the example prints (``first_step`` ...). The example's own code is
not changed: its functions are wrapped where ``train_digits.main`` looks them up. It exits
as the example does (``exit_without_teardown``)."""

import os
import sys
import time

RANK = os.environ.get("RANK", "?")


def mark(what: str) -> None:
    """One timed line, with this process's CPU seconds so far (user + system): the
    start-up's own cost, which other work on a shared machine does not inflate as it does
    the wall time."""
    cpu = os.times()
    sys.__stderr__.write(f"WK {time.time():.3f} rank={RANK} {what} "
                         f"cpu={cpu.user + cpu.system:.3f}\n")
    sys.__stderr__.flush()


mark("started")


class Lines:
    """stdout, each line marked with its time (the example flushes every line it prints)."""

    def __init__(self) -> None:
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            mark("out " + line)
        return len(text)

    def flush(self) -> None:
        pass


sys.stdout = Lines()
import torch  # noqa: E402, F401  (the import is a phase of its own)

mark("torch imported")
import torch.distributed as dist  # noqa: E402

from bootstrap_scripts.examples import train_digits  # noqa: E402


def timed(name: str, fn):
    def run(*args, **kwargs):
        result = fn(*args, **kwargs)
        mark(f"{name} done")
        return result
    return run


dist.init_process_group = timed("init_process_group", dist.init_process_group)
for _name in ("load_data", "load_checkpoint"):
    setattr(train_digits, _name, timed(_name, getattr(train_digits, _name)))
train_digits.exit_without_teardown(lambda: train_digits.main(sys.argv[1:]))
