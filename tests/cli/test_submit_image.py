"""``dlc submit --image``: a pinned reference or a tag travels to dl-run in the document's
``arguments`` (its allowedPattern admits both; dl-run resolves a tag on the master); a
malformed reference or another launcher is refused on the laptop with the request's own
rule."""

from __future__ import annotations

import re

import pytest

from constructs_lib.operator_document import ARGUMENTS_PATTERN
from dlc import jobs
from dlc.errors import UsageError

PINNED = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:v3@sha256:" + "9c" * 32


def argv(**kw) -> list[str]:
    base = {"launcher": None, "max_restarts": None, "min_nodes": None, "name": None}
    return jobs.submit_argv(("python", "train.py"), **{**base, **kw})


@pytest.mark.parametrize("image", [PINNED, "nvcr.io/nvidia/pytorch:24.05-py3"])
def test_an_image_reaches_dl_run_through_the_documents_arguments(image):
    args = argv(image=image)
    assert args[args.index("--image") + 1] == image
    options = " ".join(args[:args.index("--")])
    assert re.fullmatch(ARGUMENTS_PATTERN, options)
    assert "--image" not in argv()


@pytest.mark.parametrize(("image", "launcher", "says"), [
    ("nvcr.io/nvidia/pytorch:24.05", "mpi", "torchrun launcher only"),
    ("nvcr.io/NVIDIA/pytorch@sha256:" + "9c" * 32, None, "'NVIDIA'"),
    (PINNED, "mpi", "torchrun launcher only"),
])
def test_an_image_dl_run_would_refuse_is_refused_on_the_laptop(image, launcher, says):
    with pytest.raises(UsageError) as caught:
        argv(image=image, launcher=launcher)
    assert says in str(caught.value)
    assert not str(caught.value).startswith(" field")
