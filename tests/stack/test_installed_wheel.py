"""The package works when installed as a wheel into someone else's CDK app (not from the repo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

from constructs_lib.user_data import INSTALL_MODULE
from tests.stack.synth import REPO

#: The node installer the user data runs, inside the package and inside the node-scripts asset.
INSTALLER = INSTALL_MODULE.replace(".", "/") + ".py"

USER_APP = textwrap.dedent("""
    import sys
    import aws_cdk as cdk
    import constructs_lib
    from constructs_lib import DeepLearningCluster

    app = cdk.App(outdir=sys.argv[1])
    stack = cdk.Stack(app, "PlatformTeamStack")
    cluster = DeepLearningCluster(
        stack, "Training",
        worker_count=3,
        worker_instance_type="p4d.24xlarge",
        master_instance_type="g5.2xlarge",
        image_type="amazon-linux-2023",
        efs_mount_point="/shared",
        root_volume_gib=250,
        create_placement_group=True,
        vpc_cidr="10.42.0.0/16",
    )
    cdk.CfnOutput(stack, "Workers", value=cluster.worker_group.group_name)
    app.synth()
    print("module:", constructs_lib.__file__)
""")


def test_wheel_installs_and_synthesizes_outside_the_repo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    (wheel,) = dist.glob("dl_cluster_cdk-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for expected in (
        "constructs_lib/cluster.py",
        "lambda_src/capacity_adjuster.py",
        INSTALLER,
        "stacks/cluster_stack.py",
    ):
        assert expected in names, expected
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/")]

    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "user_app.py").write_text(USER_APP)
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20",
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
    }
    out = work / "cdk.out"
    # -P: do not put the script's directory first; cwd is not the repo either.
    proc = subprocess.run(
        [sys.executable, "user_app.py", str(out)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"module: {site}" in proc.stdout
    template = json.loads((out / "PlatformTeamStack.template.json").read_text())
    text = json.dumps(template)
    assert '"DesiredCapacity": "3"' in text and "p4d.24xlarge" in text and "'/shared'" in text
    assets = json.loads((out / "PlatformTeamStack.assets.json").read_text())["files"]
    sources = [a["source"]["path"] for a in assets.values()]
    # the Lambda and node-script assets were found inside the installed package
    assert sum(1 for s in sources if s.startswith("asset.")) >= 2
    staged = [p for p in out.glob("asset.*") if p.is_dir()]
    assert any((p / "capacity_adjuster.py").exists() for p in staged)
    assert any((p / INSTALLER.removeprefix("bootstrap_scripts/")).exists() for p in staged)
