"""The network lab: hosts in network namespaces on a simulated internet (``netns``), a swarm of ``swarm-node``
processes formed from its descriptor (``swarm``), their processes from outside (``processes``) and the figures of
a wide-area scenario from its nodes' traces (``wan_report``)."""
