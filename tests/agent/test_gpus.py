"""GPU count comes from ``nvidia-smi -L``; absent or failing means 0."""

from __future__ import annotations

from bootstrap_scripts.agent.gpus import count_gpus, parse_nvidia_smi_list
from emulator.gpus import fake_nvidia_smi


def test_counts_gpu_lines_not_mig_devices():
    text = ("GPU 0: A100-SXM4-40GB (UUID: GPU-1)\n"
            "  MIG 1g.5gb Device 0: (UUID: MIG-1)\n"
            "GPU 1: A100-SXM4-40GB (UUID: GPU-2)\n")
    assert parse_nvidia_smi_list(text) == 2


def test_fake_driver_on_path(tmp_path, monkeypatch):
    bindir = fake_nvidia_smi(tmp_path / "bin", 8)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    assert count_gpus() == 8


def test_no_driver_means_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert count_gpus() == 0


def test_failing_driver_means_zero(tmp_path, monkeypatch):
    bindir = fake_nvidia_smi(tmp_path / "bin", 8, fault=True)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    assert count_gpus() == 0
