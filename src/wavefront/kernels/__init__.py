"""Layer 1: @triton.jit kernels and their host launchers. No autograd, no modules.

Every launch goes through wavefront.kernels._launch.launch, so tools can record and replay launches.
"""
