"""The mlx transport: MLX's distributed backends (ring, jaccl) under the collectives
(transport.py)."""
