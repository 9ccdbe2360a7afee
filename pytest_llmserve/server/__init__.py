"""Server processes: launch, readiness and teardown (handle), the session pool, process trees, the GPU probe."""
