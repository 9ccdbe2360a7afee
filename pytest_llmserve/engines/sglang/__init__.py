"""SGLang: launch plan and facts parsing."""
