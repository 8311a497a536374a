"""The CUDA/ROCm route (``route.GpuRoute``): this package's Triton kernels (``triton/``) and FlashInfer's decode and
extend families (``flashinfer/``) behind one ``route_protocol.Route``. The one folder that imports both families;
neither imports it. Importing this package imports neither; ``routes.choose_route`` imports ``route`` (and with it
Triton) when an accelerated route is asked for."""
