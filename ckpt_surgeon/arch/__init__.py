"""Architecture registry: families as data (:mod:`.families`), GGUF names derived from gguf-py
(:mod:`.gguf_names`), layout resolution (:mod:`.resolve`), fused-QKV and rotary index maps
(:mod:`.layouts`)."""
