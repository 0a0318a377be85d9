"""The spin kernel the compute probes time: `sleep(.param .u64 ns)`, one thread spinning on the GPU's own clock.

It reads %globaltimer (ns) and loops until `ns` nanoseconds have passed, so each launch keeps the GPU busy for a
known time whatever the GPU. It is PTX, loaded with cuModuleLoadData: a real driver compiles it for the device
(the conservative `.version 6.0 / .target sm_50` first, the device's own target if that is refused); a driver
that simulates kernels may read the duration from the first parameter instead.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

from vgpu.isolation.doctor.cuda import SUCCESS, CudaError, Driver

ENTRY = "sleep"

_BODY = """
.visible .entry sleep(
	.param .u64 ns
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [ns];
	mov.u64 	%rd2, %globaltimer;
$L_spin:
	mov.u64 	%rd3, %globaltimer;
	sub.u64 	%rd4, %rd3, %rd2;
	setp.lt.u64 	%p1, %rd4, %rd1;
	@%p1 bra 	$L_spin;
	ret;
}
"""


def source(version: str = "6.0", target: str = "sm_50") -> str:
    """The kernel's PTX for one ISA version and target."""
    return f".version {version}\n.target {target}\n.address_size 64\n{_BODY}"


def variants(capability: tuple[int, int]) -> list[tuple[str, str]]:
    """(version, target) pairs to try, the most portable first."""
    major, minor = capability
    return [("6.0", "sm_50"), ("7.8" if major < 10 else "8.6", f"sm_{major}{minor}")]


class SleepKernel:
    """The loaded kernel; `launcher` makes a call that launches one spin of a given length."""

    def __init__(self, drv: Driver, capability: tuple[int, int]) -> None:
        self.drv = drv
        self.variant = ""
        self.func = ctypes.c_void_p()
        errors = []
        for version, target in variants(capability):
            module = ctypes.c_void_p()
            code = drv.status("cuModuleLoadData", ctypes.byref(module), source(version, target).encode())
            if code == SUCCESS:
                drv.call("cuModuleGetFunction", ctypes.byref(self.func), module, ENTRY.encode())
                self.variant = f"{version}/{target}"
                return
            errors.append(CudaError(f"cuModuleLoadData (PTX {version} {target})", code))
        raise errors[-1]

    def launcher(self, ns: int, stream: ctypes.c_void_p) -> Launcher:
        """A call that launches `sleep(ns)` (1 block of 1 thread) on `stream` and returns the CUresult."""
        return Launcher(self.drv.fn("cuLaunchKernel"), self.func, ns, stream)


class Launcher:
    """One prepared launch of the spin kernel: calling it launches once and returns the CUresult."""

    __slots__ = ("args", "launch", "value")

    def __init__(self, launch: Callable[..., int], func: ctypes.c_void_p, ns: int, stream: ctypes.c_void_p) -> None:
        self.launch = launch
        self.value = ctypes.c_uint64(ns)          # the parameter block points here: it lives as long as we do
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(self.value), ctypes.c_void_p))
        one, zero = ctypes.c_uint(1), ctypes.c_uint(0)
        self.args = (func, one, one, one, one, one, one, zero, stream, params, None)

    def __call__(self) -> int:
        return int(self.launch(*self.args))
