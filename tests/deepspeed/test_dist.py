"""Joining the process group: the CUDA device picked before init (device_id), the collective timeout, and the
device counts refused in one line. CUDA is a stand-in here (torch.cuda and init_process_group monkeypatched): the
real NCCL path has not yet run on a GPU."""

from __future__ import annotations

from datetime import timedelta

import deepspeed
import pytest
import torch

from tokenpo.deepspeed import dist
from tokenpo.errors import ConfigError
from tokenpo.trainer.config import TrainerConfig


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda with `visible` devices; records set_device, init_process_group and deepspeed.init_distributed."""
    calls = {"set_device": [], "init": [], "deepspeed": []}

    def install(visible: int, **env: str) -> dict:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
        monkeypatch.setattr(torch.cuda, "set_device", calls["set_device"].append)
        monkeypatch.setattr(dist.dist, "is_initialized", lambda: False)
        monkeypatch.setattr(dist.dist, "init_process_group", lambda backend, **kw: calls["init"].append((backend, kw)))
        monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: calls["deepspeed"].append(kw))
        return calls

    return install


def test_each_rank_gets_its_device_before_the_group_with_the_timeout(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    calls = fake_cuda(8, RANK="3", LOCAL_RANK="3", WORLD_SIZE="8", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    dist.init_distributed("auto", 5400)
    assert calls["set_device"] == [3]
    assert calls["init"] == [("nccl", {"timeout": timedelta(seconds=5400), "device_id": torch.device("cuda", 3)})]
    assert calls["deepspeed"] == [{"dist_backend": "nccl", "auto_mpi_discovery": False,
                                   "timeout": timedelta(seconds=5400)}]


def test_a_task_that_sees_one_device_uses_device_0(fake_cuda, monkeypatch):
    # srun --gpus-per-task=1: CUDA_VISIBLE_DEVICES names one device, SLURM_LOCALID (LOCAL_RANK) is the task's index
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    calls = fake_cuda(1, RANK="5", LOCAL_RANK="1", WORLD_SIZE="8", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    dist.init_distributed("nccl", 60)
    assert calls["set_device"] == [0] and calls["init"][0][1]["device_id"] == torch.device("cuda", 0)
    # DeepSpeed's engine picks its device by LOCAL_RANK
    assert dist.os.environ["LOCAL_RANK"] == "0"


def test_device_binding_follows_deepspeed(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    assert dist.bound_device(2, 4, "nccl") == torch.device("cuda", 2)
    assert dist.bound_device(0, 1, "nccl") is None  # a group of one (deepspeed#8248)
    assert dist.bound_device(2, 4, "gloo") is None
    monkeypatch.setattr(torch, "__version__", "2.7.0")  # hangs there (pytorch#153960)
    assert dist.bound_device(2, 4, "nccl") is None


def test_a_local_rank_without_its_device_is_one_line(fake_cuda):
    fake_cuda(2, RANK="3", LOCAL_RANK="3", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    with pytest.raises(ConfigError) as err:
        dist.init_distributed("nccl", 60)
    assert str(err.value) == ("LOCAL_RANK=3 but this process sees 2 CUDA devices (CUDA_VISIBLE_DEVICES): give every "
                              "process of a node all of its devices, or each process exactly one")


def test_the_cpu_passes_no_device_and_the_default_timeout(fake_cuda):
    calls = fake_cuda(0, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    dist.init_distributed("auto")
    assert calls["set_device"] == []
    assert calls["init"] == [("gloo", {"timeout": timedelta(seconds=TrainerConfig.dist_timeout_s), "device_id": None})]


def test_the_timeout_default_outlasts_a_long_generation_round_and_must_be_positive():
    # DeepSpeed's own default is 10 minutes (DEEPSPEED_TIMEOUT); a round of 20k-token generations can take longer
    assert TrainerConfig().dist_timeout_s == 7200
    with pytest.raises(ConfigError, match=r"^trainer.dist_timeout_s must be > 0, got 0$"):
        TrainerConfig(dist_timeout_s=0).validate()
