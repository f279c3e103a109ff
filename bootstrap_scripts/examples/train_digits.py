"""Example job: PyTorch DDP on scikit-learn's digits (ships with scikit-learn: no download).

    dl-run -- python -m bootstrap_scripts.examples.train_digits            # every node
    dl-run -- python -m bootstrap_scripts.examples.train_digits --resume   # from EFS
    dl-run --elastic -- python -m bootstrap_scripts.examples.train_digits  # join / leave

The first thing to run on a new cluster: it exercises the rendezvous, the collective
backend (gloo on CPU, nccl on GPU), EFS checkpoints and resume, in about 20 s on CPUs.

Rank 0 prints one line per (re)start and one per epoch, readable and machine-parsable::

    start world_size=3 restart=0 step=0 epoch=1 resumed_from=- ...
    epoch=3 acc=0.962 loss=0.1234 samples_per_s=12345 world_size=3 lr=0.002 global_batch=64

Every rank prints ``first_step rank=R world_size=W step=S`` when it takes its first step
after a (re)start (how the harness measures when a joining node really trains).

World-size policy (why training stays correct when the cluster grows or shrinks): the
GLOBAL batch (``--global-batch-size``, default 64) and the learning-rate schedule are fixed.
Global step ``k`` of epoch ``e`` always uses the same samples: a permutation seeded with
``seed + e``, chunk ``k`` of ``global_batch`` samples, split across the ranks as evenly as it
goes (any world size: 64 on 3 ranks is 22 + 21 + 21). Each rank's loss is its samples' SUM
scaled by ``world_size / samples in the global batch``, so DDP's gradient average is exactly
the mean over the global batch whatever the split. A run at any world size, or one whose
world size changes mid-epoch, therefore follows the same optimisation path (up to float
summation order). This is why the job shards the data itself rather than with
DistributedSampler, whose padding and interleaving depend on the world size, so a position
inside an epoch would not carry over to another world size.

Checkpoints (rank 0, ``checkpoints.py`` next to this file: temp file + rename, then a
manifest written last, ``latest.json`` points at the newest; written in the background by
``checkpoint_writer.py``, the loop waits only for a copy of the state), on EFS under
``<EFS>/checkpoints/<user>/<name>/`` (the user's own directory, which the job executors make
0700 for them): ``epoch-NNNN.pt`` at the end of every epoch and
``step-NNNNNN.pt`` every ``--checkpoint-every`` steps (and when the job is stopped with
SIGTERM). A (re)start resumes from the latest checkpoint automatically when it was written
by the SAME run (torchrun's run id = the job id: an elastic restart after a join or a leave),
or of any run with ``--resume``. A restart thus loses at most ``--checkpoint-every`` steps.
The job exits only after its last save is on disk, and a failed background save fails the
job. Rank 0's last line says what checkpointing cost (``checkpoints mode=async saves=N
blocked_ms_per_save=... write_ms_per_save=...``): the figures for choosing the interval
(docs/runner.md, "Checkpoint interval").

A checkpoint is a file another program could have written, so loading one must not run its
code: it is loaded with ``torch.load(weights_only=True)`` (tensors and plain data only, never
a pickled object), and only from the checkpoint directory itself: a manifest or
``latest.json`` must name a checkpoint file in it (no path, no link), and both must belong to
the user running the job; anything else is ignored with a message and the run starts from
scratch. The manifest is what the S3 mirror of a managed job's checkpoints goes by.

As a managed job (``dl-run`` through the job controller) it follows the controller's
variables: ``DL_CHECKPOINT_DIR`` is the checkpoint directory (unless ``--checkpoint-dir``
is given), ``DL_RESUME=1`` (a restart after a fault) means ``--resume``, and the start line
reports ``job_restarts=<DL_RESTART_COUNT>``. With ``DL_CHECKPOINT_LOCAL_DIR`` (a directory on
the node's own disk) rank 0 writes each checkpoint there first and copies it to the
checkpoint directory, so the S3 mirror uploads it without reading EFS back.

The data's split is cached in the checkpoint directory (``digits_data.py``): a restart loads
it with numpy rather than importing scikit-learn again. The flags and the checkpoint
directory's choice are in ``train_digits_args.py``.

``--stop-file PATH`` ends the run at the next epoch boundary once PATH exists (``make demo``'s
elastic scenario: the job trains until the nodes it adds and removes have come and gone).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from bootstrap_scripts import progress, tensorboard_log
from bootstrap_scripts.examples import train_progress
from bootstrap_scripts.examples.checkpoint_writer import CheckpointWriter

# the checkpoint part, re-exported: tests and tools use train_digits.latest_info & co.
from bootstrap_scripts.examples.checkpoints import (  # noqa: F401
    CHECKPOINT_NAME_RE,
    UntrustedCheckpoint,
    latest_checkpoint,
    latest_info,
    load_checkpoint,
    open_own,
    save_checkpoint,
)

# the data part, re-exported: tests use train_digits.load_data & co.
from bootstrap_scripts.examples.digits_data import (  # noqa: F401
    epoch_batches,
    load_data,
    rank_slice,
    steps_per_epoch,
)

# the command line: its flags and the checkpoint directory
from bootstrap_scripts.examples.train_digits_args import checkpoint_dir, parse_args


def epoch_lr(base: float, epoch: int, epochs: int) -> float:
    """Cosine decay to zero over ``epochs``: a function of the epoch alone, so a resumed run
    (any world size) continues on exactly the same schedule."""
    return base * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / max(1, epochs)))


def stop_file_seen(path: str, distributed: bool, device: object) -> bool:
    """Whether any rank sees ``path``: one all-reduce, so every rank takes the same
    decision even when the file reaches the nodes' views of EFS at different moments."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if os.path.exists(path) else 0.0], device=device)
    if distributed:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def evaluate(model, xt, yt) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        acc = (model(xt).argmax(dim=1) == yt).float().mean().item()
    model.train()
    return acc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    stop = {"signal": 0}

    def on_term(signum: int, _frame: object) -> None:
        stop["signal"] = signum  # finish the step, checkpoint, exit (see the loop)

    signal.signal(signal.SIGTERM, on_term)
    distributed = "WORLD_SIZE" in os.environ
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if distributed:
        dist.init_process_group(backend=backend, timeout=train_progress.collective_timeout())
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # small model: threads only fight the other ranks for cores
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "") or os.environ.get("DL_JOB_ID", "")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    job_restarts = int(os.environ.get("DL_RESTART_COUNT", "0") or 0)
    resume = args.resume or os.environ.get("DL_RESUME") == "1"

    ckdir = checkpoint_dir(args)  # also where the data's split is cached for restarts
    x_train, x_test, y_train, y_test = load_data(args.seed, args.test_fraction, args.data_dir,
                                                 cache_dir=ckdir)
    xtr, ytr = torch.from_numpy(x_train), torch.from_numpy(y_train)
    xt, yt = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)
    n, gb = len(ytr), args.global_batch_size
    spe = steps_per_epoch(n, gb)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    epoch, step = 1, 0  # the next step to take: step `step` of epoch `epoch`
    acc: float | None = None
    info = latest_info(ckdir)
    same_run = bool(info and run_id and info.get("run_id") == run_id)
    resumed = ""
    if info and (resume or same_run):
        state = load_checkpoint(info["path"], device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step = int(state["epoch"]), int(state["step"])
        if step >= spe:  # an epoch-end checkpoint: the next epoch starts
            epoch, step = epoch + 1, 0
        acc = state.get("acc")
        resumed = info["path"].name
        if rank == 0:
            print(f"resumed from {info['path']} (epoch {state['epoch']}, step "
                  f"{state['step']}/{spe}, saved with world size {state['world_size']}, "
                  f"now {world})", flush=True)
    elif resume and rank == 0:
        print(f"no checkpoint in {ckdir}: starting from scratch", flush=True)
    net = DDP(model) if distributed else model
    tracker = train_progress.Tracker()  # progress (hangs, stragglers): its own step time
    tracker.attach(net)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    global_step = (epoch - 1) * spe + step
    if rank == 0:
        print(f"start world_size={world} restart={restart} step={global_step} epoch={epoch} "
              f"resumed_from={resumed or '-'} backend={backend} device={device} train={n} "
              f"test={len(yt)} global_batch={gb} epochs={epoch}..{args.epochs} "
              f"checkpoints={ckdir} job_restarts={job_restarts}", flush=True)

    def state_dict(ep: int, st: int) -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": ep, "step": st, "global_step": (ep - 1) * spe + st,
                "world_size": world, "acc": acc, "run_id": run_id,
                "global_batch_size": gb, "lr": args.lr}

    def save(ep: int, st: int) -> None:  # rank 0: step-NNNNNN.pt, or epoch-NNNN.pt at its end
        name = f"epoch-{ep:04d}.pt" if st == spe else f"step-{(ep - 1) * spe + st:06d}.pt"
        saver.save(state_dict(ep, st), name)

    first = True
    board = tensorboard_log.open_writer(args.tensorboard_dir) if rank == 0 else None
    local = os.environ.get("DL_CHECKPOINT_LOCAL_DIR")  # the S3 mirror reads it, not EFS
    saver = CheckpointWriter(ckdir, args.keep, asynchronous=not args.sync_checkpoints,
                             local=Path(local) if local else None)
    loop_s = 0.0
    with saver:  # every way out waits for the save in flight and fails on its error
        while epoch <= args.epochs and not stop["signal"]:
            lr = epoch_lr(args.lr, epoch, args.epochs)
            for group in optimizer.param_groups:
                group["lr"] = lr
            net.train()
            t0 = time.perf_counter()
            total_loss, samples = 0.0, 0
            for idx, count in epoch_batches(n, args.seed, epoch, gb, rank, world, step):
                t_step = time.perf_counter()
                xb, yb = xtr[idx].to(device), ytr[idx].to(device)
                optimizer.zero_grad(set_to_none=True)
                try:
                    loss = loss_fn(net(xb), yb)
                    (loss * (world / count)).backward()  # DDP averages: the global-batch mean
                except Exception:
                    # A peer left (drain, lost node): the gradient all-reduce failed before this
                    # step changed anything, so the weights are those after the last completed
                    # step. Rank 0 saves them: the restarted workers lose no step at all.
                    if rank == 0 and step:
                        save(epoch, step)
                        print(f"peer lost at step {(epoch - 1) * spe + step}: saved it "
                              f"world_size={world}", flush=True)
                    if stop["signal"]:
                        break
                    raise
                optimizer.step()
                total_loss, samples = total_loss + loss.item(), samples + len(idx)
                step += 1
                tracker.step((epoch - 1) * spe + step, loss.item() / len(idx), len(idx) * world)
                tensorboard_log.scalars(board, (epoch - 1) * spe + step,
                                        loss=loss.item() / len(idx),
                                        step_time_s=time.perf_counter() - t_step)
                if first:
                    print(f"first_step rank={rank} world_size={world} "
                          f"step={(epoch - 1) * spe + step}", flush=True)
                    first = False
                if rank == 0 and args.checkpoint_every and step < spe and \
                        step % args.checkpoint_every == 0:
                    save(epoch, step)
                if args.step_delay:
                    time.sleep(args.step_delay)
                if stop["signal"]:
                    break
            if stop["signal"] and step < spe:
                if rank == 0:  # stopped mid-epoch (drain, cancel): keep the progress
                    save(epoch, step)
                    print(f"stopped by signal {stop['signal']} at step "
                          f"{(epoch - 1) * spe + step} world_size={world}", flush=True)
                break
            elapsed = time.perf_counter() - t0
            loop_s += elapsed  # the step loop's own time: checkpoint stalls included
            if rank == 0:
                acc = evaluate(model, xt, yt)
                save(epoch, spe)
                tensorboard_log.scalars(board, epoch * spe, accuracy=acc, lr=lr,
                                        samples_per_s=samples * world / max(elapsed, 1e-9))
                print(f"epoch={epoch} acc={acc:.4f} loss={total_loss / max(1, samples):.4f} "
                      f"samples_per_s={samples * world / max(elapsed, 1e-9):.0f} "
                      f"world_size={world} lr={lr:.2e} global_batch={gb}", flush=True)
            epoch, step = epoch + 1, 0
            if distributed:
                dist.barrier()  # nobody races ahead of this epoch's checkpoint (its copy)
            if args.stop_file and epoch <= args.epochs and \
                    stop_file_seen(args.stop_file, distributed, device):
                if rank == 0:
                    print(f"stop file {args.stop_file} exists: ending after epoch {epoch - 1}",
                          flush=True)
                break
        saver.close()  # the last save is on disk (or its error raised) before anything else
    tensorboard_log.close(board)
    if saver.stats.saves:
        print(saver.summary(loop_s), flush=True)
    if stop["signal"]:
        if distributed:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        return 128 + stop["signal"]
    if rank == 0:
        if acc is None:  # resumed after the last epoch from a checkpoint without accuracy
            acc = evaluate(model, xt, yt)
        print(f"final acc={acc:.4f} world_size={world}", flush=True)
    ok = rank != 0 or (acc is not None and acc >= args.require_acc)
    if distributed:
        # Tear the group down together: a rank that destroys its gloo pairs while rank 0 is
        # still evaluating can abort at exit ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()
    if not ok:
        print(f"error: final held-out accuracy {acc:.4f} is below --require-acc "
              f"{args.require_acc}", file=sys.stderr, flush=True)
    return 0 if ok else 1


def exit_without_teardown(run: Callable[[], int]) -> NoReturn:
    """Run ``run`` (``main``) and end the process at once with its status, skipping the
    interpreter's teardown (``os._exit``). Why: torchrun's agent restarts its workers only
    once every one of them has exited, and after a peer's loss, a node's join or SIGTERM
    the teardown of an interpreter that imported torch (with its compiler stack, which
    ``torch.optim`` and DDP load) and holds a gloo group takes 0.4-0.8 s of CPU per worker, 1-2 s
    of wall time on a loaded node (measured: docs/runner.md, "What was cut"), on every
    restart's path. Nothing is lost: every way out of ``main`` has already waited for its
    checkpoint on disk (``CheckpointWriter``), a return has closed its TensorBoard writer
    (torch's writer has no exit hook that a teardown would run either); an exception's
    traceback is printed as the interpreter would, with status 1; the last progress step
    (``progress``' ``atexit`` hook, which ``os._exit`` skips) and the output streams are
    flushed. ``SystemExit`` (``--help``, a bad flag) and
    ``KeyboardInterrupt`` take the ordinary way out."""
    try:
        code = run()
    except Exception:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        progress.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main)
