"""GPU tests: marked `gpu`, deselected by default (pytest.ini's addopts), run with `make gpu-test`.

Without CuPy or without a GPU every test here is skipped, so collecting them on a CPU machine is harmless.
"""

import pytest


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device
        return False


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    skip = pytest.mark.skip(reason="needs CuPy and an NVIDIA GPU")
    available = None
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if available is None:
                available = gpu_available()
            if not available:
                item.add_marker(skip)
