"""Example job: TensorFlow MultiWorkerMirroredStrategy on scikit-learn's digits (no download).

    dl-run --launcher tf -- python -m bootstrap_scripts.examples.train_digits_tf

The TensorFlow counterpart of ``train_digits`` (the PyTorch example): the same data, split
and network, trained across every node with ``tf.distribute.MultiWorkerMirroredStrategy``.
The strategy learns the cluster and this node's task from ``TF_CONFIG``, which ``dl-run
--launcher tf`` writes for each node (one worker task per node, master first); the gradients
of every step are all-reduced across the workers over TensorFlow's own gRPC channels.

Rank 0 (the chief, worker 0) prints the PyTorch example's epoch and final lines, so whatever
reads those (``make demo``) reads these (its start line has fields of its own)::

    start world_size=2 framework=tensorflow version=2.21.0 workers=2
    epoch=3 acc=0.9611 loss=0.1234 samples_per_s=2345 world_size=2 lr=3.00e-03 global_batch=64
    final acc=0.9694 world_size=2

and every worker prints ``done rank=R world_size=W steps=S weights_checksum=C`` at the end:
the same checksum on every worker shows that they trained in lockstep.

Data: the PyTorch example's world-size policy. Each step's global batch
(``--global-batch-size``, default 64, at any world size) is the same chunk of an
epoch-seeded permutation, split between the workers as evenly as it goes; each worker's
loss is its samples' sum over the global batch size and the gradients are all-reduced as a
SUM (``ReplicaContext.all_reduce``), so every step applies the global batch's mean gradient
whatever the number of nodes. Adam is written out over mirrored variables, so apart from the
variables' initial values (which the strategy broadcasts from worker 0 when they are
created) what crosses the network is that all-reduce. No checkpoints: the PyTorch example
is the one that shows checkpoints, resume and elastic training.

TensorFlow is not a dependency of the project: ``make tf-deps`` installs ``tensorflow-cpu``
into the project's virtualenv (docs/runner.md, "TensorFlow").
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="MultiWorkerMirroredStrategy example on "
                                            "scikit-learn's digits")
    p.add_argument("--epochs", type=int, default=20, help="epochs (default: 20)")
    p.add_argument("--global-batch-size", type=int, default=64,
                   help="samples per step over ALL workers (default: 64)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default: 3e-3)")
    p.add_argument("--hidden", type=int, default=128, help="hidden units (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="split / init / shuffle seed")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--require-acc", type=float, default=0.0,
                   help="exit 1 when the final held-out accuracy is below this (default: 0)")
    return p.parse_args(argv)


def load_data(seed: int, test_fraction: float):
    """The fixed split every worker computes identically (the PyTorch example's)."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)  # pixel values are 0..16
    return train_test_split(x, y.astype(np.int64), test_size=test_fraction, random_state=seed,
                            stratify=y)


def task_of(tf_config: str) -> tuple[str, int, int]:
    """(task type, index, worker count) from ``TF_CONFIG``; a single local worker without it.
    Read here only to report; the strategy reads the same variable itself."""
    if not tf_config:
        return "worker", 0, 1
    conf = json.loads(tf_config)
    task = conf.get("task", {})
    return task.get("type", "worker"), int(task.get("index", 0)), \
        len(conf.get("cluster", {}).get("worker", [])) or 1


def rank_slice(count: int, rank: int, world: int) -> tuple[int, int]:
    """Worker ``rank``'s part of ``count`` samples (the PyTorch example's rule: sizes differ
    by at most one, earlier ranks take the remainder)."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task_type, rank, workers = task_of(os.environ.get("TF_CONFIG", ""))
    if task_type != "worker":
        print(f"error: this example runs MultiWorkerMirroredStrategy: one worker task per "
              f"node (dl-run --launcher tf --tf-mode worker), not a {task_type!r} task",
              file=sys.stderr, flush=True)
        return 2
    import numpy as np
    import tensorflow as tf

    # Before any other TensorFlow call: the strategy starts this worker's gRPC server at
    # its TF_CONFIG address and waits until every worker's is up.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    world = strategy.num_replicas_in_sync  # one replica per worker on a CPU node
    chief = rank == 0
    if chief:
        print(f"start world_size={world} framework=tensorflow version={tf.__version__} "
              f"workers={workers}", flush=True)
    x, xt, y, yt = load_data(args.seed, args.test_fraction)
    sizes = (x.shape[1], args.hidden, args.hidden, 10)
    rng = np.random.default_rng(args.seed)  # the same initial weights on every worker
    with strategy.scope():
        # Mirrored variables. The gradients are all-reduced across the workers explicitly
        # below, so every worker applies the same update to its own copy: each copy takes
        # its first (only) local replica's value, no second exchange.
        def var(value: np.ndarray) -> tf.Variable:
            return tf.Variable(value.astype(np.float32),
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        params = []
        for n_in, n_out in itertools.pairwise(sizes):
            params += [var(rng.normal(0, (2.0 / n_in) ** 0.5, (n_in, n_out))),
                       var(np.zeros(n_out))]
        moments = [(var(np.zeros(p.shape)), var(np.zeros(p.shape))) for p in params]
        t = var(np.zeros(()))

    def forward(inputs: tf.Tensor) -> tf.Tensor:
        h = inputs
        for k in range(0, len(params), 2):
            h = h @ params[k] + params[k + 1]
            if k + 2 < len(params):
                h = tf.nn.relu(h)
        return h

    def replica_step(xb: tf.Tensor, yb: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        """This worker's samples of one global batch; ``scale`` = 1 / global batch size,
        so the all-reduced SUM is exactly the global batch's mean gradient."""
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=yb, logits=forward(xb))) * scale
        grads = tape.gradient(loss, params)
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        loss = ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss)
        t.assign_add(1.0)
        b1, b2, eps = 0.9, 0.999, 1e-7
        lr = args.lr * tf.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for p, g, (m, v) in zip(params, grads, moments, strict=True):  # Adam
            m.assign(b1 * m + (1 - b1) * g)
            v.assign(b2 * v + (1 - b2) * g * g)
            p.assign_sub(lr * m / (tf.sqrt(v) + eps))
        return loss

    spec = (tf.TensorSpec([None, x.shape[1]], tf.float32), tf.TensorSpec([None], tf.int64),
            tf.TensorSpec([], tf.float32))

    @tf.function(input_signature=spec)
    def train_step(xb: tf.Tensor, yb: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        per_replica = strategy.run(replica_step, args=(xb, yb, scale))
        return strategy.experimental_local_results(per_replica)[0]

    acc = 0.0
    gb = args.global_batch_size
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        perm = np.random.default_rng(args.seed + epoch).permutation(len(x))
        total = 0.0
        for start in range(0, len(x), gb):
            chunk = perm[start:start + gb]
            lo, hi = rank_slice(len(chunk), rank, world)
            idx = chunk[lo:hi]
            loss = train_step(x[idx], y[idx], tf.constant(1.0 / len(chunk)))
            total += float(loss) * len(chunk)
        elapsed = time.perf_counter() - t0
        # every worker holds the same weights: the chief evaluates its own copy
        acc = float(np.mean(np.argmax(forward(tf.constant(xt)).numpy(), axis=1) == yt))
        if chief:
            print(f"epoch={epoch} acc={acc:.4f} loss={total / len(x):.4f} "
                  f"samples_per_s={len(x) / max(elapsed, 1e-9):.0f} world_size={world} "
                  f"lr={args.lr:.2e} global_batch={gb}", flush=True)
    # Every worker's weights, summed: equal on all workers iff they trained in lockstep.
    checksum = sum(float(tf.reduce_sum(tf.abs(p))) for p in params)
    print(f"done rank={rank} world_size={world} steps={int(t.numpy())} "
          f"weights_checksum={checksum:.6f}", flush=True)
    if chief:
        print(f"final acc={acc:.4f} world_size={world}", flush=True)
        if acc < args.require_acc:
            print(f"error: final held-out accuracy {acc:.4f} is below --require-acc "
                  f"{args.require_acc}", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
