"""Tensor parallelism: every rank holds its part of every layer (Megatron-LM's layout), as
evenly as the counts split, none refused.

layers.py has the building blocks, named for their data movement; plan.py says what each
rank holds of a Llama (`python -m tbcoll.tp plan -np N` prints it); llama.py the decoder;
checkpoint.py and tokenizer.py read GGUF files and Hugging Face folders; survive.py goes on
decoding over the survivors when ranks fail (tbrun --keep-going); bert.py a BERT encoder
(all-MiniLM-L6-v2) with a float64 single-process reference.
"""
