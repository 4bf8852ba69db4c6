"""The library the scripts share: ``sapo`` (the SAPO benchmark's runs, progress, report, regime and plots),
``netlab`` (network-namespace hosts, swarms of processes, their traces and processes), ``generation`` (the
generation benchmarks' models, workloads, operation counts and training steps), ``remix_curves``,
``small_build`` and ``tiny_bases`` (the embedded small-base build; tiny bases built to order). It may import
protocol/, swarm/ and node/, never an entry script."""
