"""Quantized tensors, both kinds, in one room.

* ggml (GGUF): the one table of ggml type facts (:mod:`.ggml_types`), numpy dequantization of every type
  (:mod:`.dequant`), llama.cpp's own quantization kernels through libggml (:mod:`.ggml_quant`), and the
  encoding the HF -> GGUF stream writes itself (:mod:`.quantize`).
* Hugging Face quantized checkpoints: the schemes as data and their recognition (:mod:`.schemes`), one
  dequantization kernel per scheme (:mod:`.kernels`), and the logical view ``Checkpoint`` reads them
  through (:mod:`.quantized`).
"""
