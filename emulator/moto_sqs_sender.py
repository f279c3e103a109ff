"""SQS's ``SenderId`` system attribute names the principal that sent a message, as AWS does.

AWS: ReceiveMessage's ``SenderId`` is, for an IAM user, the user ID and, for an IAM role,
"the IAM role ID, for example ``ABCDE1F2GH3I4JK5LMNOP:i-a123b456``" (the role's unique ID and
the session name; an EC2 instance's role session is named after the instance)
(https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html).
SQS sets it from the request's signature: a sender cannot choose it.

moto gives every message one constant sender ID. Here the message a SendMessage (or
SendMessageBatch) created takes the ID of the credentials that signed the request: an assumed
role's ``<role id>:<session name>`` (the emulated instance metadata service names each
instance's session after its instance ID, as EC2 does), an IAM user's ID, else moto's
constant (a request signed with keys moto does not know).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_INSTALLED = False


def sender_id(access_key_id: str, account_id: str, region: str) -> str | None:
    """The ``SenderId`` AWS would record for a request signed with ``access_key_id``."""
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends
    from moto.utilities.utils import get_partition

    partition = get_partition(region)
    role = sts_backends[account_id][partition].get_assumed_role_from_access_key(access_key_id)
    if role is not None:
        return role.user_id
    try:
        user = iam_backends[account_id][partition].get_user_from_access_key_id(access_key_id)
    except Exception:  # keys moto never issued
        return None
    return user.id if user is not None else None


def _stamp(send: Callable[..., Any], *, batch: bool) -> Callable[..., Any]:
    def wrapped(self: Any) -> Any:
        from moto.sqs.models import sqs_backends

        result = send(self)
        try:
            sender = sender_id(self.get_access_key(), self.current_account, self.region)
        except Exception:  # an unsigned request: keep moto's constant
            sender = None
        if sender is None:
            return result
        queue = sqs_backends[self.current_account][self.region].get_queue(
            self._get_queue_name())
        ids = _message_ids(result, batch=batch)
        for message in queue._messages:  # moto keeps a queue's messages in this list
            if message.id in ids:
                message.sender_id = sender
        return result

    return wrapped


def _message_ids(result: Any, *, batch: bool) -> set[str]:
    body = getattr(result, "result", None) or {}
    if batch:
        return {entry["MessageId"] for entry in body.get("Successful", [])}
    return {body["MessageId"]} if "MessageId" in body else set()


def install() -> None:
    """Patch moto's SQS responses in this process (the one that runs moto's server)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.sqs.responses import SQSResponse

    SQSResponse.send_message = _stamp(SQSResponse.send_message, batch=False)  # type: ignore[method-assign]
    SQSResponse.send_message_batch = _stamp(  # type: ignore[method-assign]
        SQSResponse.send_message_batch, batch=True)
    _INSTALLED = True
