"""The test bed: stand-ins for the cluster parts we do not ship, the simulated GPU driver and `vgpu demo`.

The API-server, kubelet and kube-scheduler stand-ins, the pod runner and the simulated libcuda/libnvidia-ml let our
real components talk to real protocol peers without a cluster or a GPU. The test bed may import every component;
nothing outside it imports it, and the production image leaves it out (deploy/Dockerfile).
"""
