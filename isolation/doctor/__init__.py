"""`vgpu doctor`: prove on a GPU node, with its own driver and frameworks, that libvgpu.so's limits hold.

The doctor side: `cli.py` (flags, the run, the exit status), `discover.py` (the driver and the library),
`catalog.py` (the probes and their settings), `session.py` (each probe in a worker of its own, time-boxed, in an
environment from `envs.py`, through `spawn.py`), `report.py` (progress lines, the table, the JSON).
The worker side: `worker.py` (`python -m vgpu.isolation.doctor.worker ACTION PARAMS`: runs one action and writes
its `Outcome`, `outcome.py`, through `channel.py`), the actions of `info.py`, `probes_memory.py`,
`probes_compute.py` and `probes_frameworks.py`, which use the public CUDA driver API and NVML through ctypes
(`cuda.py`, `nvml.py`, the spin kernel of `ptx.py`) and start helper processes through `legs.py`.
Only the standard library and light modules of ours are imported, so a plain checkout runs it.
"""
