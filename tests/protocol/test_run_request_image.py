"""A run request's ``image``: pinned, well formed, torchrun only, one serialization."""

from __future__ import annotations

import pytest

from bootstrap_scripts.protocol.jobs import JobSpecError
from bootstrap_scripts.protocol.run_request import RunRequest

PINNED = "127.0.0.1:5000/team/train:v1@sha256:" + "0a" * 32


def test_a_pinned_image_round_trips_through_the_request():
    request = RunRequest(job_id="job-1", command=("train.py",), image=PINNED)
    assert RunRequest.from_json(request.to_json()).image == PINNED
    assert RunRequest(job_id="job-1", command=("train.py",)).image == ""


@pytest.mark.parametrize(("image", "launcher", "says"), [
    ("127.0.0.1:5000/team/train:v1", "torchrun", "not pinned"),
    ("127.0.0.1:5000/Team/train@sha256:" + "0a" * 32, "torchrun", "'Team'"),
    ("127.0.0.1:5000/team/train@sha256:abc", "torchrun", "digest"),
    (PINNED, "mpi", "torchrun launcher only"),
])
def test_a_request_with_an_image_it_cannot_run_is_refused_naming_it(image, launcher, says):
    with pytest.raises(JobSpecError, match=None) as caught:
        RunRequest(job_id="job-1", command=("train.py",), image=image, launcher=launcher)
    assert says in str(caught.value)
    assert caught.value.field == "image"
