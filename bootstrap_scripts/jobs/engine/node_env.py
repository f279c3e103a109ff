"""The node's ``DEEPLEARNING_*`` variables, as its node agent wrote them.

Read by every program of the engine that needs to know about its node (the executor, the
controller, ``dl-jobs``); here, in the shared core, so that none of them imports another
program's modules to get it.
"""

from __future__ import annotations

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.node_files import parse_env_file
from bootstrap_scripts.protocol.paths import NodePaths


def read_node_env(paths: NodePaths) -> dict[str, str]:
    """The node's ``DEEPLEARNING_*`` / ``EFS_MOUNT`` variables ({} before the agent wrote them)."""
    try:
        text = store.read_text(paths.env)
    except (OSError, ProtocolError):
        return {}
    return parse_env_file(text) if text is not None else {}
