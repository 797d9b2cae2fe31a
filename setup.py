"""Builds the optional C speedups (producerkit/_speedups.c); everything else is in pyproject.toml.

``optional=True``: where there is no compiler or no Python headers, the install still succeeds
and producerkit uses its pure-Python fallback (see producerkit/_fast.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "producerkit._speedups",
            sources=["producerkit/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
