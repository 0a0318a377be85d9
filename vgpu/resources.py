"""Resource names, units and the sharing configuration both sides agree on.

The defaults are the contract's (../shared/compat/CONTRACT.md); HAMi's names can be accepted as aliases.
Memory is counted in "memory units": MiB times `gpu_memory_factor` (MiB with the default factor 1), the unit of
the node inventory and of the assignment annotations.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["HAMI_NAMES", "SCHEDULER_NAME", "VOLCANO_NAMES", "ResourceNames", "SharingConfig"]

SCHEDULER_NAME = "vgpu-scheduler"


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
    hami_aliases: bool = Field(False, description="also accept HAMi's nvidia.com/gpu* names")
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

    def name_sets(self) -> tuple[ResourceNames, ...]:
        """The resource-name sets to read, primary first."""
        if self.hami_aliases:
            return (self.resources, HAMI_NAMES)
        return (self.resources,)
