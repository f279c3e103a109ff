"""The secret path a job's TensorBoard serves under: the one shape the node and ``dlc`` share.

TensorBoard has no authentication; ``dl-jobs tensorboard`` starts it with a random
``--path_prefix`` (``ops.tensorboard_server.new_prefix``: a slash and 32 URL-safe
characters, 192 bits) and it answers 404 outside that prefix, so the path works as a
capability. Two sides check its shape:

- the node: ``ops.tensorboard_run`` refuses to start TensorBoard without a valid prefix on
  its standard input (:data:`PREFIX_RE`: no trailing slash, which TensorBoard refuses);
- the laptop: ``dlc tensorboard`` refuses an answer without the served path (the prefix and
  a slash, :data:`SERVED_PATH_RE`), which only an older ``dl-jobs`` gives.
"""

from __future__ import annotations

import re

#: the secret itself: at least 32 URL-safe characters (``secrets.token_urlsafe(24)`` gives 32)
SECRET = r"[A-Za-z0-9_-]{32,128}"
#: the ``--path_prefix`` TensorBoard is started with: a slash and the secret, no trailing slash
PREFIX_RE = re.compile(rf"/{SECRET}")
#: the path it serves under, as ``dl-jobs tensorboard`` reports it: the prefix and a slash
SERVED_PATH_RE = re.compile(rf"/{SECRET}/")
