"""``producerkit bench``: an open-loop benchmark harness (HDR histograms, coordinated omission,
peers, plots) and the delay proxy it uses to emulate a WAN.

Modules: :mod:`.command` (the CLI), :mod:`.openloop` (the schedule and timestamps),
:mod:`.histograms` (HDR percentiles), :mod:`.peers` (raw-client runners), :mod:`.plot`,
:mod:`.proxy` (:class:`~producerkit.bench.proxy.DelayProxy`). Nothing here is imported by
``import producerkit``.
"""
