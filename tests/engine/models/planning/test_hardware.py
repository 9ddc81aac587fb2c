"""Hardware detection on this machine (with simulated GPUs) and described machines (profiles)."""
import json

import pytest

from engine.models.loading.machine import detect_machine
from engine.models.planning import hardware
from engine.models.planning.hardware import GB, Gpu, Hardware, HardwareProfileError, detect_hardware

MACHINES = {
    "apple-8": {"unified_memory_gb": 8},
    "laptop-16-gpu-8": {"ram_gb": 16, "gpus": [{"name": "RTX 4060 Laptop", "vram_gb": 8}]},
    "desktop-gpu-24": {"ram_gb": 32, "gpus": [{"name": "RTX 4090", "vram_gb": 24}]},
    "apple-64": {"unified_memory_gb": 64},
    "cpu-32": {"ram_gb": 32},
}


def test_profiles_describe_the_machines():
    apple = Hardware.from_profile(MACHINES["apple-8"])
    assert apple.is_apple and apple.ram_total == 8 * GB and apple.gpus == () and apple.cpu_cores is None
    assert apple.gpu_working_set == 8 * GB * 2 // 3  # Metal's working set on a small Mac
    assert apple.ram_available == 6 * GB  # 8 GB less the 2 GB the OS keeps
    assert Hardware.from_profile(MACHINES["apple-64"]).gpu_working_set == 48 * GB

    laptop = Hardware.from_profile(MACHINES["laptop-16-gpu-8"])
    assert laptop.best_gpu == Gpu("RTX 4060 Laptop", 8 * GB, 8 * GB)
    assert not laptop.is_apple and laptop.unified_memory is None
    assert laptop.ram_available == int(12.8 * GB)  # 20% kept for the OS

    cpu = Hardware.from_profile({**MACHINES["cpu-32"], "disk_free_gb": 100, "cpu_cores": 8})
    assert cpu.gpus == () and cpu.disk_free == 100 * GB and cpu.cpu_cores == 8
    assert cpu.source == "profile"


def test_best_gpu_is_the_one_with_most_free_memory():
    hw = Hardware.from_profile({"ram_gb": 64, "gpus": [{"name": "small", "vram_gb": 8},
                                                       {"name": "big", "vram_gb": 24, "vram_free_gb": 20}]})
    assert hw.best_gpu.name == "big" and hw.best_gpu.free_bytes == 20 * GB


def test_explicit_available_ram_is_used():
    hw = Hardware.from_profile({"ram_gb": 16, "ram_available_gb": 9.5})
    assert hw.ram_available == int(9.5 * GB)


@pytest.mark.parametrize(
    "profile, words",
    [
        ([16], "JSON object"),
        ({}, "missing 'ram_gb'"),
        ({"ram_gb": "16"}, "'ram_gb' must be a number"),
        ({"ram_gb": -4}, ">= 0"),
        ({"ram_gb": 0}, "more than 0"),
        ({"ram_gb": True}, "'ram_gb' must be a number"),
        ({"ram_gb": 16, "vram_gb": 8}, "unknown field(s) 'vram_gb'"),
        ({"ram_gb": 16, "gpus": {"name": "x", "vram_gb": 8}}, "'gpus' must be a list"),
        ({"ram_gb": 16, "gpus": [{"name": "x"}]}, "gpus[0] is missing 'vram_gb'"),
        ({"ram_gb": 16, "gpus": ["RTX 4090"]}, "gpus[0] must be an object"),
        ({"ram_gb": 16, "gpus": [{"name": 4090, "vram_gb": 24}]}, "name must be a string"),
        ({"unified_memory_gb": 16, "gpus": [{"name": "x", "vram_gb": 8}]}, "cannot be combined"),
        ({"ram_gb": 16, "unified_memory_gb": 32}, "disagree"),
        ({"ram_gb": 16, "ram_available_gb": 20}, "larger than ram_gb"),
        ({"ram_gb": 16, "cpu_cores": 2.5}, "cpu_cores"),
    ],
)
def test_malformed_profiles_say_what_is_wrong(profile, words):
    with pytest.raises(HardwareProfileError) as err:
        Hardware.from_profile(profile)
    assert words in str(err.value)


def test_profile_files(tmp_path):
    good = tmp_path / "machine.json"
    good.write_text(json.dumps(MACHINES["desktop-gpu-24"]))
    assert Hardware.from_profile_file(good).best_gpu.total_bytes == 24 * GB
    bad = tmp_path / "bad.json"
    bad.write_text("{ram_gb: 16")
    with pytest.raises(HardwareProfileError, match="not valid JSON"):
        Hardware.from_profile_file(bad)
    with pytest.raises(HardwareProfileError, match="cannot read"):
        Hardware.from_profile_file(tmp_path / "missing.json")


def test_this_machine_without_torch(tmp_path):
    hw = detect_hardware(cache=tmp_path / "not" / "yet" / "there")
    assert hw.ram_total > hw.ram_available > 0
    assert hw.cpu_cores >= 1 and hw.cpu_model
    assert hw.gpus == () and hw.source == "detected"
    assert hw.disk_free and hw.disk_free > 0  # measured on the nearest existing parent


def test_this_machine_with_torch_does_not_crash(tmp_path):
    import torch

    hw = detect_machine(cache=tmp_path)
    assert len(hw.gpus) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for gpu in hw.gpus:
        assert gpu.total_bytes >= gpu.free_bytes > 0


def test_simulated_cuda_gpu_is_reported(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: ((3 + i) * GB, 8 * GB))
    hw = detect_machine(cache=tmp_path)
    assert hw.gpus == (Gpu("Fake GPU 0", 8 * GB, 3 * GB), Gpu("Fake GPU 1", 8 * GB, 4 * GB))
    assert hw.best_gpu.name == "Fake GPU 1"


def test_a_broken_cuda_driver_means_cpu_only(tmp_path, monkeypatch, caplog):
    import torch

    def broken():
        raise RuntimeError("CUDA driver version is insufficient")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", broken)
    hw = detect_machine(cache=tmp_path)
    assert hw.gpus == ()
    assert "CUDA driver version is insufficient" in caplog.text


def test_simulated_apple_silicon(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 5 * GB, raising=False)
    hw = detect_machine(cache=tmp_path)
    assert hw.is_apple and hw.gpu_working_set == 5 * GB and hw.unified_memory == hw.ram_total


def test_apple_working_set_rule():
    assert hardware.apple_working_set(36 * GB) == 24 * GB
    assert hardware.apple_working_set(128 * GB) == 96 * GB
