"""Shipped configuration files (package data): ``train/`` recipes and ``accelerate/`` configs."""
