"""DCGM's profiling activity as node metrics (bootstrap_scripts/metrics/dcgm_metrics.py): ``dcgmi
dmon``'s rows parsed (N/A on a first sample, header and error lines skipped), the GPUs'
mean in percent, and a node without DCGM (or with a host engine that does not answer)
leaving the metrics out with the reason, never failing the GPU sample. The program run is a
stand-in ``dcgmi`` on PATH printing what ``dmon`` prints."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor.gpu_sampler import sample_line
from bootstrap_scripts.metrics import dcgm_metrics, gpu_metrics
from bootstrap_scripts.metrics import metric_names as names

DMON = """\
#Entity   SMACT        TENSO        DRAMA
ID
GPU 0     N/A          N/A          N/A
GPU 1     N/A          N/A          N/A
GPU 0     0.800        0.100        0.600
GPU 1     0.600        N/A          0.400
"""


def test_rows_are_parsed_keeping_each_gpus_last_known_value() -> None:
    values = dcgm_metrics.parse(DMON + "Error: something\nGPU x 1 2 3\nGPU 2 7.5 0.1 0.1\n")
    assert values[0] == [0.8, 0.1, 0.6]
    assert values[1] == [0.6, None, 0.4]
    assert values[2] == [None, 0.1, 0.1]  # 7.5 is not a ratio: not taken


def test_node_metrics_are_the_gpus_mean_in_percent() -> None:
    metrics = dcgm_metrics.node_metrics(dcgm_metrics.parse(DMON))
    assert metrics == {names.METRIC_GPU_SM_ACTIVE: (70.0, "Percent"),
                       names.METRIC_GPU_TENSOR_ACTIVE: (10.0, "Percent"),
                       names.METRIC_GPU_DRAM_ACTIVE: (50.0, "Percent")}
    assert dcgm_metrics.node_metrics(dcgm_metrics.parse("#Entity\nID\nGPU 0 N/A N/A N/A\n")) \
        == {}


def _dcgmi(tmp_path: Path, monkeypatch, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prog = bin_dir / "dcgmi"
    prog.write_text("#!/bin/sh\n" + script)
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return prog


def test_query_runs_dmon_with_the_fields_and_two_samples(tmp_path, monkeypatch) -> None:
    args = tmp_path / "args"
    _dcgmi(tmp_path, monkeypatch, f'echo "$@" > {args}\ncat <<"EOF"\n{DMON}EOF\n')
    assert dcgm_metrics.query()[names.METRIC_GPU_TENSOR_ACTIVE] == (10.0, "Percent")
    assert args.read_text().split() == ["dmon", "-e", "1002,1004,1005", "-c", "2", "-d", "1000"]


def test_without_dcgm_or_its_host_engine_the_reason_is_given(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(dcgm_metrics.DcgmUnavailable, match="no dcgmi on PATH"):
        dcgm_metrics.query()
    _dcgmi(tmp_path, monkeypatch, 'echo "Error: unable to establish a connection to the '
                                  'specified host: localhost" >&2\nexit 255\n')
    with pytest.raises(dcgm_metrics.DcgmUnavailable, match=r"exited 255.*unable to establish"):
        dcgm_metrics.query()


def test_the_node_line_carries_them_per_node() -> None:
    readings = gpu_metrics.parse("0, 57, 1200, 61, 120.50, 0, No\n")
    line = sample_line(readings, "c1", "i-0abc", 1, profiling=dcgm_metrics.node_metrics(
        dcgm_metrics.parse(DMON)))
    doc = json.loads(line or "")
    assert doc[names.METRIC_GPU_TENSOR_ACTIVE] == 10.0
    (node,) = [d for d in doc["_aws"]["CloudWatchMetrics"]
               if d["Dimensions"] == [[names.DIM_CLUSTER, names.DIM_INSTANCE]]]
    assert {"Name": names.METRIC_GPU_TENSOR_ACTIVE, "Unit": "Percent"} in node["Metrics"]


def test_the_installer_starts_dcgms_host_engine_only_where_the_image_has_it(
        tmp_path, monkeypatch) -> None:
    from bootstrap_scripts.agent import install

    calls = tmp_path / "calls"
    bin_dir = tmp_path / "sbin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    # `systemctl cat` finds the unit only when the file "has-dcgm" exists
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                         f'[ "$1" = cat ] && {{ [ -e {tmp_path}/has-dcgm ] || exit 1; }}\n'
                         f'[ "$1" = enable ] && [ -e {tmp_path}/broken ] && '
                         '{ echo "Job failed" >&2; exit 1; }\nexit 0\n')
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert install.start_dcgm() is False
    assert calls.read_text().splitlines() == ["cat nvidia-dcgm.service"]
    (tmp_path / "has-dcgm").touch()
    assert install.start_dcgm() is True
    assert calls.read_text().splitlines()[-1] == "enable --now nvidia-dcgm.service"
    (tmp_path / "broken").touch()
    assert install.start_dcgm() is False  # said, not fatal
