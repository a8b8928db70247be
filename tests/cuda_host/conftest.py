"""The marker of the CUDA host harness's long tests (``-m "not slow"`` leaves them out)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes seconds (ThreadSanitizer builds and runs)")
