"""The CloudWatch agent of an emulated node: ships the files of the node's agent
configuration to moto's CloudWatch Logs.

On EC2 the node installer writes the CloudWatch agent's JSON configuration
(``bootstrap_scripts/agent/cloudwatch_config.py``) and starts the agent on it
(``amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c file:<path>``); the agent tails
every ``collect_list`` file and uploads its new lines to ``log_group_name`` /
``log_stream_name`` every ``force_flush_interval`` seconds, remembering how far it got in
each file (its state folder), starting over when a file was truncated (logrotate's
``copytruncate``), creating a missing stream
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch-Agent-Configuration-File-Details.html).
The emulator has no agent binary, so :mod:`emulator.nodes` starts this process in the
node's process group instead when the installer wrote a configuration: it reads the SAME
file and does the same with boto3 against moto's server, with the node's own credentials
(the instance role, from the node's metadata endpoint) and region. Differences from the
real agent (docs/emulator.md): the lines it uploaded that are CloudWatch embedded metric
format documents are also published as metrics (:mod:`emulator.emf_extract`: CloudWatch
Logs' own work, which moto does not do, so it is signed as the emulated service (the
emulator's keys, :data:`emulator.iam_enforcement.HARNESS_KEY`), never with the node's role,
which AWS never asks for ``cloudwatch:PutMetricData``); every line is one event stamped
with the time it was read (no ``timestamp_format``, no ``multi_line_start_pattern``),
``file_path`` is one file (no wildcards), and the state is one offset per file under the
node's root.

Run as ``python -m emulator.cloudwatch_agent --config PATH --state-dir DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from bootstrap_scripts.agent.cloudwatch_config import collected
from emulator import emf_extract

#: PutLogEvents takes at most 10,000 events and 1,048,576 bytes (each event + 26 bytes).
MAX_EVENTS = 10_000
MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD = 26
#: Bytes read from a file per pass (the rest waits for the next pass).
READ_LIMIT = 4 * 1024 * 1024


class Shipper:
    """One pass over every configured file: the new whole lines to their streams."""

    def __init__(self, client, entries: list[dict], state_dir: Path, metrics=None) -> None:
        self.client = client
        #: CloudWatch, for the EMF lines' metrics (None: no extraction)
        self.metrics = metrics
        self.entries = entries
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.streams: set[tuple[str, str]] = set()

    def _state(self, path: str) -> Path:
        return self.state_dir / hashlib.sha256(path.encode()).hexdigest()[:32]

    def offset(self, path: str) -> int:
        try:
            return int(self._state(path).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def _save(self, path: str, offset: int) -> None:
        tmp = self._state(path).with_suffix(".tmp")
        try:
            tmp.write_text(f"{offset} {path}\n")
            tmp.replace(self._state(path))
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def new_lines(self, path: str) -> tuple[list[str], int]:
        """Whole lines after the saved offset, and the offset just past them."""
        start = self.offset(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return [], start
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < start:  # truncated (rotated with copytruncate): from its start
                start = 0
            f.seek(start)
            data = f.read(READ_LIMIT)
        end = data.rfind(b"\n")
        if end < 0:
            return [], start
        text = data[:end].decode("utf-8", errors="replace")
        return [line if line else " " for line in text.split("\n")], start + end + 1

    def ensure_stream(self, group: str, stream: str) -> None:
        if (group, stream) in self.streams:
            return
        try:
            self.client.create_log_stream(logGroupName=group, logStreamName=stream)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceAlreadyExistsException":
                raise
        self.streams.add((group, stream))

    def put(self, group: str, stream: str, lines: list[str]) -> None:
        now = int(time.time() * 1000)
        batch: list[dict] = []
        size = 0
        for line in lines:
            cost = len(line.encode()) + EVENT_OVERHEAD
            if batch and (len(batch) >= MAX_EVENTS or size + cost > MAX_BATCH_BYTES):
                self.client.put_log_events(logGroupName=group, logStreamName=stream,
                                           logEvents=batch)
                batch, size = [], 0
            batch.append({"timestamp": now, "message": line})
            size += cost
        if batch:
            self.client.put_log_events(logGroupName=group, logStreamName=stream,
                                       logEvents=batch)

    def ship_once(self) -> int:
        """Upload every file's new lines; returns how many lines went out."""
        shipped = 0
        for entry in self.entries:
            path, group = entry["file_path"], entry.get("log_group_name", "")
            stream = entry.get("log_stream_name", "")
            lines, end = self.new_lines(path)
            if not lines:
                continue
            try:
                self.ensure_stream(group, stream)
                self.put(group, stream, lines)
            except (ClientError, BotoCoreError) as exc:  # kept for the next pass, as the agent
                print(f"cloudwatch-agent: {group}/{stream}: {exc}", file=sys.stderr, flush=True)
                continue
            shipped += len(lines)
            try:
                self._save(path, end)
            except OSError as exc:  # a full disk (ENOSPC): the agent carries on, as systemd
                # restarts the real one; these lines go again next pass (at least once)
                print(f"cloudwatch-agent: cannot save the position in {path}: {exc}",
                      file=sys.stderr, flush=True)
                continue
            if self.metrics is not None:
                try:
                    emf_extract.publish(self.metrics, lines)
                except (ClientError, BotoCoreError) as exc:  # the lines are in the log
                    print(f"cloudwatch-agent: EMF metrics of {stream}: {exc}",
                          file=sys.stderr, flush=True)
        return shipped


def region() -> str:
    """The instance's region from its metadata endpoint, as the agent reads it."""
    from bootstrap_scripts.agent.identity import fetch_identity

    return fetch_identity(deadline=30).region


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="emulator.cloudwatch_agent")
    parser.add_argument("--config", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    args = parser.parse_args(argv)
    config = json.loads(Path(args.config).read_text())
    entries = collected(json.dumps(config))
    flush = float(config.get("logs", {}).get("force_flush_interval", 5))
    state = Path(args.state_dir)
    region_name = os.environ.get("AWS_REGION") or region()
    client = boto3.client("logs", region_name=region_name)
    from emulator.iam_enforcement import HARNESS_KEY

    service = boto3.client("cloudwatch", region_name=region_name,  # CloudWatch Logs' side
                           aws_access_key_id=HARNESS_KEY, aws_secret_access_key=HARNESS_KEY,
                           aws_session_token=HARNESS_KEY)
    shipper = Shipper(client, entries, state, metrics=service)
    stopping = False

    def stop(_sig, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print(f"cloudwatch-agent: shipping {len(entries)} files every {flush:g} s",
          file=sys.stderr, flush=True)
    while True:
        shipper.ship_once()
        if args.once or stopping:
            return 0
        deadline = time.monotonic() + flush
        while not stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, flush))


if __name__ == "__main__":
    sys.exit(main())
