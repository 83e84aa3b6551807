"""Deployable grudge-stream topologies: each module defines ``build(settings) -> Topology``."""
