"""The local test runner: a driver of the window engine in one thread, with a fast clock
(``operators.testing.run_local`` is what users call)."""
