"""The `info` action: what the driver is (run without the library): versions, devices, the files loaded."""
from __future__ import annotations

from typing import Any

from vgpu.isolation.doctor import cuda, nvml
from vgpu.isolation.doctor.channel import Channel, Params
from vgpu.isolation.doctor.outcome import Outcome


def loaded_path(stem: str) -> str | None:
    """The file this process mapped whose name starts with `stem` (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if path.startswith("/") and path.rsplit("/", 1)[-1].startswith(stem):
                    return path
    except OSError:
        pass
    return None


def facts(params: Params, channel: Channel) -> Outcome:
    """Driver version, every device (name, UUID, total memory, SMs, capability), NVML's driver version; failed
    when the driver cannot be loaded or initialised."""
    try:
        drv = cuda.Driver()
    except OSError as exc:
        return Outcome.failed(f"{cuda.SONAME} cannot be loaded: {exc}")
    try:
        drv.init()
        version = drv.version()
        devices = [drv.device(i) for i in range(drv.device_count())]
    except cuda.CudaError as exc:
        return Outcome.failed(str(exc))
    if not devices:
        return Outcome.failed("the driver reports no CUDA device")
    found: dict[str, Any] = {
        "libcuda": loaded_path("libcuda.so"),
        "cuda_driver_version": version,
        "cuda_version": f"{version // 1000}.{version % 1000 // 10}",
        "devices": [{"index": d.index, "name": d.name, "uuid": d.uuid, "total_bytes": d.total_bytes,
                     "sm_count": d.sm_count, "compute_capability": "{}.{}".format(*d.compute_capability)}
                    for d in devices],
    }
    try:
        ml = nvml.Nvml()
        found["nvml_driver_version"] = ml.driver_version()
        found["libnvidia_ml"] = loaded_path("libnvidia-ml.so")
    except (OSError, nvml.NvmlError) as exc:
        found["nvml_error"] = str(exc)
    return Outcome.passed(f"CUDA {found['cuda_version']}, {len(devices)} device(s)", **found)
