"""One torchft replica group (one process, CPU, Gloo) training the example's model on the
example's data, for the torchft recovery bench (``tests/chaos/test_torchft_bench.py``).

Run with the Python of the torchft venv (``make torchft-setup``), never the project's
``.venv``: torchft is not one of the product's dependencies. It trains what
``bootstrap_scripts/examples/train_digits.py`` trains (the 64-128-128-10 MLP, Adam, the
fixed global batch of 64 split over the replicas that take part in the step, the same
samples for step k at any world size: ``digits_data.epoch_batches``), but written against
torchft: a ``Manager`` per replica group asks the Lighthouse for a quorum every step, a
step whose all-reduce failed (a peer died) is not committed and is retried in the next
quorum, and a replica that (re)joins receives the weights, the optimizer state and the step
from a live peer (torchft's HTTP checkpoint transport) instead of reading a checkpoint.

``--plain`` runs the same loop without torchft (``init_process_group("gloo")`` and torch's
own DDP; ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` from the environment): the
reference for torchft's per-step overhead.

Every event is one JSON line appended to ``--events`` (the harness reads them; times are
``time.time()``): ``start`` (the process's first line, before torch is imported),
``ready`` (torch imported, the Manager or the process group up), one ``step`` per
attempted step (the step it reached, whether it was committed, how many replicas took
part, whether this replica sat the step out to be healed, the seconds spent waiting for
the quorum and in ``should_commit``, a checksum of the weights after the step), and
``done``.
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replica", type=int, default=0, help="replica group id (0..N-1)")
    p.add_argument("--lighthouse", default="", help="the Lighthouse's address")
    p.add_argument("--data", required=True, help="torch.save'd {x, y} training tensors")
    p.add_argument("--steps", type=int, required=True, help="stop at this committed step")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="sleep this long after each step (a GPU step's compute)")
    p.add_argument("--min-replicas", type=int, default=2)
    p.add_argument("--events", required=True, help="JSON lines go here ({pid}: this "
                   "process's id, for several processes of one command)")
    p.add_argument("--plain", action="store_true", help="no torchft: torch's gloo and DDP")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    out = open(args.events.replace("{pid}", str(os.getpid())), "a", buffering=1)  # noqa: SIM115 (open for the whole run)

    def emit(kind: str, **fields: object) -> None:
        out.write(json.dumps({"event": kind, "replica": args.replica, "pid": os.getpid(),
                              "t": time.time(), **fields}) + "\n")

    emit("start", t=T0)
    from datetime import timedelta

    import torch
    from torch import nn

    from bootstrap_scripts.examples.digits_data import epoch_batches, steps_per_epoch

    torch.set_num_threads(1)
    data = torch.load(args.data, weights_only=True)
    xtr, ytr = data["x"], data["y"]
    n, gb = len(ytr), args.global_batch_size
    spe = steps_per_epoch(n, gb)
    torch.manual_seed(args.seed)  # identical initial weights in every replica
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    if args.plain:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
        net = DistributedDataParallel(model)
        manager = None
    else:
        from torch.distributed import TCPStore
        from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

        # the replica group's own store (one process per group: this process is its rank 0)
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

        def load_state_dict(state: dict) -> None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])

        def state_dict() -> dict:
            return {"model": model.state_dict(), "optim": optimizer.state_dict()}

        manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), load_state_dict=load_state_dict,
            state_dict=state_dict, min_replica_size=args.min_replicas,
            timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=60),
            connect_timeout=timedelta(seconds=10), rank=0, world_size=1,
            store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=args.lighthouse,
            replica_id=f"replica_{args.replica}", hostname="127.0.0.1")
        net = DistributedDataParallel(manager, model)
    emit("ready")

    done = 0  # committed steps (plain: every step)
    while done < args.steps:
        t_step = time.perf_counter()
        quorum_s = commit_s = 0.0
        healing = False
        if manager is not None:
            t = time.perf_counter()
            manager.start_quorum()
            manager.wait_quorum()
            quorum_s = time.perf_counter() - t
            # a replica being healed (state received from a peer) sits this step out
            healing = not manager.is_participating()
            done = manager.current_step()
            prank, world = manager.participating_rank(), manager.num_participants()
        else:
            prank, world = dist.get_rank(), dist.get_world_size()
        epoch, in_epoch = done // spe + 1, done % spe
        idx, count = epoch_batches(n, args.seed, epoch, gb, prank or 0, max(world, 1),
                                   in_epoch)[0]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(xtr[idx]), ytr[idx])
        (loss * (max(world, 1) / count)).backward()  # the all-reduce's mean: the batch mean
        if manager is not None:
            t = time.perf_counter()
            committed = manager.should_commit()
            commit_s = time.perf_counter() - t
        else:
            committed = True
        if committed:
            optimizer.step()
            done = manager.current_step() if manager is not None else done + 1
        checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
        emit("step", step=done, committed=committed, world=world, healing=healing,
             quorum_s=round(quorum_s, 5), commit_s=round(commit_s, 5),
             step_s=round(time.perf_counter() - t_step, 5), checksum=checksum,
             loss=loss.item() / max(1, len(idx)))
        if args.step_delay:
            time.sleep(args.step_delay)
    emit("done", step=done)
    if manager is not None:
        manager.shutdown(wait=False)
    else:
        dist.destroy_process_group()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
