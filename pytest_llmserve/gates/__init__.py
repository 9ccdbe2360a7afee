"""Gates: the objects a test drives (DecodeCheck, BenchGate, ABRunner) and the time accounting."""
