"""A string known only once the construct tree is complete, resolved at synthesis.

The nodes' user data is written before some resources it names exist (the job role, made
after the node roles it trusts; a node role, made with its group after the user data);
an existing VPC's id is known only once the stack that looks it up has made it.
"""

from __future__ import annotations

from collections.abc import Callable

import jsii
from aws_cdk import IStableStringProducer, Lazy


@jsii.implements(IStableStringProducer)
class _Late:
    def __init__(self, get: Callable[[], str]) -> None:
        self.get = get

    def produce(self) -> str:
        return self.get()


def late_string(get: Callable[[], str]) -> str:
    """``get()``, called at synthesis (a token until then)."""
    return Lazy.string(_Late(get))
