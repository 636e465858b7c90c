"""Developer tools: the demo, doctor, the kernel build, checkpoint conversion and the diffusers fingerprints. The
evaluation tools (validate, bench, tune and their metrics) are :mod:`accelpatch.eval`; their old paths here import
that package's modules for one release, with a DeprecationWarning."""
