"""Compiled kernels (private). Import the public API from grudge_stream."""
