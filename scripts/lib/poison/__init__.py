"""Peers that try to write into a node's model with completions that pass its verifier: the attacks
(``attacks``), the attacker node that sends them over the real wire path (``attacker``), and one run of a
victim among an honest peer and attackers, measured by what the victim says afterwards (``lab``)."""
