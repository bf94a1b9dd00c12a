"""Training, its own layer: AED-RAG's utility predictor, SARDI's masked-diffusion denoiser and
Speculative RAG's drafter are trained here from the rows the Beam jobs write.

It sits above the methods (a drafter is trained on exactly the ids Draft feeds and reads) and the
model backends it loads, and below the pipelines that call it; nothing that serves queries
imports it.
"""
