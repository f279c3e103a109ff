"""A job's own working directory from an archive: ``dl-run --workdir-archive -``.

``dlc submit --workdir DIR`` packs a laptop directory, stages it in the cluster's bucket,
and the cluster's Command document hands it (fetched as root) to the submitting user's
``dl-run`` on standard input. ``dl-run`` runs as that user, so the files are unpacked as
the user, into ``managed/<id>/workdir`` (a directory the user just created), before the
request is written: the job never starts without them. tarfile's ``data`` filter refuses
absolute names, ``..``, links that leave the directory and device files, and drops
set-uid bits (https://docs.python.org/3/library/tarfile.html#tarfile-extraction-filter).
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import BinaryIO

from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError
from bootstrap_scripts.protocol.paths import ManagedPaths

#: The job's working directory, in its managed directory.
WORKDIR = "workdir"


def workdir_of(paths: ManagedPaths) -> Path:
    return paths.dir / WORKDIR


def unpack(stream: BinaryIO, dest: Path) -> int:
    """Unpack the tar.gz ``stream`` into the new directory ``dest``; the number of members.
    RunError (usage) for an archive that is not one or holds what the filter refuses."""
    dest.mkdir(mode=0o755)
    count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|gz") as tar:
            for member in tar:
                tar.extract(member, dest, filter="data")
                count += 1
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RunError(f"cannot unpack the job's directory into {dest}: {exc}",
                       EXIT_USAGE) from None
    return count
