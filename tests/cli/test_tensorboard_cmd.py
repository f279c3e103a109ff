"""``dlc tensorboard JOB``: what it asks the master, and the tunnel it opens to the answer."""

from __future__ import annotations

import pytest

from dlc import errors, remote
from dlc import tensorboard as board
from dlc.target import Target

#: a secret path as the master's dl-jobs answers it
SECRET = "/" + "k" * 32 + "/"


class FakeRemote:
    """Answers ``dl-jobs tensorboard`` as the master would; records what was asked."""

    instance_id = "i-master"

    def __init__(self, answer: object) -> None:
        self.answer, self.asked = answer, []

    def json(self, argv: list[str], *, timeout: int = 0) -> object:
        self.asked.append(argv)
        return self.answer


def test_it_starts_tensorboard_on_the_master_then_forwards_to_its_port() -> None:
    fake = FakeRemote({"port": 6007, "uid": 1500, "already_running": False,
                       "path": SECRET})
    lines: list[str] = []
    board.open_board(Target(region="eu-west-1"), fake, "train-1", minutes=30, local_port=None,
                     dry_run=True, echo=lines.append)
    assert fake.asked == [["dl-jobs", "tensorboard", "train-1", "--port", "6006",
                           "--minutes", "30"]]
    # what the command document accepts (its argument pattern), checked as dlc would
    remote.document_parameters(fake.asked[0], timeout=board.START_TIMEOUT)
    assert f"http://localhost:6007{SECRET} " in lines[0] and "uid 1500" in lines[0]
    assert lines[1].startswith("aws ssm start-session --target i-master")
    assert "AWS-StartPortForwardingSession" in lines[1]
    assert '"portNumber":["6007"],"localPortNumber":["6007"]' in lines[1]


def test_a_local_port_of_ones_own() -> None:
    lines: list[str] = []
    board.open_board(Target(region="eu-west-1"), FakeRemote({"port": 6006, "path": SECRET}),
                     "j", minutes=5, local_port=16006, dry_run=True, echo=lines.append)
    assert '"portNumber":["6006"],"localPortNumber":["16006"]' in lines[1]


def test_an_answer_without_a_port_is_an_error() -> None:
    with pytest.raises(errors.DlcError, match="without a port"):
        board.open_board(Target(region="eu-west-1"), FakeRemote({"error": "x"}), "j",
                         minutes=5, local_port=None, dry_run=True, echo=print)


@pytest.mark.parametrize("path", [None, "/", "/short/", "/" + "k" * 32, "/../" + "k" * 32 + "/"])
def test_an_answer_without_a_secret_path_is_an_error(path) -> None:
    """An older master's TensorBoard serves every path to every user on the master: dlc
    says so rather than open it."""
    with pytest.raises(errors.DlcError, match="without its secret path"):
        board.open_board(Target(region="eu-west-1"), FakeRemote({"port": 6006, "path": path}),
                         "j", minutes=5, local_port=None, dry_run=True, echo=print)
