"""The ReMix adapter: n LoRAs per adapted projection, k of them active per sequence and layer, chosen by a
router per decoder layer (``attach``: put it on a model; ``adapter``: the modules and their routing;
``ops``: the vectorised math with its dense reference; ``logprobs``: log-probs under sampled routings, what
the trainer's router estimator needs; ``stats``: how the routers use their LoRAs).
"""
