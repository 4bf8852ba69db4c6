"""The fused training pass: a plain-LoRA decoder's log-probs in few, large operations, with backward passes
written by hand (``decoder``: the pass and its packing of prompts and completions; ``ops``: its blocks as
autograd functions; ``projections``: the projections that read one input computed together, every adapter a
view of one flat tensor). Its only user is the trainer (``train.fused``).

It may import policy/ and the rooms below it.
"""
