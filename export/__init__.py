"""Rewrite exported Hugging Face models so their attention runs through the Quest operators."""
