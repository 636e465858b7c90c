"""accelpatch: quality-gated fast paths for diffusers video pipelines, applied in place and removable."""

__version__ = "0.1.0"
