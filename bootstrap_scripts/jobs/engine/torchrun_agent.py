"""torchrun for an elastic job, with a spare node's clean exit.

``python torchrun_agent.py <torchrun options> script ...`` (run by file path with the job's
interpreter, like ``rdzv_store.py``: it imports only the standard library and torch, so it
needs no PYTHONPATH) is ``python -m torch.distributed.run`` with one mend.

Why: an elastic job's nodes beyond its ``--nnodes`` MAX are spares. TorchElastic keeps
them on its rendezvous's *redundancy list*: they hold no rank and start no worker, and
when a participant leaves (its machine lost) the next round takes a spare in its place,
so the job trains on at full size without waiting for a replacement to boot. When the job
ends, the participants close the rendezvous and a spare's agent is meant to exit cleanly
(``RendezvousGracefulExitError``, "terminating pending rendezvous"). In torch 2.x up to at
least 2.13 it does not: ``SimpleElasticAgent.run`` catches that error and returns None,
and ``launch_agent`` then calls ``None.is_failed()``, so the spare exits 1 with an
``AttributeError`` traceback, and a job that succeeded would be reported failed (pytorch
issue 194710, open when this was written; its proposed fix returns a succeeded
``RunResult`` on that path, which is what this does).

The mend wraps ``SimpleElasticAgent.run``: a None from it becomes a succeeded result with
no worker return values. A torch whose ``run`` returns a result on that path is not
changed; a torch without the class (another layout) runs unpatched.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Run by file path with the job's interpreter (the nodes are identical machines).
TORCHRUN_AGENT_SCRIPT = str(Path(__file__).resolve())
#: What the spare's agent says on its way out (its share's log).
SPARE_EXIT = ("[dl-run] this node was a spare (TorchElastic's redundancy list): the job "
              "ended without needing it")


def patch_graceful_exit() -> bool:
    """Make a spare's graceful exit a success (see the module's docstring); True when the
    patch was applied."""
    try:
        from torch.distributed.elastic.agent.server import api
    except ImportError:
        return False
    agent_cls = getattr(api, "SimpleElasticAgent", None)
    if agent_cls is None or getattr(agent_cls.run, "_dl_spare_exit", False):
        return agent_cls is not None
    original = agent_cls.run

    def run(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if result is None:
            print(SPARE_EXIT, file=sys.stderr, flush=True)
            return api.RunResult(state=api.WorkerState.SUCCEEDED)
        return result

    run._dl_spare_exit = True  # type: ignore[attr-defined]
    agent_cls.run = run
    return True


def main(argv: list[str] | None = None) -> None:
    patch_graceful_exit()
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv)


if __name__ == "__main__":
    main()
