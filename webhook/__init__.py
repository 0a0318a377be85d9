"""The mutating admission webhook (`vgpu webhook`): pods asking for vGPU resources are opted in unedited."""
