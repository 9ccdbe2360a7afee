"""Repository-level conftest: nothing here; the plugin loads through its pytest11 entry point."""
