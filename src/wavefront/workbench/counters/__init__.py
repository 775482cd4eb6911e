"""Hardware counters from vendor profilers (Nsight Compute, rocprofv3, rocprof-compute), placed on the device
roofline beside what ``inspect`` and ``traffic`` predicted, and compared A/B. numpy-free readers; the A/B
statistics need scipy (as ``wavefront compare``). ``job`` holds the verb's library calls."""
