"""Builds the optional C speedups: the core (producerkit/_speedups.c) and the Kafka wire
(producerkit/backends/kafka/_cwire.c); everything else is in pyproject.toml.

``optional=True``: where there is no compiler or no Python headers, the install still succeeds
and producerkit uses its pure-Python fallbacks (see producerkit/_fast.py and
producerkit/backends/kafka/wire.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "producerkit._speedups",
            sources=["producerkit/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "producerkit.backends.kafka._cwire",
            sources=["producerkit/backends/kafka/_cwire.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
