"""Writing checkpoints: the streaming, atomic safetensors writer (:mod:`.writer`, ``CheckpointWriter``),
its output layout (:mod:`.layout`), casts (:mod:`.cast`) and reread checks (:mod:`.check`), the one GGUF
writing path (:mod:`.gguf`), and the byte-range shard I/O both use (:mod:`.shard_io`)."""
