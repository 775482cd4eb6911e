"""Multi-process work on torch.distributed: collective benchmarks, overlap probe, training harness."""
