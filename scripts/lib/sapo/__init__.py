"""The SAPO benchmark's library: one run of K in-process nodes (``runs``), its saved progress (``progress``),
the report (``report``), where a run's own signal ran dry (``regime``) and the plots (``plots``)."""
