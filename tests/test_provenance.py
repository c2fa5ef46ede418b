"""synthbench/run/provenance.py: the CPU model a row records, read from /proc/cpuinfo."""

from synthbench.run import provenance

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fpu avx512f

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another one (never read: the first processor says it)
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd0c
"""


def model_of(tmp_path, text: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return provenance.cpu_model.__wrapped__(path)  # not the cached value of this machine


def test_the_model_is_vendor_family_model_stepping_and_name(tmp_path):
    assert model_of(tmp_path, X86) == "GenuineIntel 6/207/2 Intel(R) Xeon(R) Processor"
    assert model_of(tmp_path, ARM) == "0x41 0xd0c 0x1"


def test_a_system_that_does_not_say_gives_unknown_or_its_processor(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance.platform, "processor", lambda: "")
    assert provenance.cpu_model.__wrapped__(tmp_path / "absent") == "unknown"
    assert model_of(tmp_path, "processor\t: 0\n") == "unknown"
    monkeypatch.setattr(provenance.platform, "processor", lambda: "arm")
    assert provenance.cpu_model.__wrapped__(tmp_path / "absent") == "arm"


def test_every_row_is_stamped_with_it():
    stamp = provenance.stamp(provenance.torch.device("cpu"))
    assert stamp["cpu_model"] == provenance.cpu_model() != ""
    assert list(stamp) == list(provenance.COLUMNS)
