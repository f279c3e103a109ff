"""The environment a root process started for a user's job gets: an allowlist, nothing else.

The dynamic loader, the C library and every interpreter read their environment before a
line of the program runs: ``LD_PRELOAD``, ``LD_LIBRARY_PATH`` and ``LD_AUDIT`` load a
library into the process, ``GCONV_PATH``, ``LOCPATH`` and ``NLSPATH`` make the C library
load or parse files, ``GLIBC_TUNABLES`` steers its allocator, ``PYTHONPATH``/``PYTHONHOME``,
``BASH_ENV``/``ENV``, ``PERL5OPT``, ``RUBYOPT``, ``NODE_OPTIONS`` and ``OPENSSL_CONF`` make a
program run code of someone's choosing. A set-uid program is protected by the loader's
secure mode; a process that root starts is not: whatever its environment holds, it loads
as uid 0. A list of dangerous names is always one name short (glibc adds variables, every
interpreter has its own), so a root process a job needs (the share's exit-status wrapper)
gets the few fixed values below and the product's own variables, never a byte of the
job's environment; the job's environment is applied only in the process that already runs
as the job's user (``execve`` after the switch).
"""

from __future__ import annotations

#: A system PATH for root: no directory a user can write, whatever the job's PATH says.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The values every root process gets (the C locale: no locale file of anyone's choosing).
FIXED: dict[str, str] = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
#: The product's own variables a root process may carry, set from the executor's state:
#: ``DL_SHARE_TOKEN`` (how a share's processes are found and stopped, ``procgroup``).
PRODUCT = ("DL_SHARE_TOKEN",)


def root_env(**product: str) -> dict[str, str]:
    """The whole environment of a root process started for a job: :data:`FIXED` plus the
    named product variables (ValueError for any other name, so that a caller cannot pass
    a job's variable through by mistake)."""
    unknown = sorted(set(product) - set(PRODUCT))
    if unknown:
        raise ValueError(f"not a variable a root process may carry: {', '.join(unknown)}")
    return {**FIXED, **product}
