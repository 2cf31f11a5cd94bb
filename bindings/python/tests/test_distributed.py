"""The torch.distributed example (examples/torch_sharded_verify.py) run
with torchrun: two ranks, each holding half of the LM head, verify through
shard records all-gathered by torch.distributed, and every rank must emit
what the unsharded verify of the whole head emits (--check). With two GPUs
usable by this build the ranks are GPUs over NCCL; otherwise CPU contexts
over gloo. Skips where PyTorch is not installed."""
import os
import subprocess
import sys

import pytest

import flashspec

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "torch_sharded_verify.py")


def run_example(device, extra=()):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE,
           "--check", "--device", device, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    assert "every rank emitted the unsharded verify's tokens" in done.stdout, done.stdout
    return done.stdout


def test_two_cpu_ranks_over_gloo():
    run_example("cpu", ["--vocab", "6000", "--hidden", "128"])


@pytest.mark.skipif(torch.cuda.device_count() < 2 or flashspec.cuda_device_count() < 2,
                    reason="needs two GPUs usable by torch and by this build of libflashspec")
def test_two_gpu_ranks_over_nccl():
    run_example("cuda", ["--vocab", "151936", "--hidden", "4096", "--requests", "16"])
