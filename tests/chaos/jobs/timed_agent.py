"""torchrun (``torch.distributed.run``) with its log lines timestamped, for the restart
breakdown (``tests/chaos/test_restart_breakdown.py``): its agent's INFO lines and the
rendezvous's DEBUG lines (who joined, left, waited, marked a round complete, when a dead
node was dropped), each prefixed ``AG <unix time> <node>``. torchrun itself sets up no
handler, so without this its INFO lines are not printed at all."""

import logging
import os
import sys

from torch.distributed.run import main

logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="AG %(created).3f " + os.environ.get("RESTART_NODE", "?")
                    + " %(message)s")
logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").setLevel(
    logging.DEBUG)
main(sys.argv[1:])
