"""Each node's public key reaches the master through AWS, never through EFS.

A node signs the records it writes for the master (``bootstrap_scripts.protocol.
node_signature``) with a key pair its agent made on its own disk (``bootstrap_scripts.
node_keys``). The master must learn each node's public half from that node and nobody else:
a key read from EFS would be whatever root on any worker wrote there. So a worker sends its
public key on the cluster's node-keys queue, on which the workers' role may only send and
the master's alone receive, and the master believes SQS's ``SenderId``, which SQS sets from
the request's signature (for an instance profile's role session ``<role id>:<instance
id>``: :func:`bootstrap_scripts.agent.sender_queue.instance_of_sender`), not the body: a
worker can only ever give a key for its own instance. The master keeps what it learnt on its
own disk (``var/lib/dl-agent/node-keys/``), where its job controller reads it too.

When: at the agent's start, whenever the membership names another master (a new master has
an empty book: a master recovered on a new instance learns every key again within a
heartbeat), and every :data:`RESEND_SECONDS` (a message lost, or sent before the queue's
master listened, is sent again). Until a node's key is learnt the master ignores its records:
it counts as not registered yet, within the registration window as before.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from bootstrap_scripts.agent.sender_queue import SenderQueue, instance_of_sender
from bootstrap_scripts.node import node_keys
from bootstrap_scripts.protocol import node_signature as nsig
from bootstrap_scripts.protocol.membership_signature import Signer
from bootstrap_scripts.protocol.paths import NodePaths

#: A worker sends its key again this often (SQS keeps a message 4 days by default, and a
#: new master asks nothing: it listens).
RESEND_SECONDS = 300.0


class NodeKey:
    """This node's key: made (or read) at the agent's start; the signer of its records, and
    (a worker with a queue) the announcement of its public half."""

    def __init__(self, paths: NodePaths, *, instance_id: str, queue_url: str = "",
                 region: str = "", client=None, log: logging.Logger | None = None) -> None:
        key = node_keys.load_or_make(paths)
        self.public = nsig.public_pem(key)
        self.sign: Signer = nsig.signer(key, node_keys.fingerprint(self.public))
        self.instance_id = instance_id
        self.queue_url = queue_url
        self.region = region
        self.client = client
        self.log = log or logging.getLogger("dl-agent")
        self.sent_to: str | None = None
        self.sent_at = 0.0

    def body(self) -> str:
        """The message (the instance named is for people: the master trusts the sender)."""
        return json.dumps({"instance": self.instance_id, "public_key": self.public.decode()})

    def announce(self, master: str, now: float | None = None) -> bool:
        """Send the key when ``master`` (the membership's master instance) changed or it is
        time again; True when sent. A failure is logged and tried at the next call."""
        now = time.monotonic() if now is None else now
        if not self.queue_url or (master == self.sent_to and now - self.sent_at < RESEND_SECONDS):
            return False
        try:
            if self.client is None:
                import boto3  # only a node with a node-keys queue sends

                self.client = boto3.session.Session(region_name=self.region).client("sqs")
            self.client.send_message(QueueUrl=self.queue_url, MessageBody=self.body())
        except Exception as exc:  # throttling, a network blip: the next heartbeat retries
            self.log.warning("event=node-key-send-failed error=%r", exc)
            return False
        self.sent_to, self.sent_at = master, now
        self.log.info("event=node-key-sent master=%s fingerprint=%s", master or "-",
                      node_keys.fingerprint(self.public))
        return True


class KeyServer(SenderQueue):
    """The master's side: learn the key of each instance that sends one."""

    event = "node-key"

    def __init__(self, *, queue_url: str, worker_role_id: str, sqs: Callable[[], Any],
                 book: node_keys.KeyBook, log: logging.Logger, stop: threading.Event) -> None:
        super().__init__(queue_url=queue_url, worker_role_id=worker_role_id, log=log,
                         stop=stop)
        #: the SQS client's getter (the master's, None until its clients are made)
        self.sqs = sqs
        self.book = book

    def client(self) -> Any | None:
        return self.sqs()

    def learn(self, sender: str, body: str) -> str:
        """Record the key of the instance SQS names as the sender; why not ("" when
        learnt): a sender not of the workers' role, a body that names another instance, or
        that holds no P-256 public key."""
        instance, why = instance_of_sender(sender, self.worker_role_id)
        if instance is None:
            return why
        try:
            doc = json.loads(body)
            named, pem = doc["instance"], doc["public_key"].encode()
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"no key in the message of {instance}"
        if named != instance:
            return f"{instance} sent a key for {named!r}: a node speaks for itself only"
        try:
            changed = self.book.save(instance, pem)
        except nsig.NodeKeyError as exc:
            return f"{instance}: {exc}"
        if changed:
            self.log.info("event=node-key-learnt instance=%s fingerprint=%s", instance,
                          node_keys.fingerprint(pem))
        return ""

    def handle(self, sender: str, body: str) -> bool:
        """Learn or refuse (logged); the message is deleted either way."""
        why = self.learn(sender, body)
        if why:
            self.log.warning("event=node-key-refused sender=%s reason=%s", sender, why)
        return True


def serve(agent, sqs: Callable[[], Any]) -> KeyServer | None:
    """The master: open its key book with its own key in it and learn the workers' in a
    thread of its own; None (nothing checked) without a node-keys queue."""
    c = agent.config
    if not c.node_keys_queue_url:
        return None
    book = node_keys.KeyBook(agent.paths)
    book.open()
    book.save(agent.identity.instance_id, agent.node_key.public)
    server = KeyServer(queue_url=c.node_keys_queue_url, worker_role_id=c.worker_role_id,
                       sqs=sqs, book=book, log=agent.log, stop=agent.stop)
    threading.Thread(target=server.serve, daemon=True, name="node-keys").start()
    agent.log.info("event=node-keys-serving queue=%s", c.node_keys_queue_url)
    return server
