"""The cluster protocol: every path, record and message the node runtime, the Lambda, the
operator commands and the emulator exchange. One home; every other module imports it.

- :mod:`.paths`      where things live, on a node and on EFS
- :mod:`.store`      the one atomic writer and the one reader
- :mod:`.records`    small typed records (registrations, heartbeats, drains, share records)
- :mod:`.membership` the membership and its generations
- :mod:`.node_files` what every node renders from a membership (workers, hostfiles, env)
- :mod:`.state`      operations on the cluster's EFS state (publish, registrations, drains)
- :mod:`.jobs`       the job spec
- :mod:`.messages`   the master queue's messages
- :mod:`.errors`     :class:`ProtocolError`, naming the file and field
- :mod:`.tensorboard_path` the shape of a job TensorBoard's secret path (node and dlc)

docs/protocol.md is the human contract; tests/protocol holds the two together.
"""

from bootstrap_scripts.protocol.errors import ProtocolError

__all__ = ["ProtocolError"]
