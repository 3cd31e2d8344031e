"""mha: our MultiHeadAttention, a small transformer built from it, and pretrained weights.

Pure PyTorch; never imports the web app.
"""
