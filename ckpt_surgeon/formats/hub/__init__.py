"""Hugging Face Hub repos as sources: read by HTTP range (:mod:`.ranges`, over :mod:`.http` with its
on-disk range cache :mod:`.range_cache` and :mod:`.settings`), downloaded whole for a forward pass
(:mod:`.snapshot`), and the Hugging Face cache as complete local files (:mod:`.hf_cache`)."""
