"""torchrun (``torch.distributed.run``) with its log lines timestamped, for the restart
breakdown (``tests/chaos/test_restart_breakdown.py``): its agent's INFO lines and the
rendezvous's DEBUG lines (who joined, left, waited, marked a round complete, when a dead
node was dropped), each as ``AG <unix time> <node> <message>``. torch's logging puts its
own handler on its loggers on import (glog-like lines, local time without a date); this
gives those handlers this format instead, and the rendezvous's logger the DEBUG level."""

import logging
import os
import sys

from torch.distributed.run import main

FORMAT = logging.Formatter("AG %(created).3f " + os.environ.get("RESTART_NODE", "?")
                           + " %(message)s")


def timestamp_every_handler() -> int:
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict
                                      .values() if isinstance(logger, logging.Logger))]
    handlers = {h for logger in loggers for h in logger.handlers}
    for handler in handlers:
        handler.setFormatter(FORMAT)
    return len(handlers)


if not timestamp_every_handler():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    timestamp_every_handler()
logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").setLevel(
    logging.DEBUG)
if __name__ == "__main__":
    main(sys.argv[1:])
