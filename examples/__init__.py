"""Example training jobs that `pardiag demo` and the tests run."""
