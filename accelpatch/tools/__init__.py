"""Developer tools for accelpatch: quality metrics and other helpers not needed at runtime."""
