"""Capture: write down how a target is set now as a spec that other hosts can be held to.

``--gpuhost-capture=OUT.yaml`` runs the given spec(s), or the built-in catalog (``catalog``),
and at the end of the run turns the records of one target into a spec: each section as its kind
captures it (``sections`` merges them), ``yamltext`` for the layout; ``writer`` is the reporter
that writes it, atomically and never over an existing file unless asked.
"""
