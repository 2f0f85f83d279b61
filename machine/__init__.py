"""The machine a load or a job runs on: the device probe, the memory probe and the offload policy.

Torch-free at import (the device probe imports torch only when it probes a CUDA device).
"""

from .device import DeviceInfo, probe_device
from .memory import MemoryProbe, MemorySample, PeriodicSampler, sample_memory
from .offload import OffloadDecision, OffloadSettings, resolve_offload

__all__ = ["DeviceInfo", "MemoryProbe", "MemorySample", "OffloadDecision", "OffloadSettings", "PeriodicSampler",
           "probe_device", "resolve_offload", "sample_memory"]
