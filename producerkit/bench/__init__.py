"""The open-loop benchmark harness behind ``producerkit bench`` (HDR histograms, coordinated
omission, peers, plots).

Modules: :mod:`.openloop` (the schedule and timestamps), :mod:`.histograms` (HDR percentiles),
:mod:`.peers` (raw-client runners), :mod:`.report`, :mod:`.plot`. The command itself is
:mod:`producerkit.cli.bench`; the delay proxy that emulates a WAN is
:class:`producerkit.testing.proxy.FaultProxy`. Nothing here is imported by ``import producerkit``.
"""
