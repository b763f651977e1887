"""Prism's benchmark suite: ``python -m benchmarks`` (see README.md here). Never part of the tests."""
