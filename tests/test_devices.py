"""Device names, availability, and how workers are placed on GPUs (counts faked: no GPU here)."""

from __future__ import annotations

import pytest
import torch

from synthbench.run import devices
from synthbench.run.devices import default_jobs, resolve_device, worker_devices

CUDA = torch.device("cuda")


def test_cpu_and_auto_without_accelerators(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == CUDA


def test_any_torch_device_type_is_accepted_when_available(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("mps") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize(
    "name, message",
    [
        ("gpu", "unknown device 'gpu'"),
        ("cuda:", "unknown device"),
        ("meta", "cannot train on 'meta'"),
    ],
)
def test_unknown_devices_are_named(name, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(name)


def test_unavailable_devices_say_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="torch sees no cuda device"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="torch sees no mps device"):
        resolve_device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="only 2 cuda device"):
        resolve_device("cuda:2")


def test_workers_go_round_robin_over_the_visible_gpus():
    assert worker_devices(CUDA, 5, count=2) == [torch.device("cuda", i) for i in (0, 1, 0, 1, 0)]
    assert worker_devices(CUDA, 3, count=1) == [torch.device("cuda", 0)] * 3


def test_a_named_gpu_or_the_cpu_takes_every_worker():
    assert worker_devices(torch.device("cuda", 1), 3, count=4) == [torch.device("cuda", 1)] * 3
    assert worker_devices(torch.device("cpu"), 2) == [torch.device("cpu")] * 2


def test_default_jobs(monkeypatch):
    cpu = torch.device("cpu")
    assert default_jobs(cpu, threads=1, cores=16) == 16
    assert default_jobs(cpu, threads=4, cores=16) == 4
    assert default_jobs(cpu, threads=4, cores=2) == 1
    monkeypatch.setattr(devices, "device_count", lambda device: 2)
    assert default_jobs(CUDA, cores=16) == 8  # 4 per GPU
    assert default_jobs(CUDA, cores=3) == 3  # a core per worker
    assert default_jobs(torch.device("cuda", 1), cores=16) == 4  # one GPU named


def test_worker_devices_reads_the_visible_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert [d.index for d in worker_devices(CUDA, 4)] == [0, 1, 2, 0]
