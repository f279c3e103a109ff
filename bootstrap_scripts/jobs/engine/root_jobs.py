"""Root's own jobs run only when the master signed them: root on a worker is not root on all.

Every node mounts EFS with root access (``ClientRootAccess``), so root on any worker, or a
job that reached a worker's root, can write ``jobs/root/<id>/spec.json`` or
``managed/root/<id>/request.json`` owned by uid 0. The executors run a spec as its owner and
the job controller starts a request's attempts as its owner: without a check, such a file
would run its command as root on every node, the master included, where root holds the
master's role (it signs the membership and drains, and completes lifecycle actions). One
planted file would undo every line that keeps workers from speaking for the master.

So a file of root's that makes root run something carries the master's signature, made with
the membership key (``kms:Sign``, which only the master's role has) over the SHA-256 of the
file's exact bytes, in ``<name>.sig`` beside it (root's, written before the file itself, so
the file's appearance is still the go). ``dl-run`` run by root on the master signs; on a
worker the same command fails at once, naming why (its role may not sign). The executors
verify a root spec, and the controller a root request, with the public half of the key
installed on the node (``etc/dl-cluster/membership-key``, from the user data, never from
EFS; fetched once with ``kms:GetPublicKey`` and checked locally, the membership's own check:
``agent.membership_key``) before acting. Users' jobs are unchanged: a user's file runs as
that user, which root on a worker could already impersonate on EFS (NFS trusts the client's
uids).

A node without an installed key (a cluster built without one: the emulator's bare test
clusters) signs and checks nothing, as the membership does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.node import node_region
from bootstrap_scripts.protocol.membership_signature import ALGORITHM, Signature

#: Under the node root: the membership key's ARN, written by the installer from user data.
KEY_FILE = "etc/dl-cluster/membership-key"
#: The signature's file name beside the signed one.
SUFFIX = ".sig"
_MAX_BYTES = 2048


class RootJobError(RuntimeError):
    """Root's job could not be signed here (not the master, or KMS could not be asked)."""


def render_key_file(key_arn: str) -> str:
    return key_arn.strip() + "\n"


def installed_key(root: str | Path = "/") -> str:
    """The key ARN the installer wrote under ``root``, or "" when there is none (read as
    every installed file is: no link followed, root's or ours only)."""
    key = node_region.read_installed_file(Path(root) / KEY_FILE).strip()
    return key if key.startswith("arn:") or (key and " " not in key) else ""


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def signature_text(sig: Signature) -> str:
    return json.dumps({"key": sig.key, "algorithm": sig.algorithm,
                       "value": base64.b64encode(sig.value).decode()}, sort_keys=True) + "\n"


def parse_signature(text: str) -> Signature:
    try:
        raw = json.loads(text)
        return Signature(key=str(raw["key"]), algorithm=str(raw["algorithm"]),
                         value=base64.b64decode(str(raw["value"]), validate=True))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"malformed signature: {exc}") from None


#: ``sign(digest) -> Signature``; ``verify(digest, signature) -> bool`` (raises when the
#: public key could not be fetched from KMS yet: the caller looks again later).
Sign = Callable[[bytes], Signature]
Verify = Callable[[bytes, Signature], bool]


def node_key(root: str | Path):
    """The membership key of this node (``agent.membership_key.MembershipKey``), or None
    without one."""
    key = installed_key(root)
    if not key:
        return None
    from bootstrap_scripts.agent.membership_key import MembershipKey

    return MembershipKey(key, node_region.client_region(root) or "")


def signer(root: str | Path) -> Sign | None:
    """What ``dl-run`` signs root's files with on this node (None: no key, nothing to sign,
    or not root: only root's own files need the master's word)."""
    if os.geteuid() != 0:
        return None
    key = node_key(root)
    return key.sign if key is not None else None


def verifier(root: str | Path) -> Verify | None:
    """What the executors and the controller check root's files with (None: no key)."""
    key = node_key(root)
    return key.verify if key is not None else None


def sign_before(path: Path, text: str, sign: Sign | None) -> None:
    """Write ``path``'s signature file for ``text`` (call before writing ``path``).
    RootJobError naming the cause when the signature cannot be made: only the master's
    role may sign, so root's jobs are submitted on the master."""
    if sign is None:
        return
    from bootstrap_scripts.protocol import store

    try:
        sig = sign(digest(text))
    except Exception as exc:  # MembershipKeyError: AccessDenied on a worker, KMS down
        raise RootJobError(
            f"root's job needs the master's signature and it could not be made here ({exc}); "
            "submit root's jobs on the master, or run the job as a cluster user "
            "(sudo -u USER dl-run ...)") from None
    store.atomic_write(path.with_name(path.name + SUFFIX), signature_text(sig), mode=0o644)


def refusal(directory: Path, name: str, text: str, owner_uid: int,
            verify: Verify | None) -> str:
    """Why root must not act on ``directory/name`` (read as ``text``, owned by
    ``owner_uid``): "" for a user's file, for a node without a key, or when the master's
    signature over exactly ``text`` holds. Raises when KMS cannot be asked (look again)."""
    if owner_uid != 0 or verify is None:
        return ""
    try:
        sig_text = userfiles.read_owned(directory, name + SUFFIX, limit=_MAX_BYTES).text
    except FileNotFoundError:
        return f"root's {name} carries no master's signature ({name}{SUFFIX})"
    except OSError as exc:
        return f"root's {name}: its signature cannot be read safely ({exc})"
    try:
        sig = parse_signature(sig_text)
    except ValueError as exc:
        return f"root's {name}: {exc}"
    if sig.algorithm != ALGORITHM:
        return f"root's {name} signed with {sig.algorithm!r}, expected {ALGORITHM}"
    if not verify(digest(text), sig):
        return f"root's {name}: the signature is not the master's"
    return ""
