"""Error types of vgpu-sharing. Every error we raise on purpose derives from VGPUError."""

__all__ = ["CodecError", "ConfigError", "RequestError", "VGPUError"]


class VGPUError(Exception):
    """Base class of all errors raised on purpose by vgpu-sharing."""


class CodecError(VGPUError):
    """An annotation value does not follow its wire format."""


class RequestError(VGPUError):
    """A pod asks for vGPU resources in a way the contract does not allow.

    The message names the container and the resource.
    """

    def __init__(self, container: str, resource: str, problem: str) -> None:
        self.container = container
        self.resource = resource
        self.problem = problem
        super().__init__(f"container {container!r}: {resource}: {problem}")


class ConfigError(VGPUError):
    """Configuration is invalid; the message names the option."""
