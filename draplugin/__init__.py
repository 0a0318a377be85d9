"""The DRA kubelet plugin (`vgpu dra-plugin`): fractional GPUs through ResourceClaims (docs/dra.md)."""
