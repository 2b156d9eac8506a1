"""Architecture registry: families as data (:mod:`.families`), layout resolution (:mod:`.resolve`),
fused-QKV and rotary index maps (:mod:`.layouts`)."""
