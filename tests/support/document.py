"""Running the cluster's SSM Command document script as the SSM Agent runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from constructs_lib.operator_document import document_content
from dlc import remote


def run_document_script(tmp_path: Path, params: dict[str, str],
                        tool: str) -> subprocess.CompletedProcess:
    """The cluster document's script, run by a real sh as the agent runs it (parameters as
    SSM_<name>), with ``tool`` installed as every dl-* command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in remote.COMMANDS:
        (bin_dir / name).write_text(tool)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "doc.sh"
    script.write_text("\n".join(document_content()["mainSteps"][0]["inputs"]["runCommand"]))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **{f"SSM_{k}": v for k, v in params.items()}}
    return subprocess.run(["sh", str(script)], capture_output=True, env=env, timeout=30)
