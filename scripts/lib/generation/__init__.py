"""The generation benchmarks' library: the models and workloads (``workload``), operations a decode position
costs (``ops``) and training steps beside generation (``training``)."""
