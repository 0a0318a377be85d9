"""Resource names, units and the sharing configuration both sides agree on.

The defaults are Volcano's names; HAMi's are read beside them (`hami_names`). Memory is counted in "memory
units": MiB times `gpu_memory_factor` (MiB with the default factor 1), the unit of the node inventory and of the
assignment annotations. The quota totals are the per-container products (GPUs x memory, GPUs x cores) that the
admission webhook writes so that a namespace's ResourceQuota can count what a pod takes on all its GPUs.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vgpu.units import MemoryUnit

__all__ = ["HAMI_NAMES", "QUOTA_CORES", "QUOTA_MEMORY", "SCHEDULER_NAME", "VOLCANO_NAMES", "ResourceNames",
           "SharingConfig"]

SCHEDULER_NAME = "vgpu-scheduler"
# Per-container totals over all of a container's GPUs: memory in MiB, cores in percent of one GPU. Written by the
# admission webhook, counted by ResourceQuota under `requests.<name>`, checked by the scheduler.
QUOTA_MEMORY = "volcano.sh/vgpu-memory-total"
QUOTA_CORES = "volcano.sh/vgpu-cores-total"


class ResourceNames(BaseModel):
    """The four extended-resource names a container may ask for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    number: str = Field("volcano.sh/vgpu-number", description="GPUs per container (count)")
    memory: str = Field("volcano.sh/vgpu-memory", description="device memory per GPU, memory units")
    memory_percentage: str = Field(
        "volcano.sh/vgpu-memory-percentage", description="device memory per GPU, percent of the card"
    )
    cores: str = Field("volcano.sh/vgpu-cores", description="compute per GPU, percent of the card's SMs")

    def all(self) -> tuple[str, str, str, str]:
        """The names in a fixed order: number, memory, memory percentage, cores."""
        return (self.number, self.memory, self.memory_percentage, self.cores)

    def shares(self) -> tuple[str, str, str]:
        """The names of a share of each GPU: memory, memory percentage, cores."""
        return (self.memory, self.memory_percentage, self.cores)


VOLCANO_NAMES = ResourceNames()
HAMI_NAMES = ResourceNames(
    number="nvidia.com/gpu",
    memory="nvidia.com/gpumem",
    memory_percentage="nvidia.com/gpumem-percentage",
    cores="nvidia.com/gpucores",
)


class SharingConfig(BaseModel):
    """How GPUs are shared; read once at start by the scheduler and the device plugin."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal["v1"] = Field("v1", description="configuration schema version")
    resources: ResourceNames = Field(default_factory=ResourceNames, description="resource names")
    hami_names: Literal["off", "shared", "all"] = Field(
        "shared",
        description="HAMi's names: shared reads nvidia.com/gpumem, gpumem-percentage and gpucores, and nvidia.com/gpu "
        "only in a container that also asks for one of them (a container asking nvidia.com/gpu alone is a whole-GPU "
        "pod of NVIDIA's device plugin); all reads every nvidia.com/gpu as ours; off reads none",
    )
    hami_aliases: bool = Field(False, description="the older switch: true is hami_names: all")
    gpu_memory_factor: int = Field(1, ge=1, le=1024, description="MiB per memory unit (default 1)")
    split_count: int = Field(10, ge=1, le=1000, description="containers that may share one GPU")
    default_memory: int = Field(
        0, ge=0, description="memory units charged when a container gives none; 0 = the whole card"
    )
    default_cores: int = Field(0, ge=0, le=100, description="cores charged when a container gives none")
    exclusive_whole_gpu: bool = Field(
        True,
        description="a container asking only for GPUs (no memory, no cores) gets whole, exclusive cards (cores 100)",
    )
    quota_card_mib: int = Field(
        81920, ge=1, le=2**31 - 1,
        description="MiB a whole card counts in the memory quota total where a container gives memory as a percentage "
        "or not at all (the card is not known before placement)",
    )

    require_quota_totals: bool | Literal["where-limited"] = Field(
        "where-limited",
        description="whether the scheduler refuses a vGPU pod whose containers lack the quota totals (the admission "
        "webhook did not see it, as when it was down): where-limited (in namespaces whose ResourceQuota limits a "
        "total, where such a pod would escape the quota), true (everywhere) or false; totals that differ from the "
        "requests are refused whatever this says",
    )

    @property
    def memory_unit(self) -> MemoryUnit:
        """The unit `volcano.sh/vgpu-memory` counts in: `gpu_memory_factor` MiB."""
        return MemoryUnit(self.gpu_memory_factor)

    def hami_mode(self) -> str:
        """How HAMi's names are read: off, shared or all (hami_aliases: true is all)."""
        return "all" if self.hami_aliases else self.hami_names

    def name_sets(self) -> tuple[ResourceNames, ...]:
        """The resource-name sets to read, primary first."""
        if self.hami_mode() != "off" and self.resources != HAMI_NAMES:
            return (self.resources, HAMI_NAMES)
        return (self.resources,)
