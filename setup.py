"""The one compiled part of treadle: the window loop (``src/treadle/video/_window_loop.c``).

Optional: where it does not build (no C compiler, no Python headers) the package installs
without it, and ``treadle.info()`` says the compiled window loop is off and why.
Everything else is in ``pyproject.toml``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "treadle.video._window_loop",
            ["src/treadle/video/_window_loop.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
