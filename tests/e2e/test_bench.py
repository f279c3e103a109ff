"""``make bench``: the demo's figures in one run (printed, never asserted on)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import REPO_ROOT
from tests.support.demo import assert_nothing_left, demo_env, run_demo

pytestmark = pytest.mark.bench


def synth_seconds(out_dir: str) -> float:
    env = demo_env()
    env.update({"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20",
                "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
                "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
                "CDK_DISABLE_VERSION_CHECK": "1", "CDK_CLI_NOTICES": "false"})
    t = time.monotonic()
    subprocess.run(["npx", "--no-install", "cdk", "synth", "DLClusterStack", "--no-lookups",
                    "-q", "--output", out_dir], cwd=REPO_ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    return time.monotonic() - t


@pytest.mark.parametrize("workers", [3])
def test_bench_demo_figures(tmp_path, workers):
    synth = synth_seconds(str(tmp_path / "cdk.out"))
    code, out, report = run_demo(tmp_path, "--workers", str(workers), "--epochs", "3",
                                 "--require-acc", "0")
    assert code == 0, out
    assert_nothing_left(tmp_path, report)
    t = report["timings"]
    print(f"\n[bench] nodes={workers + 1} cores={os.cpu_count()}")
    print(f"[bench] cdk synth                   {synth:6.1f} s")
    print(f"[bench] cdk bootstrap (emulator)    {t['bootstrap_s']:6.1f} s")
    print(f"[bench] cdk deploy (emulator)       {t['deploy_s']:6.1f} s  (synth included)")
    print(f"[bench] boot to membership          {t['boot_to_membership_s']:6.1f} s")
    print(f"[bench] training job ({len(report['epochs'])} epochs)     {t['job_s']:6.1f} s")
    print(f"[bench] whole demo                  {t['total_s']:6.1f} s")


def test_bench_elastic_join_and_drain(tmp_path):
    code, out, report = run_demo(tmp_path, "--elastic", "--add-worker-after", "2",
                                 "--remove-worker-after", "5", "--epochs", "40",
                                 "--require-acc", "0")
    assert code == 0, out
    assert_nothing_left(tmp_path, report)
    el = report["elastic"]
    print(f"\n[bench] elastic world sizes         {el['world_sizes']}")
    print(f"[bench] join latency                {el['join_latency_s']} s  (agent start -> "
          "first training step of the new node)")
    print(f"[bench] drain latency               {el['drain_latency_s']} s  (lifecycle notice "
          "-> training again without the node)")
    print(f"[bench] drain .done after notice    {el['drain'].get('done_s')} s")


def test_bench_default_demo(tmp_path):
    """The README's `make demo` figure: the default run (2 workers, 20 epochs), real processes."""
    code, out, report = run_demo(tmp_path)
    assert code == 0, out
    assert_nothing_left(tmp_path, report)
    print(f"\n[bench] make demo (default: 2 workers, {len(report['epochs'])} epochs, real "
          f"processes)  whole demo {report['timings']['total_s']:.1f} s, accuracy "
          f"{report['final_acc']:.3f}, load average {os.getloadavg()[0]:.1f}")


def test_bench_recovery_worker_kill(tmp_path):
    """A worker's machine dies mid-training; the job controller heals the job (real
    processes: moto, the agents, the controller, torchrun)."""
    code, out, report = run_demo(tmp_path, "--workers", "2", "--kill-node-after", "1",
                                 "--epochs", "12", "--require-acc", "0", timeout=600)
    assert code == 0, out
    assert_nothing_left(tmp_path, report)
    k = report["recovery"]["kill_node"]
    print(f"\n[bench] worker kill -> failure detected      {k['detected_s']:6.1f} s  (the job "
          "controller's restart record; real processes)")
    print(f"[bench] worker kill -> next attempt up       {k.get('resumed_s', float('nan')):6.1f}"
          " s  (replacement booted and joined, every share started)")
    print(f"[bench] worker kill -> training at full size {k['training_again_s']:6.1f} s  (first "
          f"epoch line of the next attempt at world size {report['world_size']})")


def test_bench_recovery_master_kill(tmp_path):
    """The master's machine dies mid-training: status check, replacement, takeover, the
    job controller's restart (real processes)."""
    code, out, report = run_demo(tmp_path, "--workers", "1", "--kill-master-after", "1",
                                 "--epochs", "12", "--require-acc", "0", timeout=600)
    assert code == 0, out
    assert_nothing_left(tmp_path, report)
    k = report["recovery"]["kill_master"]
    print(f"\n[bench] master kill -> new master took over  {k['took_over_s']:6.1f} s  (8 s EC2 "
          "status-check delay included; real processes)")
    print(f"[bench] master kill -> restart recorded      {k['detected_s']:6.1f} s  (the new "
          "master's job controller)")
    print(f"[bench] master kill -> training again        {k['training_again_s']:6.1f} s  (first "
          "epoch line of the next attempt, seen through dl-jobs logs -f)")
