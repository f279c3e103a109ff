"""What every node daemon relies on: the node's own signing key and region, one instance
of a daemon per node, and process groups (every process we start is ours to stop)."""
