"""codecstream's own code predictor: the talker's hot loop, run end to end by codecstream.

Each talker step samples codebook 0; the code predictor then samples codebooks 1-15 of that frame
one after another, each from a pass of its small transformer (5 layers at the released shapes).
vLLM-Omni's predictor re-runs the whole 17-position sequence for each of the 15 codebooks (no KV
cache): 17x the arithmetic of one new position, and ~1,500 kernels a step. Here (runner.py) each
pass computes only its new position against a KV cache that lives for the one call, the codec
embeddings are projected into the predictor's width once at load, and every pass is a short,
fixed chain of fused kernels (kernels.py: Triton on CUDA, the same arithmetic in torch elsewhere),
sampling included, from the seeded noise the talker draws (code_predictor_noise.py).

The call has the same signature and shapes for every batch, so vLLM's runner captures the whole of
it, all 16 passes, as one CUDA graph per batch size at start (its talker-MTP graphs, the deploy
YAML's capture sizes): no Inductor, no per-pass launch from the host.
"""
