"""whetstone.modelkit: model/tokenizer loading, chat masking, holdout loss, tiny test model.

Submodules import torch/transformers lazily; import them directly:
`from whetstone.modelkit.chat import tokenize_chat`.
"""
