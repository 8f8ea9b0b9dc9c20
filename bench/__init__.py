"""refmount's benchmarks and diagnostics (``python -m bench``); not part of the package."""
