"""``producerkit bench``: an open-loop benchmark harness (HDR histograms, coordinated omission,
peers, plots).

Modules: :mod:`.command` (the CLI), :mod:`.openloop` (the schedule and timestamps),
:mod:`.histograms` (HDR percentiles), :mod:`.peers` (raw-client runners), :mod:`.plot`,
:mod:`.report`. The delay proxy that emulates a WAN is
:class:`producerkit.testing.proxy.DelayProxy`. Nothing here is imported by ``import producerkit``.
"""
