"""The peer path: our groups out as signed records (``outbound``), peers' records in (``exchange`` drains the
transport; ``ingest`` checks, re-scores and re-tokenizes them into training groups; ``scoring``: the child
process that scores a peer's completion with a time limit). It may import generation/, train/, policy/,
tasks/ and node's leaf modules; never run/, api/ or cli/.
"""
