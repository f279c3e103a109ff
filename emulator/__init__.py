"""The local emulator: AWS played on one machine, for the demo and the test suites.

moto's server and what it lacks (``cloud``), the stack deployed to it (``deploy``) or its
AWS side created directly (``resources``), Auto Scaling notifications to the real Lambda
(``notifications``), per-node instance metadata (``imds``), GPUs (``gpus``), the
wait-condition handle (``wait_handle``) and the emulated nodes themselves (``nodes``).
docs/demo.md describes each piece.

Not shipped to nodes: product code must never import from here.
"""
