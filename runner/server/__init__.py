"""A vLLM server's life: start, stop, introspect, place and pin it, and the checks before any start."""
